"""The CPU backend: fp32 by default (bf16 autocast is slower than fp32 on CPUs without
AMX, as measured on the reference machine), gloo for collectives."""

from __future__ import annotations

import torch

from largebatch.backends.base import Backend


class CpuBackend(Backend):
    name = "cpu"
    dist_backend = "gloo"
    supported_precisions = ("fp32", "bf16")
    auto_precision = "fp32"

    def make_device(self) -> torch.device:
        return torch.device("cpu")
