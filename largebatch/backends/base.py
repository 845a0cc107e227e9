"""What a backend owns: device, precision, grad scaler, process-group backend, DDP
options, compilation, per-step synchronisation, gradient clipping and memory statistics.

The engine talks to the device only through this interface, so the same loop runs on a
CPU, a CUDA GPU or a Habana HPU (lazy mode needs ``mark_step()`` after backward and
after the optimizer step: ``after_backward`` and ``after_optimizer_step`` are where a
backend puts such calls). ``largebatch.launch`` asks the backend for the process group,
the DDP wrapper, the compiled model and any optimizer the device supplies (``fused_lamb``,
which the optim layer builds), so a device's quirks stay here.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch

from largebatch import dist, dtensors
from largebatch.config.derive import Derived
from largebatch.config.sections import DistConfig
from largebatch.errors import UserError

PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def clip_coefficient(total_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The factor clipping multiplies gradients by: ``min(1, max_norm / (total_norm + 1e-6))``."""
    return torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)


class Backend:
    """Base class; subclasses set ``name``, ``dist_backend`` and the supported precisions.

    Args:
        precision: ``'auto'``, ``'fp32'``, ``'bf16'`` or ``'fp16'``.
        local_rank: this process's index on its node (picks the device).
        options: the config section named like the backend (``cuda``, ``hpu``); None
            takes the schema's defaults. ``self.options`` is that section (None for a
            backend without one, ``options_type`` None).
    """

    name = "base"
    dist_backend = "gloo"
    sharded_precision = False  # set by shard_model when FSDP2's policy does the casting
    supported_precisions: tuple[str, ...] = ("fp32",)
    auto_precision = "fp32"
    options_type: type | None = None  # the backend's config section class (CudaConfig, HpuConfig)

    def __init__(self, precision: str = "auto", local_rank: int = 0, options: Any = None) -> None:
        self.local_rank = local_rank
        self.options = options if options is not None or self.options_type is None else self.options_type()
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
        if dtype is None or self.sharded_precision:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def make_grad_scaler(self) -> torch.amp.GradScaler | None:
        """A GradScaler when the precision needs one (fp16), else None."""
        return None

    def init_process_group(self, info: Any, dist_backend: str, timeout_minutes: float) -> None:
        """Join the job's process group (no-op for one process); ``info`` is a ``DistInfo``."""
        dist.init_process_group(info, dist_backend, timeout_minutes)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move the model to the device (and apply backend-specific settings)."""
        return model.to(self.device)

    def ddp_options(self, dist_cfg: DistConfig) -> dict[str, Any]:
        """Keyword arguments for ``DistributedDataParallel`` from the ``dist`` config section."""
        return {
            "device_ids": None,
            "bucket_cap_mb": dist_cfg.bucket_cap_mb,
            "gradient_as_bucket_view": dist_cfg.gradient_as_bucket_view,
            "find_unused_parameters": dist_cfg.find_unused_parameters,
            "static_graph": dist_cfg.static_graph,
        }

    def wrap_ddp(self, model: torch.nn.Module, dist_cfg: DistConfig) -> torch.nn.Module:
        """``model`` in DistributedDataParallel with this backend's options."""
        return torch.nn.parallel.DistributedDataParallel(model, **self.ddp_options(dist_cfg))

    def fsdp_mixed_precision(self) -> Any:
        """FSDP2's ``MixedPrecisionPolicy`` for this precision, or None (fp32).

        bf16: parameters gathered and computed in bf16, gradients reduced in fp32, the
        sharded master weights and the optimizer state stay fp32. fp16 is refused (its
        grad scaler does not handle sharded gradients here); use bf16.
        """
        if self.precision == "fp32":
            return None
        if self.precision == "fp16":
            raise UserError(
                "precision 'fp16' is not supported with dist.strategy 'fsdp'/'hsdp' (the grad scaler does not handle sharded "
                "gradients); use precision 'bf16'",
                key="precision",
            )
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=self.autocast_dtype, reduce_dtype=torch.float32)

    def shard_model(self, model: torch.nn.Module, layout: Derived) -> torch.nn.Module:
        """Shard ``model`` in place with FSDP2: each transformer block, then the root.

        Call it on the model as built, on the host: FSDP2 moves each block's slices to
        this backend's device as it shards the block (no device ever holds the whole
        model), which is why ``prepare_model`` is not called first.

        Args:
            model: the model, on the CPU.
            layout: the run's derived numbers: ``strategy`` (``fsdp`` or ``hsdp``),
                ``shard_size`` and ``replicas`` (``largebatch.config.derive.sharding_layout``).
        """
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        if layout.strategy == "hsdp":
            mesh = init_device_mesh(self.device.type, (layout.replicas, layout.shard_size), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh(self.device.type, (layout.shard_size,), mesh_dim_names=("shard",))
        options: dict[str, Any] = {"mesh": mesh}
        policy = self.fsdp_mixed_precision()
        if policy is not None:
            options["mp_policy"] = policy
            self.sharded_precision = True  # the policy casts: no autocast around the forward
        for block in getattr(model, "blocks", []):
            fully_shard(block, **options)
        fully_shard(model, **options)
        return model

    def compile(self, model: torch.nn.Module, enabled: bool) -> torch.nn.Module:
        """``torch.compile(model)`` when ``enabled`` (the config's ``compile``), else ``model``."""
        return torch.compile(model) if enabled else model

    def fused_lamb(self) -> type[torch.optim.Optimizer] | None:
        """A whole LAMB optimizer class this device supplies, which ``largebatch.optim.build_optimizer``
        runs in place of largebatch's ``Lamb`` (``fused_lamb=``); None: the device has none."""
        return None

    def clip_grad_norm(self, parameters: list[torch.nn.Parameter], max_norm: float, norms: torch.Tensor | None = None) -> torch.Tensor:
        """Clip the global L2 norm of the gradients to ``max_norm``; returns the norm before clipping.

        The arithmetic of ``torch.nn.utils.clip_grad_norm_(..., foreach=True)``: scale by
        ``min(1, max_norm / (norm + 1e-6))``, without a host sync.

        Args:
            parameters: parameters with gradients.
            max_norm: the largest global norm allowed.
            norms: the gradients' per-parameter norms when a caller already has them
                (``TrainState.compute_grad_norms``), so they are not computed twice.
        """
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.device)
        if norms is None:
            norms = dtensors.grad_norms(grads)
        grads = dtensors.locals_of(grads)  # sharded: each rank scales its slices
        total = torch.linalg.vector_norm(norms)
        torch._foreach_mul_(grads, clip_coefficient(total, max_norm).to(grads[0].device))
        return total

    def after_backward(self) -> None:
        """Called after every micro-step's backward."""

    def after_optimizer_step(self) -> None:
        """Called after every optimizer step."""

    def synchronize(self) -> None:
        """Wait for queued device work (for timing)."""

    def device_count(self) -> int:
        """Devices of this kind on the node: at most this many processes per node, one each."""
        return 1

    def memory_stats(self) -> dict[str, float]:
        """Device memory statistics in bytes (peak allocated at least), if the device has any."""
        return {}

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window."""

    def seed(self, seed: int) -> None:
        """Seed the device's random generators (torch's CPU generator is seeded separately)."""

    def describe(self) -> str:
        return f"{self.name} ({self.device}, {self.precision})"
