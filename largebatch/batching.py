"""Batch arithmetic: how a global batch splits into ranks, windows and micro-batches.

Words (see "Batch arithmetic" in docs/large-batch.md):

* **micro-batch**: what one device runs forward and backward at once.
* **accumulation** ``A``: micro-batches per device per optimizer step.
* **global batch**: ``micro_batch_size * A * world_size``, the batch the optimizer sees.
* **window**: the ``A`` micro-batches a rank runs for one optimizer step.

The config states ``global_batch_size`` and ``micro_batch_size``; ``A`` is derived at
launch from the world size, so one config runs on 4 devices (A = 32) or 128 (A = 1).

Epoch policy for the trailing partial window (``partial_window``):

* ``'drop'`` (default): an epoch is ``floor(samples / global_batch_size)`` full optimizer
  steps. The samples left over are not loaded; the per-epoch reshuffle means different
  samples are left over each epoch.
* ``'step'``: after the full steps, the leftover samples that still fill whole
  micro-batches on every rank form one last, shorter window of ``r < A`` micro-batches,
  and the optimizer steps on it. Its loss is scaled by ``1 / r`` so the gradient is the
  mean over the samples in that window (a smaller batch, not a mis-scaled one).
"""

from __future__ import annotations

import dataclasses

from largebatch.errors import UserError

PARTIAL_WINDOW_POLICIES = ("drop", "step")


def nearest_valid_global_batches(global_batch_size: int, micro_batch_size: int, world_size: int) -> list[int]:
    """The multiples of ``micro_batch_size * world_size`` closest to ``global_batch_size``."""
    unit = micro_batch_size * world_size
    below = (global_batch_size // unit) * unit
    candidates = [c for c in (below, below + unit) if c > 0]
    return sorted(set(candidates))


def derive_accumulation(global_batch_size: int, micro_batch_size: int, world_size: int) -> int:
    """Micro-batches per device per optimizer step.

    Args:
        global_batch_size: samples per optimizer step, all devices together.
        micro_batch_size: samples per device per forward/backward.
        world_size: number of devices (processes).

    Returns:
        ``global_batch_size / (micro_batch_size * world_size)``.

    Raises:
        UserError: when the global batch is not a whole multiple of
            ``micro_batch_size * world_size``; the message names the three numbers and
            the nearest valid global batch sizes.
    """
    unit = micro_batch_size * world_size
    if global_batch_size % unit != 0:
        nearest = " or ".join(str(n) for n in nearest_valid_global_batches(global_batch_size, micro_batch_size, world_size))
        raise UserError(
            f"global_batch_size {global_batch_size} is not divisible by micro_batch_size "
            f"{micro_batch_size} x world_size {world_size} = {unit}; "
            f"set global_batch_size to {nearest}, or change micro_batch_size",
            key="global_batch_size",
        )
    return global_batch_size // unit


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """The batch arithmetic of one run at one world size, for one split's sample count.

    Attributes:
        world_size: number of processes.
        micro_batch_size: samples per device per forward/backward.
        accumulation: micro-batches per device per full optimizer step (``A``).
        global_batch_size: samples per full optimizer step.
        num_samples: samples in the training split.
        partial_window: ``'drop'`` or ``'step'`` (module docstring).
        full_steps_per_epoch: optimizer steps with a full window.
        trailing_micro_batches: micro-batches per rank in the trailing partial window
            (0 with ``'drop'``).
    """

    world_size: int
    micro_batch_size: int
    accumulation: int
    global_batch_size: int
    num_samples: int
    partial_window: str
    full_steps_per_epoch: int
    trailing_micro_batches: int

    @classmethod
    def create(
        cls,
        *,
        global_batch_size: int,
        micro_batch_size: int,
        world_size: int,
        num_samples: int,
        partial_window: str = "drop",
        max_steps_per_epoch: int | None = None,
    ) -> BatchPlan:
        """Derive the plan; raises ``UserError`` when the numbers do not fit together."""
        if partial_window not in PARTIAL_WINDOW_POLICIES:
            raise UserError(
                f"partial_window must be one of {', '.join(PARTIAL_WINDOW_POLICIES)}, got {partial_window!r}",
                key="partial_window",
            )
        accumulation = derive_accumulation(global_batch_size, micro_batch_size, world_size)
        full_steps = num_samples // global_batch_size
        trailing = 0
        if partial_window == "step":
            leftover = num_samples - full_steps * global_batch_size
            trailing = leftover // (micro_batch_size * world_size)
        if max_steps_per_epoch is not None and full_steps + (trailing > 0) > max_steps_per_epoch:
            full_steps, trailing = max_steps_per_epoch, 0
        if full_steps == 0 and trailing == 0:
            raise UserError(
                f"the training split has {num_samples} samples, fewer than one global batch of "
                f"{global_batch_size} (and fewer than one micro-batch per rank for a partial "
                f"window); lower global_batch_size or use more data",
                key="global_batch_size",
            )
        return cls(
            world_size=world_size,
            micro_batch_size=micro_batch_size,
            accumulation=accumulation,
            global_batch_size=global_batch_size,
            num_samples=num_samples,
            partial_window=partial_window,
            full_steps_per_epoch=full_steps,
            trailing_micro_batches=trailing,
        )

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch, the trailing partial one included."""
        return self.full_steps_per_epoch + (1 if self.trailing_micro_batches else 0)

    @property
    def micro_batches_per_epoch(self) -> int:
        """Micro-batches each rank runs (and its loader yields) per epoch."""
        return self.full_steps_per_epoch * self.accumulation + self.trailing_micro_batches

    @property
    def samples_per_rank_per_epoch(self) -> int:
        return self.micro_batches_per_epoch * self.micro_batch_size

    @property
    def samples_per_epoch(self) -> int:
        """Samples all ranks together train on per epoch."""
        return self.samples_per_rank_per_epoch * self.world_size

    def window_sizes(self) -> list[int]:
        """Micro-batches per window, in order, for one epoch (the last may be short)."""
        sizes = [self.accumulation] * self.full_steps_per_epoch
        if self.trailing_micro_batches:
            sizes.append(self.trailing_micro_batches)
        return sizes
