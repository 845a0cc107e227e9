"""Learning-rate schedules: linear warmup, then linear, cosine, polynomial or constant decay.

Schedules are pure functions of an explicit step count (timm's scheduler contract): the
engine passes the number of the next optimizer step, so a resumed run has no hidden
counter to drift. With a ``batch_schedule`` other than fixed the count is the position in
samples, ``samples_seen / global_batch_size``, a fraction (``lr_between``: warmup reads
where the step ends, the decay where it starts; ``largebatch.batch_schedule``). Step ``s``
(0-based) gets:

* warmup, ``s < W``: ``init + (peak - init) * (s + 1) / W``; the first step already
  moves (as Colossal-AI's ``LinearWarmupLR``), and step ``W - 1`` runs at ``peak``;
* decay, ``W <= s < T``, with ``p = (s - W) / (T - W)``:
  linear ``min + (peak - min) * (1 - p)``; cosine ``min + (peak - min) * (1 + cos(pi p)) / 2``;
  polynomial ``min + (peak - min) * (1 - p) ** power``; constant ``peak``;
* after training, ``s >= T``: the decay's end value.

The peak is ``optimizer.lr`` scaled by ``lr_schedule.scaling`` (``linear``: by
``global_batch / base_batch_size``, Goyal et al. 2017; ``sqrt``: by its square root, the
rule You et al. 2019 use for LAMB). Each param group gets ``lr * group['lr_scale']``
(layer-wise decay sets ``lr_scale``).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from largebatch.config.derive import Derived
from largebatch.config.sections import LrScheduleConfig


@dataclasses.dataclass(frozen=True)
class LRSchedule:
    """A warmup-then-decay schedule.

    Attributes:
        peak_lr: learning rate at the end of warmup.
        total_steps: optimizer steps in the run (``T``).
        warmup_steps: warmup length (``W``).
        decay: ``'linear'``, ``'cosine'``, ``'polynomial'`` or ``'constant'``.
        min_lr: learning rate at the end of the decay.
        warmup_init_lr: the ramp's starting point.
        power: exponent of the polynomial decay.
    """

    peak_lr: float
    total_steps: int
    warmup_steps: int = 0
    decay: str = "cosine"
    min_lr: float = 0.0
    warmup_init_lr: float = 0.0
    power: float = 1.0

    def __post_init__(self) -> None:
        if self.decay not in ("linear", "cosine", "polynomial", "constant"):
            raise ValueError(f"unknown decay {self.decay!r}")
        if not 0 <= self.warmup_steps <= self.total_steps:
            raise ValueError(f"warmup_steps {self.warmup_steps} outside 0..{self.total_steps}")

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based)."""
        return self.lr_between(step, step + 1)

    def lr_between(self, step: float, end: float) -> float:
        """Learning rate of a step that starts at position ``step`` and ends at ``end``, in
        steps at the config's global batch (``lr_at(s)`` is ``lr_between(s, s + 1)``)."""
        if step < self.warmup_steps:
            return self.warmup_init_lr + (self.peak_lr - self.warmup_init_lr) * min(end, self.warmup_steps) / self.warmup_steps
        if self.decay == "constant":
            return self.peak_lr
        span = self.total_steps - self.warmup_steps
        progress = 1.0 if span <= 0 else min(1.0, (step - self.warmup_steps) / span)
        if self.decay == "linear":
            factor = 1.0 - progress
        elif self.decay == "cosine":
            factor = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            factor = (1.0 - progress) ** self.power
        return self.min_lr + (self.peak_lr - self.min_lr) * factor

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Set every group's lr for step ``step`` (times the group's ``lr_scale``); returns the base lr."""
        lr = self.lr_at(step)
        self.set_lr(optimizer, lr)
        return lr

    @staticmethod
    def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
        """Set every group's lr to ``lr`` times the group's ``lr_scale``."""
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)


def build_schedule(section: LrScheduleConfig, derived: Derived) -> LRSchedule:
    """The ``lr_schedule`` section's schedule with the run's derived numbers (``config.derive``)."""
    return LRSchedule(
        peak_lr=derived.peak_lr,
        total_steps=derived.total_steps,
        warmup_steps=derived.warmup_steps,
        decay=section.type,
        min_lr=section.min_lr,
        warmup_init_lr=section.warmup_init_lr,
        power=section.power,
    )
