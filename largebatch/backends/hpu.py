"""The Habana Gaudi (HPU) backend.

Habana's PyTorch bridge (``habana_frameworks.torch``) is imported only here and only
when the HPU backend is chosen (or ``device: auto`` probes for a Gaudi).

**Execution mode** (``hpu.mode``). Habana's bridge runs in one of two modes, chosen by
the environment variable ``PT_HPU_LAZY_MODE`` *when the bridge is first imported* (it is
read once; setting it later changes nothing):

* ``lazy`` (``PT_HPU_LAZY_MODE=1``): ops are queued into a graph that is compiled and
  launched at each ``habana_frameworks.torch.core.mark_step()``. Habana's training
  references call it after ``loss.backward()`` and after ``optimizer.step()``, so each
  micro-step's forward+backward is one cached graph and the optimizer update another;
  ``after_backward`` and ``after_optimizer_step`` are those two places.
* ``eager`` / ``compile`` (``PT_HPU_LAZY_MODE=0``): ops run one by one; ``compile`` wraps
  the model in ``torch.compile(backend="hpu_backend")``. No ``mark_step``. Habana's recent
  releases make this the default and call lazy mode legacy; lazy remains the mode of
  their ViT reference and is the default here.

So the backend sets ``PT_HPU_LAZY_MODE`` before its first import of the bridge, refuses
an environment that says otherwise (a silent mismatch would run lazy mode without
``mark_step``, or the reverse), and checks the mode the bridge reports.

**Precision**: bf16 autocast, ``torch.autocast(device_type="hpu", dtype=torch.bfloat16)``
(no grad scaler: bf16 has fp32's exponent range). fp16 is not offered.

**Distributed**: the ``hccl`` process group; ``habana_frameworks.torch.distributed.hccl``
is imported before ``init_process_group``, with the rank variables already in the
environment (the bridge maps processes to Gaudis from them). DDP runs with
``broadcast_buffers=False`` as in Habana's references (a ViT has no buffers that change).

**Fused kernels** (used when the bridge provides them): with ``hpu.fused_optimizer``,
``fused_lamb`` hands ``habana_frameworks.torch.hpex.optimizers.FusedLamb`` (a whole
optimizer) to ``largebatch.optim.build_optimizer``, which runs ``optimizer.type='lamb'`` with
it (``largebatch.optim.lamb_habana``); ``hpu.fused_clip_norm`` clips with
``hpex.normalization.FusedClipNorm``.

Nothing here has run on a Gaudi: the logic is tested against a recording stand-in for
``habana_frameworks`` (``tests/backends/fake_habana``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch

from largebatch.backends.base import Backend
from largebatch.config.sections import DistConfig, HpuConfig
from largebatch.errors import UserError

MODES = ("lazy", "eager", "compile")
LAZY_ENV = "PT_HPU_LAZY_MODE"


def lazy_env_value(mode: str) -> str:
    """The ``PT_HPU_LAZY_MODE`` value ``mode`` needs."""
    return "1" if mode == "lazy" else "0"


def prepare_environment(mode: str, environ: dict[str, str] | None = None) -> None:
    """Set ``PT_HPU_LAZY_MODE`` for ``mode`` before Habana's bridge is imported.

    Raises:
        UserError: an unknown mode, or ``PT_HPU_LAZY_MODE`` already set to the other mode.
    """
    if mode not in MODES:
        raise UserError(f"hpu.mode {mode!r} is not one of {', '.join(MODES)}", key="hpu.mode")
    environ = os.environ if environ is None else environ
    wanted = lazy_env_value(mode)
    current = environ.get(LAZY_ENV)
    if current is not None and current.strip() != wanted:
        raise UserError(
            f"the environment has {LAZY_ENV}={current} but hpu.mode {mode!r} needs {LAZY_ENV}={wanted}; "
            f"unset {LAZY_ENV} (the backend sets it) or choose the matching hpu.mode",
            key="hpu.mode",
        )
    environ[LAZY_ENV] = wanted


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise UserError(
            f"device 'hpu' needs Habana's PyTorch bridge ({module} is not importable: {exc}); "
            "run inside Habana's PyTorch container or install its SynapseAI PyTorch packages, or use device='cpu'/'cuda'",
            key="device",
        ) from exc


def _optional(module: str) -> Any | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def is_available(mode: str = "lazy") -> bool:
    """Whether Habana's bridge imports and sees a Gaudi (sets ``PT_HPU_LAZY_MODE`` first)."""
    try:
        if importlib.util.find_spec("habana_frameworks") is None:
            return False
    except (ImportError, ValueError):
        return False
    if "habana_frameworks.torch" not in sys.modules:
        prepare_environment(mode)
    hpu = _optional("habana_frameworks.torch.hpu")
    return hpu is not None and bool(hpu.is_available())


