"""The Habana Gaudi (HPU) backend.

Habana's PyTorch bridge (``habana_frameworks.torch``) is imported only here and only
when the HPU backend is chosen.
"""

from __future__ import annotations

import importlib

import torch

from largebatch.backends.base import Backend
from largebatch.errors import UserError


def _import_core():
    try:
        return importlib.import_module("habana_frameworks.torch.core")
    except ImportError as exc:
        raise UserError(
            "device 'hpu' needs Habana's PyTorch bridge (habana_frameworks.torch), which is not "
            "installed; install Habana's SynapseAI PyTorch packages or use device='cpu'/'cuda'",
            key="device",
        ) from exc


def is_available() -> bool:
    try:
        hpu = importlib.import_module("habana_frameworks.torch.hpu")
    except ImportError:
        return False
    return bool(hpu.is_available())


class HpuBackend(Backend):
    name = "hpu"
    dist_backend = "hccl"
    supported_precisions = ("fp32", "bf16")
    auto_precision = "bf16"

    def make_device(self) -> torch.device:
        self.core = _import_core()
        return torch.device("hpu")

    def after_backward(self) -> None:
        self.core.mark_step()

    def after_optimizer_step(self) -> None:
        self.core.mark_step()
