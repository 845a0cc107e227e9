"""Backends: ``cpu``, ``cuda``, ``hpu``, or ``auto`` (HPU, then CUDA, then CPU)."""

from __future__ import annotations

import torch

from largebatch.backends.base import Backend
from largebatch.config.sections import CudaConfig, HpuConfig
from largebatch.errors import UserError

__all__ = ["Backend", "create_backend", "resolve_device_name"]


def _hpu_available(hpu_mode: str) -> bool:
    from largebatch.backends import hpu

    return hpu.is_available(hpu_mode)


def resolve_device_name(name: str, hpu_mode: str = "lazy") -> str:
    """``auto`` becomes ``hpu`` when Habana's PyTorch bridge finds a Gaudi, else ``cuda``
    when torch sees a GPU, else ``cpu``; other names pass through.

    Probing for a Gaudi imports Habana's bridge, which reads ``PT_HPU_LAZY_MODE`` once, so
    the probe sets it for ``hpu_mode`` first (see ``largebatch.backends.hpu``).
    """
    if name != "auto":
        return name
    if _hpu_available(hpu_mode):
        return "hpu"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def create_backend(
    name: str, precision: str = "auto", local_rank: int = 0, *, cuda: CudaConfig | None = None, hpu: HpuConfig | None = None
) -> Backend:
    """Build the backend for ``device`` = ``name``.

    Args:
        name: ``auto``, ``cpu``, ``cuda`` or ``hpu``.
        precision: ``auto``, ``fp32``, ``bf16`` or ``fp16``.
        local_rank: this process's index on its node.
        cuda, hpu: the config's ``cuda`` and ``hpu`` sections (None: their defaults).

    Raises:
        UserError: the device is not present, or the precision does not suit it.
    """
    hpu = hpu if hpu is not None else HpuConfig()
    name = resolve_device_name(name, hpu.mode)
    if name == "cpu":
        from largebatch.backends.cpu import CpuBackend

        return CpuBackend(precision, local_rank)
    if name == "cuda":
        from largebatch.backends.cuda import CudaBackend

        return CudaBackend(precision, local_rank, cuda)
    if name == "hpu":
        from largebatch.backends import hpu as hpu_backend

        return hpu_backend.HpuBackend(precision, local_rank, hpu)
    raise UserError(f"unknown device {name!r}; use auto, cpu, cuda or hpu", key="device")
