"""Save checkpoints every N steps, every N epochs, at the end of training, and at the
step where a run is interrupted to be resumed (preemption, ``state.interrupted``).

See ``largebatch.checkpoint`` for what a checkpoint holds and how it is written.
Saving is collective (per-rank random states are gathered), so every rank runs it.
"""

from __future__ import annotations

from largebatch.checkpoint import save_checkpoint
from largebatch.engine.hook import Hook, Priority


class CheckpointHook(Hook):
    """Args:
    interval_steps: save every N optimizer steps (None: off).
    interval_epochs: save every N epochs (0: off).
    keep: keep the last K checkpoints.
    at_end: save after training.
    """

    priority = Priority.LOW

    def __init__(
        self,
        interval_steps: int | None = None,
        interval_epochs: int = 1,
        keep: int = 3,
        at_end: bool = True,
        priority: int | str | None = None,
    ) -> None:
        super().__init__(priority)
        self.interval_steps = interval_steps
        self.interval_epochs = interval_epochs
        self.keep = keep
        self.at_end = at_end
        self.hooks: list[Hook] = []
        self.train_loader = None
        self.last_saved_step: int | None = None

    def attach(self, hooks: list[Hook], train_loader) -> None:
        """Give the hook what a checkpoint must hold besides the state."""
        self.hooks = hooks
        self.train_loader = train_loader

    def _save(self, state) -> None:
        if self.last_saved_step == state.step:
            return
        save_checkpoint(state, self.hooks, self.train_loader, self.keep)
        self.last_saved_step = state.step

    def after_step(self, state) -> None:
        if state.interrupted or (self.interval_steps and state.step % self.interval_steps == 0):
            self._save(state)

    def after_epoch(self, state) -> None:
        if self.interval_epochs and state.epoch % self.interval_epochs == 0:
            self._save(state)

    def after_train(self, state) -> None:
        if self.at_end:
            self._save(state)
