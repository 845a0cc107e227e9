"""The CUDA backend: one GPU per process (``LOCAL_RANK``), nccl, bf16 or fp16 autocast
(fp16 with a GradScaler), TF32 matmuls, timm's fused attention, optional
``torch.compile``, CUDA memory statistics.

Config section ``cuda`` (see ``largebatch config keys``):

* ``tf32`` (default True): fp32 matmuls and convolutions on tensor cores in TF32, as timm
  and Colossal-AI enable for ViT pretraining; parameters and optimizer state stay fp32.
* ``fused_attention`` (default True): timm's ``Attention`` calls
  ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels) when its
  ``use_fused_attn()`` says so at model construction. timm defaults to on, but
  ``TIMM_FUSED_ATTN=0`` in the environment turns it off silently; this switch calls
  ``timm.layers.set_fused_attn`` before the model is built, so the config decides.
* ``compile_mode`` (default None): the ``mode`` given to ``torch.compile`` when the
  config's ``compile`` is on (``'max-autotune'``, ``'reduce-overhead'``, ...).

The DALI loader decodes on the GPU (``device='mixed'``, nvJPEG) whenever the run's
device is a CUDA device, which is what this backend hands the loaders.

Checked here only on a machine without a GPU (construction errors, options); the
``gpu``-marked tests in ``tests/backends/test_cuda.py`` exercise a real GPU.
"""

from __future__ import annotations

from typing import Any

import torch

from largebatch.backends.base import Backend
from largebatch.config.sections import CudaConfig, DistConfig
from largebatch.errors import UserError


class CudaBackend(Backend):
    name = "cuda"
    options_type = CudaConfig
    dist_backend = "nccl"
    supported_precisions = ("fp32", "bf16", "fp16")
    auto_precision = "bf16"

    def make_device(self) -> torch.device:
        if not torch.cuda.is_available():
            raise UserError("device 'cuda' was asked for but torch sees no CUDA GPU; use device='cpu' or 'auto'", key="device")
        count = torch.cuda.device_count()
        if self.local_rank >= count:
            raise UserError(
                f"local rank {self.local_rank} has no GPU: this node has {count}; start at most {count} processes per node",
                key="device",
            )
        torch.cuda.set_device(self.local_rank)
        tf32 = self.options.tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if self.precision == "bf16" and not torch.cuda.is_bf16_supported():
            raise UserError(
                f"GPU {torch.cuda.get_device_name(self.local_rank)} has no bf16 support; use precision='fp16' (with a grad scaler) or 'fp32'",
                key="precision",
            )
        set_timm_fused_attention(self.options.fused_attention)
        return torch.device("cuda", self.local_rank)

    def make_grad_scaler(self) -> torch.amp.GradScaler | None:
        return torch.amp.GradScaler("cuda") if self.precision == "fp16" else None

    def ddp_options(self, dist_cfg: DistConfig) -> dict[str, Any]:
        return {**super().ddp_options(dist_cfg), "device_ids": [self.device.index]}

    def compile(self, model: torch.nn.Module, enabled: bool) -> torch.nn.Module:
        if not enabled:
            return model
        mode = self.options.compile_mode
        return torch.compile(model, mode=mode) if mode else torch.compile(model)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def memory_stats(self) -> dict[str, float]:
        return {
            "allocated": float(torch.cuda.memory_allocated(self.device)),
            "peak_allocated": float(torch.cuda.max_memory_allocated(self.device)),
            "reserved": float(torch.cuda.memory_reserved(self.device)),
            "peak_reserved": float(torch.cuda.max_memory_reserved(self.device)),
            "total": float(torch.cuda.get_device_properties(self.device).total_memory),
        }

    def reset_peak_memory(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def seed(self, seed: int) -> None:
        torch.cuda.manual_seed(seed)

    def describe(self) -> str:
        return f"{self.name} ({self.device} {torch.cuda.get_device_name(self.device)}, {self.precision})"


def set_timm_fused_attention(enable: bool) -> None:
    """Make timm models built from now on use (or not) ``F.scaled_dot_product_attention``."""
    from timm.layers import set_fused_attn

    set_fused_attn(enable)
