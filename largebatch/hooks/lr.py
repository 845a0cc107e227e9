"""The learning rate of every parameter group at each logging step.

Published as plain numbers ``lr/<group>`` (groups named as in
``largebatch.optim.param_groups``: ``decay``, ``no_decay``, ``layer<i>_decay``, ...): the
rate the optimizer used for the logged step, read in ``before_optimizer_step`` (the
schedule sets the next step's rate right after the update). ``lr`` itself, the base rate,
is always in the record.
"""

from __future__ import annotations

from largebatch.engine.hook import Hook, Priority
from largebatch.hooks._groups import group_names


class LearningRateHook(Hook):
    """Log ``lr/<group>`` for each parameter group."""

    priority = Priority.NORMAL

    def __init__(self, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self._rates: dict[str, float] = {}

    def before_optimizer_step(self, state) -> None:
        if state.will_log:
            names = group_names(state.run.optimizer)
            self._rates = {f"lr/{name}": float(group["lr"]) for name, group in zip(names, state.run.optimizer.param_groups)}

    def after_step(self, state) -> None:
        if state.is_log_step:
            state.current.metrics.update(self._rates)
