"""Per-device memory of the model's state, by ``dist.strategy``: what ``largebatch config
show`` prints under ``derived.memory_estimate``.

Counted, with fp32 master weights, fp32 gradients and the optimizer's state (two
parameter-sized tensors for LAMB and AdamW, one for LARS and SGD with momentum):

* ``parameters``, ``gradients``, ``optimizer_state``: the whole model under ``ddp``, a
  ``1 / shard_size`` slice under ``fsdp``/``hsdp``.
* ``unsharded_gradients`` (fsdp/hsdp with accumulation > 1): between the first and the
  last micro-batch of a window FSDP2 accumulates gradients unsharded, the whole model's
  on every rank, unless ``dist.reduce_every_micro_batch`` reduce-scatters after each
  micro-batch (one reduction per micro-batch instead of per step).
* ``gathered_blocks`` (fsdp/hsdp): FSDP2 gathers one transformer block's parameters for
  its forward and backward and prefetches the next, so about two blocks' weights (in the
  compute dtype) and two blocks' unsharded gradients exist at once, plus the root's own
  parameters (embeddings, head).
* ``ddp_buckets`` (ddp with accumulation > 1, several ranks): DDP's gradient buckets
  stay allocated while the first micro-batches of a window accumulate into fresh
  gradients (the engine sets gradients to None between steps), so the gradient exists
  twice during backward (measured, ``bench/sharded_memory.py``).
* ``step_temporaries``: the update direction the multi-tensor optimizer step holds (one
  parameter-sized tensor per shard). On the CPU, unsharded LAMB and LARS work in
  cache-sized windows instead and hold next to none.

The two phases do not overlap: during backward the gradients are being formed (the
unsharded ones, under fsdp with accumulation), during the optimizer step the update is.
``total`` is the larger of ``backward`` and ``step``. Not counted: activations (they
grow with the micro-batch and the resolution), the framework's own memory, workspace
and the allocator's slack. ``bench/sharded_memory.py`` measures the real peak against
this estimate.
"""

from __future__ import annotations

from typing import Any

from largebatch import vit
from largebatch.config.derive import Derived
from largebatch.config.sections import Config, OptimizerConfig
from largebatch.models import build_model, model_kwargs

GIB = 1024**3

# Optimizer state tensors per parameter, each the parameter's size.
STATE_TENSORS = {"lamb": 2, "adamw": 2, "lars": 1, "sgd": 1}


def optimizer_state_tensors(section: OptimizerConfig) -> int:
    """How many parameter-sized tensors the optimizer keeps (momentum off: none for SGD/LARS)."""
    kind = section.type
    if kind in ("lars", "sgd") and not _argument(section, "momentum"):
        return 0
    if kind == "adamw" and _argument(section, "amsgrad"):
        return 3
    return STATE_TENSORS.get(kind, 2)


def _argument(section: OptimizerConfig, name: str) -> Any:
    """The optimizer's ``name`` argument: the config's value, else its class's default (from
    the recorded signature: no torch import); None where the class has no such argument."""
    if name in section.extra:
        return section.extra[name]
    from largebatch.optim import optimizer_signature

    try:
        return optimizer_signature(section.type).default(name)
    except (KeyError, ValueError):
        return None


def model_sizes(cfg: Config) -> tuple[int, int, int]:
    """``(parameters, largest block's parameters, root-only parameters)`` of the config's
    model: written out from the architecture for timm's ViT sizes (``largebatch.vit``,
    no torch or timm imported), else counted on the model built on the meta device."""
    counted = vit.parameter_counts(cfg.model.name, model_kwargs(cfg.model, cfg.data))
    return counted if counted is not None else built_model_sizes(cfg)


def built_model_sizes(cfg: Config) -> tuple[int, int, int]:
    """``model_sizes`` counted on the model built on the meta device (no memory, no
    initialisation)."""
    import torch

    with torch.device("meta"):
        model = build_model(cfg.model, cfg.data)
    total = sum(p.numel() for p in model.parameters())
    blocks = list(getattr(model, "blocks", []))
    in_blocks = sum(p.numel() for b in blocks for p in b.parameters())
    largest = max((sum(p.numel() for p in b.parameters()) for b in blocks), default=0)
    return total, largest, total - in_blocks


def estimate_memory(cfg: Config, derived: Derived, sizes: tuple[int, int, int] | None = None) -> dict[str, Any]:
    """Bytes per device (GiB, rounded) of the model's state under the run's strategy.

    Args:
        cfg: the resolved config.
        derived: its derived numbers (``strategy``, ``shard_size``, ``accumulation``).
        sizes: ``model_sizes(cfg)`` when already known.
    """
    total, block, root = sizes or model_sizes(cfg)
    sharded = derived.sharded
    shard = derived.shard_size if sharded else 1
    fp32 = 4
    compute = 2 if cfg.precision in ("bf16", "fp16") else fp32
    windowed = not sharded and cfg.device == "cpu" and cfg.optimizer.type in ("lamb", "lars")
    parts = {
        "parameters": total * fp32 / shard,
        "gradients": total * fp32 / shard,
        "optimizer_state": total * fp32 * optimizer_state_tensors(cfg.optimizer) / shard,
        "step_temporaries": 0.0 if windowed else total * fp32 / shard,
    }
    backward = parts["parameters"] + parts["optimizer_state"] + parts["gradients"]
    if not sharded and derived.world_size > 1 and derived.accumulation > 1:
        # DDP keeps its gradient buckets while the window's first micro-batches
        # accumulate into fresh gradients (zero_grad sets them to None): two copies
        parts["ddp_buckets"] = parts["gradients"]
        backward += parts["ddp_buckets"]
    if sharded:
        parts["gathered_blocks"] = 2 * block * (compute + compute) + root * compute
        backward += parts["gathered_blocks"]
        if derived.accumulation > 1 and not cfg.dist.reduce_every_micro_batch:
            parts["unsharded_gradients"] = total * fp32  # FSDP2 accumulates them in the fp32 reduce dtype
            backward += parts["unsharded_gradients"] - parts["gradients"]
    step = parts["parameters"] + parts["gradients"] + parts["optimizer_state"] + parts["step_temporaries"]
    out: dict[str, Any] = {"parameters": total}
    out.update({f"{k}_gib": round(v / GIB, 3) for k, v in parts.items()})
    out["backward_gib"] = round(backward / GIB, 3)
    out["step_gib"] = round(step / GIB, 3)
    out["total_gib"] = max(out["backward_gib"], out["step_gib"])
    out["not_counted"] = "activations, the framework's own memory, workspace, allocator slack"
    return out
