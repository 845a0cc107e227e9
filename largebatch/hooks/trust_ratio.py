"""LAMB or LARS trust ratios per parameter group, and the layers with the most extreme ones.

LAMB (You et al. 2019, arXiv:1904.00962) scales each tensor's update by
``||w|| / ||u||``, LARS (You et al. 2017) by ``eta ||w|| / (||g|| + wd ||w||)``; a ratio
far from its neighbours' is often the first sign of a layer going wrong in a large-batch
run. The optimizer records the ratios only when asked (``request_stats()``, see
``largebatch.optim.lamb`` and ``largebatch.optim.lars``): this hook asks in
``before_optimizer_step`` of the steps that will be logged, so other steps cost nothing.

Published per group: ``trust_ratio/<group>/min``, ``/median`` (``torch.median``: the lower
middle value for an even count) and ``/max`` as device tensors, and over all groups
``trust_ratio/lowest`` and ``trust_ratio/highest``: the ``top_k`` parameter names with
their ratios, as text (``"blocks.0.attn.qkv.weight=0.0123, ..."``). Reading the names
back is one host sync, on logged steps only. With a grad scaler that skipped the update
(inf/NaN gradients), or ``nan_guard`` skipping it (on a deferred check too: the step's
flag is read here on logged steps), nothing is published.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from largebatch.config.schema import Field
from largebatch.engine.hook import Hook, Priority
from largebatch.errors import UserError


class TrustRatioHook(Hook):
    """Log LAMB trust-ratio statistics on logging steps.

    Args:
        top_k: how many of the lowest and highest ratios to name (0: none).
    """

    priority = Priority.NORMAL
    argument_checks: ClassVar[dict[str, Field]] = {"top_k": Field(int, 3, low=0)}

    def __init__(self, top_k: int = 3, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self.top_k = int(top_k)
        self._requested = False
        self._before: object = None
        self._stats: dict | None = None

    def before_run(self, state) -> None:
        if not callable(getattr(state.run.optimizer, "request_stats", None)):
            raise UserError(
                f"the trust_ratio hook needs LAMB's or LARS's statistics, but the optimizer is {type(state.run.optimizer).__name__}; "
                "set optimizer.type='lamb' or 'lars' (on an HPU with lamb also hpu.fused_optimizer=False), or drop the hook",
                key="hooks",
            )

    def before_optimizer_step(self, state) -> None:
        self._stats = None
        if state.will_log and not state.current.skipped:
            self._requested = True
            self._before = state.run.optimizer.last_stats
            state.run.optimizer.request_stats()

    def after_optimizer_step(self, state) -> None:
        # A step the deferred non-finite check skipped on the device flag recorded statistics
        # all the same: ``skipped`` reads the flag (logged steps only).
        if self._requested and not state.current.skipped:
            stats = state.run.optimizer.last_stats
            self._stats = stats if stats is not self._before else None  # a new dict: recorded this step
        self._requested, self._before = False, None

    def after_step(self, state) -> None:
        if not state.is_log_step or not self._stats:
            return
        names, ratios = [], []
        for group, entry in self._stats.items():
            ratio = entry["trust_ratio"].detach().float()
            if ratio.numel() == 0:
                continue
            state.current.metrics[f"trust_ratio/{group}/min"] = ratio.min()
            state.current.metrics[f"trust_ratio/{group}/median"] = ratio.median()
            state.current.metrics[f"trust_ratio/{group}/max"] = ratio.max()
            names += list(entry["param_names"])
            ratios.append(ratio.reshape(-1))
        if self.top_k > 0 and ratios:
            values = torch.cat([r.to(ratios[0].device) for r in ratios]).cpu().tolist()
            order = sorted(range(len(values)), key=values.__getitem__)
            show = lambda idx: ", ".join(f"{names[i]}={values[i]:.4g}" for i in idx)  # noqa: E731
            state.current.metrics["trust_ratio/lowest"] = show(order[: self.top_k])
            state.current.metrics["trust_ratio/highest"] = show(order[::-1][: self.top_k])
        self._stats = None
