"""Gradient L2 norms: global and per parameter group, before and after clipping.

On logging steps only: at ``before_optimizer_step`` (gradients complete, all-reduced and
unscaled, not yet clipped) it asks for the step's per-parameter norms
(``state.compute_grad_norms()``, the one norm pass the engine's clipping and non-finite
check share, so nothing is computed twice); at ``after_step``, once the engine has
clipped and kept the factor beside them, it publishes them as device tensors (no sync
here; the logger's one all-reduce reads them): ``grad_norm`` (global, before clipping),
``grad_norm/<group>``, and with clipping ``grad_norm_clipped`` and
``grad_norm_clipped/<group>``. On steps that are not logged it does nothing.
"""

from __future__ import annotations

from largebatch.engine.hook import Hook, Priority
from largebatch.hooks._groups import group_names


class GradNormHook(Hook):
    """Log global and per-group gradient norms before (and after) clipping.

    Args:
        per_group: also log one norm per parameter group.
    """

    priority = Priority.BELOW_NORMAL

    def __init__(self, per_group: bool = True, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self.per_group = per_group
        self._group_of: dict[int, int] = {}

    def before_train(self, state) -> None:
        self._group_of = {id(p): i for i, group in enumerate(state.run.optimizer.param_groups) for p in group["params"]}

    def before_optimizer_step(self, state) -> None:
        if state.will_log:
            state.compute_grad_norms()  # before clipping; the engine clips after this event

    def after_step(self, state) -> None:
        grads = state.current.grad_norms
        if not state.is_log_step or grads is None:
            return
        values = state.current.metrics
        total = grads.total
        values["grad_norm"] = total
        coef = grads.clip_coef
        if coef is not None:
            values["grad_norm_clipped"] = total * coef
        if not self.per_group or not grads.params:
            return
        import torch

        names = group_names(state.run.optimizer)
        owners = [self._group_of.get(id(p), 0) for p in grads.params]
        index = torch.tensor(owners, device=grads.norms.device)
        squares = torch.zeros(len(names), dtype=grads.norms.dtype, device=grads.norms.device)
        per_group = squares.index_add_(0, index, grads.norms.square()).sqrt()
        for i in sorted(set(owners)):
            values[f"grad_norm/{names[i]}"] = per_group[i]
            if coef is not None:
                values[f"grad_norm_clipped/{names[i]}"] = per_group[i] * coef
