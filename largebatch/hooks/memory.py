"""Peak memory per logging interval: the device's (CUDA / HPU) and the host process's.

* ``memory/device_peak_gib``: the backend's peak allocated bytes since the last logging
  step (``torch.cuda.max_memory_allocated`` / the HPU's ``MaxInUse``; the peak is reset
  after each logging step), and ``memory/device_allocated_gib`` now. Absent on a CPU.
* ``memory/host_peak_gib``: the process's peak resident set size. On Linux the peak is
  reset after each logging step (``/proc/self/clear_refs``) and read from ``VmHWM``, so
  it is the interval's peak (the reset also lowers what ``getrusage`` reports as
  ``ru_maxrss`` for this process: the kernel keeps one high-water mark); elsewhere it is the lifetime peak of
  ``resource.getrusage(RUSAGE_SELF).ru_maxrss``.

Values are the maximum over ranks (one small all-reduce, on logging steps only), as
plain numbers.
"""

from __future__ import annotations

import pathlib
import resource
import sys

import torch
import torch.distributed as torch_dist

from largebatch.engine.hook import Hook, Priority

GIB = float(1 << 30)
_CLEAR_REFS = pathlib.Path("/proc/self/clear_refs")
_STATUS = pathlib.Path("/proc/self/status")


def lifetime_peak_rss_bytes() -> float:
    """``ru_maxrss`` in bytes (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(peak if sys.platform == "darwin" else peak * 1024)


def interval_peak_rss_bytes() -> float | None:
    """``VmHWM`` (peak RSS since the last reset) in bytes, or None where there is none."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Start a new peak-RSS window (Linux); False where that is not possible."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


class MemoryHook(Hook):
    """Log peak device and host memory per logging interval (GiB)."""

    priority = Priority.BELOW_NORMAL

    def __init__(self, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self._resettable = False

    def before_train(self, state) -> None:
        state.run.backend.reset_peak_memory()
        self._resettable = reset_peak_rss() and interval_peak_rss_bytes() is not None

    def after_step(self, state) -> None:
        if not state.is_log_step:
            return
        values: dict[str, float] = {}
        device = state.run.backend.memory_stats()
        if device:
            values["memory/device_peak_gib"] = device.get("peak_allocated", 0.0) / GIB
            values["memory/device_allocated_gib"] = device.get("allocated", 0.0) / GIB
        host = interval_peak_rss_bytes() if self._resettable else None
        values["memory/host_peak_gib"] = (host if host is not None else lifetime_peak_rss_bytes()) / GIB
        if torch_dist.is_initialized():
            stacked = torch.tensor(list(values.values()), dtype=torch.float64, device=state.run.backend.device)
            torch_dist.all_reduce(stacked, op=torch_dist.ReduceOp.MAX)
            values = dict(zip(values, stacked.tolist()))
        state.current.metrics.update(values)
        state.run.backend.reset_peak_memory()
        if self._resettable:
            reset_peak_rss()
