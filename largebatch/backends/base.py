"""What a backend owns: device, precision, grad scaler, process-group backend,
per-step synchronisation and memory statistics.

The engine talks to the device only through this interface, so the same loop runs on a
CPU, a CUDA GPU or a Habana HPU (lazy mode needs ``mark_step()`` after backward and
after the optimizer step: ``after_backward`` and ``after_optimizer_step`` are where a
backend puts such calls).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch

from largebatch.errors import UserError

PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Backend:
    """Base class; subclasses set ``name``, ``dist_backend`` and the supported precisions.

    Args:
        precision: ``'auto'``, ``'fp32'``, ``'bf16'`` or ``'fp16'``.
        local_rank: this process's index on its node (picks the device).
    """

    name = "base"
    dist_backend = "gloo"
    supported_precisions: tuple[str, ...] = ("fp32",)
    auto_precision = "fp32"

    def __init__(self, precision: str = "auto", local_rank: int = 0) -> None:
        self.local_rank = local_rank
        self.precision = self.auto_precision if precision == "auto" else precision
        if self.precision not in self.supported_precisions:
            raise UserError(
                f"precision {self.precision!r} is not supported on {self.name}; "
                f"use one of {', '.join(self.supported_precisions)} (or 'auto')",
                key="precision",
            )
        self.device = self.make_device()

    def make_device(self) -> torch.device:
        raise NotImplementedError

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The autocast dtype, or None for fp32."""
        return PRECISION_DTYPES.get(self.precision)

    def autocast(self) -> ContextManager[Any]:
        """Context for the forward pass and loss: autocast in bf16/fp16, nothing in fp32."""
        dtype = self.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def make_grad_scaler(self) -> torch.amp.GradScaler | None:
        """A GradScaler when the precision needs one (fp16), else None."""
        return None

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move the model to the device (and apply backend-specific settings)."""
        return model.to(self.device)

    def after_backward(self) -> None:
        """Called after every micro-step's backward."""

    def after_optimizer_step(self) -> None:
        """Called after every optimizer step."""

    def synchronize(self) -> None:
        """Wait for queued device work (for timing)."""

    def memory_stats(self) -> dict[str, float]:
        """Device memory statistics in bytes (peak allocated at least), if the device has any."""
        return {}

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window."""

    def seed(self, seed: int) -> None:
        """Seed the device's random generators (torch's CPU generator is seeded separately)."""

    def describe(self) -> str:
        return f"{self.name} ({self.device}, {self.precision})"
