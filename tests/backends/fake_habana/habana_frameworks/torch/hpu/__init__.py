"""Stand-in for ``habana_frameworks.torch.hpu``: reports one device; memory numbers are
constants made up by the stand-in, not measurements."""

from habana_frameworks._record import record

FAKE_STATS = {"InUse": 1024, "MaxInUse": 2048, "Limit": 4096, "NumAllocs": 3}


def is_available() -> bool:
    return True


def device_count() -> int:
    return 1


def synchronize() -> None:
    record("synchronize")


def memory_stats(device=None) -> dict:
    record("memory_stats")
    return dict(FAKE_STATS)


def reset_peak_memory_stats(device=None) -> None:
    record("reset_peak_memory_stats")
