"""The machine a benchmark ran on, in one line, for the results files."""

from __future__ import annotations

import os
import pathlib
import platform


def machine_description() -> str:
    """CPU model, cores, memory, GPU, OS, Python, torch, timm and OMP_NUM_THREADS."""
    import torch

    cpu = platform.machine()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        kib = int(pathlib.Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kib / 2**20:.0f} GiB memory"
    except (OSError, ValueError, IndexError):
        pass
    try:
        import timm

        timm_version = f", timm {timm.__version__}"
    except ImportError:
        timm_version = ""
    gpu = "no GPU" if not torch.cuda.is_available() else f"GPU {torch.cuda.get_device_name(0)}"
    return (
        f"{cpu}, {os.cpu_count()} cores{memory}, {gpu}; {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}{timm_version}; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )
