"""Numbers derived from a validated config at a given world size: the batch arithmetic,
the schedule's length and the effective learning rate. ``largebatch config show`` prints
them under ``derived:``; the engine uses the same function, so what is shown is what runs.
"""

from __future__ import annotations

import math
from typing import Any

from largebatch.batching import BatchPlan
from largebatch.config.typed import Config, typed
from largebatch.errors import ConfigError


def scaled_lr(cfg: Config | dict[str, Any]) -> float:
    """``optimizer.lr`` scaled by ``lr_schedule.scaling`` from ``base_batch_size``."""
    return lr_scaling(cfg)["scaled_lr"]


def lr_scaling(cfg: Config | dict[str, Any]) -> dict[str, Any]:
    """How the peak learning rate follows from the batch size.

    ``linear`` multiplies ``optimizer.lr`` by ``global_batch_size / base_batch_size``
    (Goyal et al. 2017), ``sqrt`` by its square root (You et al. 2019's rule for LAMB),
    ``none`` by 1.

    Returns:
        ``rule``, ``base_batch_size``, ``global_batch_size``, ``base_lr``, ``factor`` and
        ``scaled_lr`` (the schedule's peak).
    """
    cfg = typed(cfg)
    rule, base_batch = cfg.lr_schedule.scaling, cfg.lr_schedule.base_batch_size
    factor = 1.0
    if rule != "none":
        ratio = cfg.global_batch_size / base_batch
        factor = ratio if rule == "linear" else math.sqrt(ratio)
    lr = cfg.optimizer.lr
    return {
        "rule": rule,
        "base_batch_size": base_batch if rule != "none" else None,
        "global_batch_size": cfg.global_batch_size,
        "base_lr": lr,
        "factor": factor,
        "scaled_lr": lr * factor,
    }


def sharding_layout(cfg: Config | dict[str, Any], world_size: int) -> dict[str, Any]:
    """``strategy``, ``shard_size`` (ranks sharing one copy of the model) and ``replicas``.

    ``ddp`` replicates the whole model on every rank (shard size 1); ``fsdp`` shards it
    over all ranks; ``hsdp`` over groups of ``dist.shard_size`` ranks, one replica each.

    Raises:
        ConfigError: ``hsdp`` without a ``dist.shard_size`` that divides the world size.
    """
    strategy = typed(cfg).dist.strategy
    if strategy == "ddp":
        return {"strategy": strategy, "shard_size": 1, "replicas": world_size}
    if strategy == "fsdp":
        return {"strategy": strategy, "shard_size": world_size, "replicas": 1}
    shard = typed(cfg).dist.shard_size
    if shard is None:
        raise ConfigError(
            "dist.strategy 'hsdp' needs dist.shard_size, the ranks that share one copy of the model (e.g. the devices of "
            "a node); or use 'fsdp' to shard over all ranks",
            key="dist.shard_size",
        )
    if world_size % shard:
        raise ConfigError(
            f"dist.shard_size {shard} does not divide the world size {world_size}; use a divisor of {world_size}",
            key="dist.shard_size",
        )
    return {"strategy": strategy, "shard_size": shard, "replicas": world_size // shard}


def make_plan(cfg: Config | dict[str, Any], world_size: int, num_train_samples: int) -> BatchPlan:
    """The run's ``BatchPlan``; raises ``UserError`` when the batch arithmetic fails."""
    cfg = typed(cfg)
    return BatchPlan.create(
        global_batch_size=cfg.global_batch_size,
        micro_batch_size=cfg.micro_batch_size,
        world_size=world_size,
        num_samples=num_train_samples,
        partial_window=cfg.partial_window,
        max_steps_per_epoch=cfg.steps_per_epoch,
    )


def derive(cfg: Config | dict[str, Any], world_size: int, num_train_samples: int) -> dict[str, Any]:
    """The derived numbers of a run.

    Args:
        cfg: a validated config (typed, or the dict ``validate`` returns).
        world_size: number of processes.
        num_train_samples: samples in the training split.

    Returns:
        A dict with ``world_size``, ``strategy``, ``shard_size`` and ``replicas`` (see
        ``sharding_layout``), ``accumulation``, ``global_batch_size``,
        ``micro_batch_size``, ``train_samples``, ``steps_per_epoch``, ``total_steps``,
        ``warmup_steps``, ``peak_lr``, ``lr_scaling`` (see ``lr_scaling``) and
        ``samples_per_epoch``.

    Raises:
        UserError: the batch arithmetic does not divide, or warmup is longer than training.
    """
    cfg = typed(cfg)
    plan = make_plan(cfg, world_size, num_train_samples)
    total_steps = plan.steps_per_epoch * cfg.epochs
    schedule = cfg.lr_schedule
    if schedule.warmup_epochs is not None:
        warmup = round(schedule.warmup_epochs * plan.steps_per_epoch)
        warmup_key = "lr_schedule.warmup_epochs"
    else:
        warmup = schedule.warmup_steps or 0
        warmup_key = "lr_schedule.warmup_steps"
    if warmup > total_steps:
        raise ConfigError(
            f"warmup is {warmup} steps but training is {total_steps} steps "
            f"({cfg.epochs} epochs x {plan.steps_per_epoch} steps); shorten the warmup or train longer",
            key=warmup_key,
        )
    return {
        "world_size": world_size,
        **sharding_layout(cfg, world_size),
        "accumulation": plan.accumulation,
        "global_batch_size": plan.global_batch_size,
        "micro_batch_size": plan.micro_batch_size,
        "train_samples": num_train_samples,
        "samples_per_epoch": plan.samples_per_epoch,
        "steps_per_epoch": plan.steps_per_epoch,
        "total_steps": total_steps,
        "max_steps": cfg.max_steps,
        "warmup_steps": warmup,
        "peak_lr": scaled_lr(cfg),
        "lr_scaling": lr_scaling(cfg),
    }
