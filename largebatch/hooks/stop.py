"""Stop the run at a step count or after a time limit, with a checkpoint first.

* ``max_steps``: stop after this many optimizer steps (counted from the start of the
  run, resumed steps included), like the config's ``max_steps`` but without changing
  the run's config hash or schedule. The run ends normally: the end-of-run evaluation,
  ``model.safetensors`` and exit status 0.
* ``minutes``: stop once this process has trained this long. The stop is resumable
  (as for a preemption signal): the step is checkpointed, the end-of-run evaluation and
  final weights are skipped, and the command exits with status 75
  (``largebatch.preemption.EXIT_REQUEUE``; under Slurm with ``slurm.requeue`` the job is
  requeued). ``--resume auto`` continues it. Rank 0's clock decides; the decision is
  agreed over ranks (one tiny all-reduce per step).

In both cases the checkpoint hook saves the step the run stops at.
"""

from __future__ import annotations

import time
from typing import ClassVar

from largebatch.config.schema import Field
from largebatch.dist import any_rank
from largebatch.engine.hook import Hook, Priority


class StopHook(Hook):
    """Args:
    max_steps: stop after this many optimizer steps (None: off).
    minutes: stop (resumably) after this many minutes of training (None: off).
    """

    priority = Priority.HIGH  # before the checkpoint hook in after_step
    argument_checks: ClassVar[dict[str, Field]] = {
        "max_steps": Field(int, None, low=1, nullable=True),
        "minutes": Field(float, None, low=0, low_open=True, nullable=True),
    }

    def __init__(self, max_steps: int | None = None, minutes: float | None = None, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self.max_steps = max_steps
        self.minutes = minutes
        self._start = time.monotonic()

    def before_train(self, state) -> None:
        self._start = time.monotonic()

    def after_step(self, state) -> None:
        if self.max_steps is not None and state.step >= self.max_steps:
            state.request_stop(f"max_steps {self.max_steps} reached")
        if self.minutes is not None:
            elapsed = time.monotonic() - self._start
            if any_rank(state.run.is_main and elapsed >= self.minutes * 60, state.run.backend.device):
                state.request_stop(f"time limit of {self.minutes:g} minutes reached", resumable=True)
