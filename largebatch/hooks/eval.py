"""Evaluate every N optimizer steps and/or every N epochs.

The config's ``eval.interval_epochs`` and ``eval.at_end`` already evaluate per epoch and
after training; this hook adds evaluation in the middle of epochs. It asks with
``state.request_eval()`` at ``after_step`` (or ``after_epoch``); the engine evaluates once
every hook of that event has run, never twice for the same step, and not in a run
stopped to be resumed. Results (the task's ``eval/`` metrics; classification:
``eval/loss``, ``eval/top1``, ``eval/top5``) go to ``state.eval_metrics`` and the sinks.
"""

from __future__ import annotations

from typing import ClassVar

from largebatch.config.schema import Field
from largebatch.engine.hook import Hook, Priority


class EvalHook(Hook):
    """Args:
    interval_steps: evaluate every N optimizer steps (None: off); with a ``batch_schedule``
        other than fixed, steps at the config's global batch (``state.steps_reached``).
    interval_epochs: evaluate every N epochs (None: leave it to ``eval.interval_epochs``).
    """

    priority = Priority.NORMAL
    argument_checks: ClassVar[dict[str, Field]] = {
        "interval_steps": Field(int, None, low=1, nullable=True),
        "interval_epochs": Field(int, None, low=0, nullable=True),
    }

    def __init__(self, interval_steps: int | None = None, interval_epochs: int | None = None, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self.interval_steps = interval_steps
        self.interval_epochs = interval_epochs

    def after_step(self, state) -> None:
        if self.interval_steps and state.steps_reached(self.interval_steps):
            state.request_eval()

    def after_epoch(self, state) -> None:
        if self.interval_epochs and state.epoch % self.interval_epochs == 0:
            state.request_eval()
