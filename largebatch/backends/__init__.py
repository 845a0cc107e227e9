"""Backends: ``cpu``, ``cuda``, ``hpu``, or ``auto`` (HPU, then CUDA, then CPU)."""

from __future__ import annotations

import importlib.util

import torch

from largebatch.backends.base import Backend
from largebatch.errors import UserError

__all__ = ["Backend", "create_backend", "resolve_device_name"]


def _hpu_available() -> bool:
    if importlib.util.find_spec("habana_frameworks") is None:
        return False
    from largebatch.backends import hpu

    return hpu.is_available()


def resolve_device_name(name: str) -> str:
    """``auto`` becomes ``hpu`` when Habana's PyTorch bridge finds a Gaudi, else ``cuda``
    when torch sees a GPU, else ``cpu``; other names pass through."""
    if name != "auto":
        return name
    if _hpu_available():
        return "hpu"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def create_backend(name: str, precision: str = "auto", local_rank: int = 0) -> Backend:
    """Build the backend for ``device`` = ``name``.

    Raises:
        UserError: the device is not present, or the precision does not suit it.
    """
    name = resolve_device_name(name)
    if name == "cpu":
        from largebatch.backends.cpu import CpuBackend

        return CpuBackend(precision, local_rank)
    if name == "cuda":
        from largebatch.backends.cuda import CudaBackend

        return CudaBackend(precision, local_rank)
    if name == "hpu":
        from largebatch.backends import hpu

        return hpu.HpuBackend(precision, local_rank)
    raise UserError(f"unknown device {name!r}; use auto, cpu, cuda or hpu", key="device")
