"""Gradient L2 norms: global and per parameter group, before and after clipping.

Computed on logging steps only, from the per-parameter norms of
``state.compute_grad_norms()``: when clipping is on they are the very norms it computed
(and the clipping factor it applied), so nothing is computed twice; on steps that are not
logged this hook does nothing. Published as device tensors (no sync here; the logger's
one all-reduce reads them): ``grad_norm`` (global, before clipping), ``grad_norm/<group>``,
and with clipping ``grad_norm_clipped`` and ``grad_norm_clipped/<group>``.

Runs after the clipping hook (priority 60 > 50) so the clipping factor is known.
Gradients are complete here: all-reduced over ranks and unscaled.
"""

from __future__ import annotations

import torch

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
        self._values: dict[str, torch.Tensor] = {}
        self._group_of: dict[int, int] = {}

    def before_train(self, state) -> None:
        self._group_of = {id(p): i for i, group in enumerate(state.optimizer.param_groups) for p in group["params"]}

    def before_optimizer_step(self, state) -> None:
        self._values = {}
        if not state.will_log:
            return
        grads = state.compute_grad_norms()
        total = grads.total
        self._values["grad_norm"] = total
        coef = grads.clip_coef
        if coef is not None:
            self._values["grad_norm_clipped"] = total * coef
        if not self.per_group or not grads.params:
            return
        names = group_names(state.optimizer)
        owners = [self._group_of.get(id(p), 0) for p in grads.params]
        index = torch.tensor(owners, device=grads.norms.device)
        squares = torch.zeros(len(names), dtype=grads.norms.dtype, device=grads.norms.device)
        per_group = squares.index_add_(0, index, grads.norms.square()).sqrt()
        for i in sorted(set(owners)):
            self._values[f"grad_norm/{names[i]}"] = per_group[i]
            if coef is not None:
                self._values[f"grad_norm_clipped/{names[i]}"] = per_group[i] * coef

    def after_step(self, state) -> None:
        if state.is_log_step:
            state.metrics.update(self._values)
        self._values = {}
