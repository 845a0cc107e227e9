"""The CUDA backend: one GPU per process (``LOCAL_RANK``), nccl, bf16 or fp16 autocast
(fp16 with a GradScaler), TF32 matmuls, CUDA memory statistics.

Untested on hardware in CI (no GPU there); see the README's "Running on GPUs".
"""

from __future__ import annotations

import torch

from largebatch.backends.base import Backend
from largebatch.errors import UserError


class CudaBackend(Backend):
    name = "cuda"
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
        # TF32 keeps fp32 master math but runs matmuls on tensor cores (timm and
        # Colossal-AI both enable it for ViT pretraining).
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        return torch.device("cuda", self.local_rank)

    def make_grad_scaler(self) -> torch.amp.GradScaler | None:
        return torch.amp.GradScaler("cuda") if self.precision == "fp16" else None

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def memory_stats(self) -> dict[str, float]:
        return {
            "allocated": float(torch.cuda.memory_allocated(self.device)),
            "peak_allocated": float(torch.cuda.max_memory_allocated(self.device)),
            "reserved": float(torch.cuda.memory_reserved(self.device)),
        }

    def reset_peak_memory(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def seed(self, seed: int) -> None:
        torch.cuda.manual_seed(seed)
