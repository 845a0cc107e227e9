"""Numbers derived from a validated config at a given world size: the batch arithmetic,
the schedule's length and the effective learning rate, as one frozen ``Derived``.

``largebatch config show`` prints them under ``derived:`` and a run writes them into its
``config.yaml``; the engine uses the same object, so what is shown is what runs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from largebatch.batch_schedule import BatchSchedule, build_batch_schedule
from largebatch.batching import BatchPlan
from largebatch.config.sections import Config
from largebatch.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class LrScaling:
    """How the peak learning rate follows from the batch size.

    ``linear`` multiplies ``optimizer.lr`` by ``global_batch_size / base_batch_size``
    (Goyal et al. 2017), ``sqrt`` by its square root (You et al. 2019's rule for LAMB),
    ``none`` by 1; ``scaled_lr`` is the schedule's peak.
    """

    rule: str
    base_batch_size: int | None
    global_batch_size: int
    base_lr: float
    factor: float
    scaled_lr: float

    @classmethod
    def of(cls, cfg: Config) -> LrScaling:
        rule, base_batch = cfg.lr_schedule.scaling, cfg.lr_schedule.base_batch_size
        factor = 1.0
        if rule != "none":
            assert base_batch is not None  # validation requires it with a scaling rule
            ratio = cfg.global_batch_size / base_batch
            factor = ratio if rule == "linear" else math.sqrt(ratio)
        lr = cfg.optimizer.lr
        return cls(rule, base_batch if rule != "none" else None, cfg.global_batch_size, lr, factor, lr * factor)


@dataclasses.dataclass(frozen=True)
class Derived:
    """The derived numbers of a run: the batch plan and what follows from it.

    Attributes:
        plan: the batch arithmetic (``largebatch.batching.BatchPlan``): ``world_size``,
            ``accumulation``, ``global_batch_size``, ``micro_batch_size``,
            ``steps_per_epoch`` ...; ``derived.world_size`` and ``derived.accumulation``
            read from it.
        strategy, shard_size, replicas: the sharding layout (``sharding_layout``).
        total_steps: ``steps_per_epoch * epochs``, the schedule's length (in steps at
            ``global_batch_size``; with a ``batch_schedule`` other than fixed the run's
            own step count is ``batch_steps``).
        max_steps: the config's cap, or None.
        warmup_steps: the warmup in steps (at ``global_batch_size``).
        lr_scaling: the peak learning rate's derivation; ``peak_lr`` is its result.
        batch_schedule: the global batch along the run (``largebatch.batch_schedule``).
        batch_steps: the optimizer steps the epochs take under ``batch_schedule``
            (``total_steps`` when fixed; adaptive: at most this, the count at its start batch).
    """

    plan: BatchPlan
    strategy: str
    shard_size: int
    replicas: int
    total_steps: int
    max_steps: int | None
    warmup_steps: int
    lr_scaling: LrScaling
    batch_schedule: BatchSchedule
    batch_steps: int

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def accumulation(self) -> int:
        return self.plan.accumulation

    @property
    def peak_lr(self) -> float:
        """The schedule's peak learning rate (``lr_scaling.scaled_lr``)."""
        return self.lr_scaling.scaled_lr

    @property
    def run_steps(self) -> int:
        """Optimizer steps the run takes: ``batch_steps``, capped by ``max_steps``."""
        return min(self.batch_steps, self.max_steps) if self.max_steps else self.batch_steps

    @property
    def sharded(self) -> bool:
        """Whether the model is sharded across ranks (fsdp or hsdp on more than one rank)."""
        return self.strategy != "ddp" and self.world_size > 1

    def to_dict(self) -> dict[str, Any]:
        """The numbers as ``config show`` prints them (the plan's, flattened), in that order."""
        plan = self.plan
        schedule = {}
        if not self.batch_schedule.fixed:
            schedule = {
                "batch_schedule": {
                    "type": self.batch_schedule.type,
                    "lr_rule": self.batch_schedule.lr_rule,
                    "run_steps": self.batch_steps,
                    "stages": self.batch_schedule.stages(plan.micro_batches_per_epoch, self.total_steps // plan.steps_per_epoch),
                }
            }
            if self.batch_schedule.type == "adaptive":
                schedule["batch_schedule"]["criterion"] = self.batch_schedule.criterion_settings()
        return {
            "world_size": plan.world_size,
            "strategy": self.strategy,
            "shard_size": self.shard_size,
            "replicas": self.replicas,
            "accumulation": plan.accumulation,
            "global_batch_size": plan.global_batch_size,
            "micro_batch_size": plan.micro_batch_size,
            "train_samples": plan.num_samples,
            "samples_per_epoch": plan.samples_per_epoch,
            "steps_per_epoch": plan.steps_per_epoch,
            "total_steps": self.total_steps,
            "max_steps": self.max_steps,
            "warmup_steps": self.warmup_steps,
            "peak_lr": self.peak_lr,
            "lr_scaling": dataclasses.asdict(self.lr_scaling),
            **schedule,
        }


def sharding_layout(cfg: Config, world_size: int) -> tuple[str, int, int]:
    """``(strategy, shard_size, replicas)``: ranks sharing one copy of the model, and copies.

    ``ddp`` replicates the whole model on every rank (shard size 1); ``fsdp`` shards it
    over all ranks; ``hsdp`` over groups of ``dist.shard_size`` ranks, one replica each.

    Raises:
        ConfigError: ``hsdp`` without a ``dist.shard_size`` that divides the world size.
    """
    strategy = cfg.dist.strategy
    if strategy == "ddp":
        return strategy, 1, world_size
    if strategy == "fsdp":
        return strategy, world_size, 1
    shard = cfg.dist.shard_size
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
    return strategy, shard, world_size // shard


def derive(cfg: Config, world_size: int, num_train_samples: int) -> Derived:
    """The derived numbers of a run.

    Args:
        cfg: the resolved config.
        world_size: number of processes.
        num_train_samples: samples in the training split.

    Raises:
        UserError: the batch arithmetic does not divide, or warmup is longer than training.
    """
    plan = BatchPlan.create(
        global_batch_size=cfg.global_batch_size,
        micro_batch_size=cfg.micro_batch_size,
        world_size=world_size,
        num_samples=num_train_samples,
        partial_window=cfg.partial_window,
        max_steps_per_epoch=cfg.steps_per_epoch,
    )
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
    strategy, shard_size, replicas = sharding_layout(cfg, world_size)
    batches = build_batch_schedule(cfg, world_size)
    batch_steps = total_steps if batches.fixed else batches.run_steps(plan.micro_batches_per_epoch, cfg.epochs)
    return Derived(plan, strategy, shard_size, replicas, total_steps, cfg.max_steps, warmup, LrScaling.of(cfg), batches, batch_steps)