class HpuBackend(Backend):
    """One Gaudi per process; see the module docstring for modes and options."""

    name = "hpu"
    options_type = HpuConfig
    dist_backend = "hccl"
    supported_precisions = ("fp32", "bf16")
    auto_precision = "bf16"

    def make_device(self) -> torch.device:
        self.mode = self.options.mode
        prepare_environment(self.mode)
        self.core = _import("habana_frameworks.torch.core")
        self.hpu = _import("habana_frameworks.torch.hpu")
        self._check_bridge_mode()
        if not self.hpu.is_available():
            raise UserError("device 'hpu' was asked for but Habana's bridge sees no Gaudi (check hl-smi); use device='auto'", key="device")
        self._fused_clip: Any = None
        self._fused_clip_max: float | None = None
        return torch.device("hpu")

    @property
    def lazy(self) -> bool:
        return self.mode == "lazy"

    def _check_bridge_mode(self) -> None:
        internal = _optional("habana_frameworks.torch.utils.internal")
        is_lazy = getattr(internal, "is_lazy", None)
        if is_lazy is not None and bool(is_lazy()) != self.lazy:
            actual = "lazy" if is_lazy() else "eager"
            raise UserError(
                f"Habana's bridge runs in {actual} mode but hpu.mode is {self.mode!r}: it was imported before "
                f"{LAZY_ENV} could be set; export {LAZY_ENV}={lazy_env_value(self.mode)} before starting Python",
                key="hpu.mode",
            )

    def autocast(self) -> ContextManager[Any]:
        dtype = self.autocast_dtype
        if dtype is None or self.sharded_precision:
            return contextlib.nullcontext()
        return torch.autocast(device_type="hpu", dtype=dtype)

    def init_process_group(self, info: Any, dist_backend: str, timeout_minutes: float) -> None:
        if info.distributed and dist_backend == "hccl":
            from largebatch.dist import rendezvous_env

            # The hccl module reads the ranks from the environment when imported.
            os.environ.update(rendezvous_env(info))
            hccl = _import("habana_frameworks.torch.distributed.hccl")
            initialize = getattr(hccl, "initialize_distributed_hpu", None)
            if initialize is not None:  # for launchers other than torchrun / mpirun (srun)
                initialize(info.world_size, info.rank, info.local_rank)
        super().init_process_group(info, dist_backend, timeout_minutes)

    def ddp_options(self, dist_cfg: DistConfig) -> dict[str, Any]:
        return {**super().ddp_options(dist_cfg), "broadcast_buffers": False}

    def compile(self, model: torch.nn.Module, enabled: bool) -> torch.nn.Module:
        if self.mode == "compile" or (enabled and self.mode == "eager"):
            return torch.compile(model, backend="hpu_backend")
        if enabled:
            raise UserError(
                "compile=True needs hpu.mode 'compile' (torch.compile with Habana's hpu_backend); lazy mode builds its own graphs",
                key="compile",
            )
        return model

    def fused_lamb(self) -> type[torch.optim.Optimizer] | None:
        # Habana's FusedLamb, a whole optimizer, when hpu.fused_optimizer asks for it and the
        # bridge has it; the optim layer sets it up (largebatch.optim.lamb_habana).
        if not self.options.fused_optimizer:
            return None
        return getattr(_optional("habana_frameworks.torch.hpex.optimizers"), "FusedLamb", None)

    def clip_grad_norm(self, parameters: list[torch.nn.Parameter], max_norm: float, norms: torch.Tensor | None = None) -> torch.Tensor:
        if self.options.fused_clip_norm and not _any_sharded(parameters):
            if self._fused_clip is None or self._fused_clip_max != max_norm:
                normalization = _optional("habana_frameworks.torch.hpex.normalization")
                cls = getattr(normalization, "FusedClipNorm", None)
                self._fused_clip = cls(parameters, max_norm) if cls is not None else False
                self._fused_clip_max = max_norm
            if self._fused_clip:
                return self._fused_clip.clip_norm(parameters)
        return super().clip_grad_norm(parameters, max_norm, norms)

    def after_backward(self) -> None:
        if self.lazy:
            self.core.mark_step()

    def after_optimizer_step(self) -> None:
        if self.lazy:
            self.core.mark_step()

    def synchronize(self) -> None:
        self.hpu.synchronize()

    def device_count(self) -> int:
        return int(self.hpu.device_count())

    def memory_stats(self) -> dict[str, float]:
        stats = self.hpu.memory_stats()
        return {
            "allocated": float(stats.get("InUse", 0)),
            "peak_allocated": float(stats.get("MaxInUse", 0)),
            "total": float(stats.get("Limit", 0)),
        }

    def reset_peak_memory(self) -> None:
        self.hpu.reset_peak_memory_stats()

    def seed(self, seed: int) -> None:
        random = _optional("habana_frameworks.torch.hpu.random")
        if random is not None and hasattr(random, "manual_seed"):
            random.manual_seed(seed)

    def describe(self) -> str:
        return f"{self.name} ({self.device}, {self.precision}, {self.mode} mode)"


def _any_sharded(parameters) -> bool:
    from largebatch.dtensors import is_sharded

    return any(is_sharded(p) for p in parameters)
