"""Save checkpoints every N steps, every N epochs, every T minutes, at the end of
training, and at the step where a hook asks the run to stop (preemption, the ``stop``
hook's limits, or any ``state.request_stop``), so a stopped run can always resume.

See ``largebatch.checkpoint`` for what a checkpoint holds and how it is written; a save
of weights or optimizer state holding NaN or inf is refused there, naming the tensors.
Saving is collective (per-rank random states are gathered), so every rank runs it; the
time-based interval is decided by rank 0's clock and agreed over ranks (one tiny
all-reduce per step, only when ``interval_minutes`` is set).

With ``async_save`` a save holds training only while the state is copied to host
memory; the write runs on a background thread (``largebatch.checkpoint_writer``). The
next save waits for it, and so do the end of training and an error.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from largebatch.checkpoint_writer import CheckpointWriter
from largebatch.config.sections import CheckpointConfig
from largebatch.dist import any_rank
from largebatch.engine.hook import Hook, Priority

_SCHEMA = CheckpointConfig()  # the checkpoint section's defaults: the config gives the same ones


class CheckpointHook(Hook):
    """Args:
    interval_steps: save every N optimizer steps (None: off); with a ``batch_schedule``
        other than fixed, steps at the config's global batch: each time the samples seen
        cross a multiple of ``N x global_batch_size``.
    interval_epochs: save every N epochs (0: off).
    interval_minutes: save when T minutes have passed since the last save (or the
        start of this process) (None: off).
    keep: keep the last K checkpoints.
    at_end: save after training.
    async_save: write on a background thread from a host-memory copy.
    """

    priority = Priority.LOW
    # each argument is checked as the checkpoint section's key of its name
    argument_checks: ClassVar[dict[str, str]] = {
        name: f"checkpoint.{name}" for name in ("interval_steps", "interval_epochs", "interval_minutes", "keep", "at_end", "async_save")
    }

    def __init__(
        self,
        interval_steps: int | None = _SCHEMA.interval_steps,
        interval_epochs: int = _SCHEMA.interval_epochs,
        interval_minutes: float | None = _SCHEMA.interval_minutes,
        keep: int = _SCHEMA.keep,
        at_end: bool = _SCHEMA.at_end,
        async_save: bool = _SCHEMA.async_save,
        priority: int | str | None = None,
    ) -> None:
        super().__init__(priority)
        self.interval_steps = interval_steps
        self.interval_epochs = interval_epochs
        self.interval_minutes = interval_minutes
        self.keep = keep
        self.at_end = at_end
        self.writer = CheckpointWriter(async_save)
        self.last_saved_step: int | None = None
        self._last_save_time = time.monotonic()

    def _save(self, state) -> None:
        if self.last_saved_step == state.step:
            return
        self.writer.save(state, state.hooks, self.keep)
        self.last_saved_step = state.step
        self._last_save_time = time.monotonic()

    def _time_due(self, state) -> bool:
        if not self.interval_minutes:
            return False
        due = state.run.is_main and time.monotonic() - self._last_save_time >= self.interval_minutes * 60
        return any_rank(due, state.run.backend.device)

    def before_train(self, state) -> None:
        self._last_save_time = time.monotonic()

    def after_step(self, state) -> None:
        by_steps = bool(self.interval_steps) and state.steps_reached(self.interval_steps)
        if self._time_due(state) or state.should_stop or by_steps:
            self._save(state)

    def after_epoch(self, state) -> None:
        if self.interval_epochs and state.epoch % self.interval_epochs == 0:
            self._save(state)

    def after_train(self, state) -> None:
        if self.at_end:
            self._save(state)
        self.writer.close()  # the end of a run, a stop or a preemption: the last checkpoint is complete

    def on_exception(self, state, exc: BaseException) -> None:
        self.writer.close()  # the save in flight is a checkpoint to resume from

    def state_dict(self) -> dict[str, Any]:
        return {"last_saved_step": self.last_saved_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_saved_step = state.get("last_saved_step")
