"""Stand-in for ``habana_frameworks.torch.core``: records ``mark_step`` calls."""

from habana_frameworks._record import record


def mark_step(device_str: str = "", sync: bool = False) -> None:
    record("mark_step")
