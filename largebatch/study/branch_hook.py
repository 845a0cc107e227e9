"""The hook of a critical-batch branch (``largebatch.study.branch_trials``): the held-out
loss where the branch starts and where it ends.

Before the first step (the checkpoint's weights are loaded by then: ``--branch-from``) and
after the last, the model is evaluated on the run's evaluation split (the study's held-out
split) with the task's loss. Both go to ``branch_trial.json`` in the run directory, with
the steps taken; a branch whose loss diverged (``nan_guard``) is written there as
``diverged`` with no end loss (the measurement counts it as worse than any).
"""

from __future__ import annotations

import json
from typing import Any

from largebatch.engine.hook import Hook, Priority

OUTCOME = "branch_trial.json"


class BranchLossHook(Hook):
    """Evaluate the held-out loss at the start and at the end of a branch."""

    priority = Priority.NORMAL

    def __init__(self, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self._loader: Any = None
        self.start_loss: float | None = None
        self.end_loss: float | None = None
        self.stopped = "end"

    def _loss(self, state) -> float | None:
        from largebatch.engine.branch_fork import heldout_loader, heldout_loss

        if self._loader is None:
            self._loader = heldout_loader(state.run)
        return heldout_loss(state.run, self._loader)

    def before_train(self, state) -> None:
        self.start_loss = self._loss(state)

    def after_train(self, state) -> None:
        if not state.interrupted:
            self.end_loss = self._loss(state)

    def after_run(self, state) -> None:
        self._write(state)
        close = getattr(self._loader, "close", None)
        if close is not None:
            close()

    def on_exception(self, state, exc: BaseException) -> None:
        from largebatch.engine.update import NonFiniteError

        cause = exc.__cause__ if exc.__cause__ is not None else exc
        if isinstance(exc, NonFiniteError) or isinstance(cause, NonFiniteError):
            self.stopped, self.end_loss = "diverged", None
            self._write(state)

    def _write(self, state) -> None:
        if state.run.is_main:
            outcome = {"stopped": self.stopped, "start_loss": self.start_loss, "end_loss": self.end_loss, "steps_run": state.step}
            (state.run.run_dir / OUTCOME).write_text(json.dumps(outcome) + "\n")
