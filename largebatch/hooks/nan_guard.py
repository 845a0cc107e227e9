"""Stop (or skip) a step whose loss or gradients hold NaN or inf, before the update.

At ``before_optimizer_step`` (gradients complete, all-reduced and unscaled) the guard
checks the step's loss and the per-parameter gradient norms of
``state.compute_grad_norms()``: a gradient holds a non-finite value exactly when its L2
norm is non-finite (barring a finite gradient whose norm overflows float32, which is a
divergence too). With clipping on those norms are computed anyway, so the guard adds one
``isfinite`` over a vector and one host sync per step; without clipping it adds one fused
``torch._foreach_norm`` over the gradients as well. It runs before the clipping hook
(priority 30 < 50), which never sees a step it skipped.

On a non-finite value it names the step, the loss and the first parameter, in model
parameter order, whose gradient is non-finite, and then:

* ``action='stop'`` (default): raises ``NonFiniteError``; the command line prints it as
  one ``error:`` line and exits with status 2. No checkpoint is written after it.
* ``action='skip'``: zeroes the gradients and sets ``state.skip_step``: no optimizer
  update this step (the counters, the schedule and the data still advance), and the
  skip is logged as ``nan_guard/skipped`` (cumulative). After ``max_skips`` skips in a
  row it stops as above.
* ``action='off'``: no check at all (and no host sync).

With a grad scaler (fp16), inf/NaN gradients under a finite loss are the scaler's
business: it skips the update and lowers its scale, and the guard only counts them
(``nan_guard/overflows``). A non-finite loss is handled as above.

Weights never reach a checkpoint non-finite in any case: ``largebatch.checkpoint``
refuses to save them (and optimizer state holding NaN or inf), naming the tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from largebatch.engine.hook import Hook, Priority
from largebatch.errors import UserError

ACTIONS = ("stop", "skip", "off")


class NonFiniteError(UserError):
    """The loss or a gradient became NaN or inf."""


class NanGuardHook(Hook):
    """Detect a non-finite loss or gradient before the optimizer step.

    Args:
        action: ``'stop'`` (raise), ``'skip'`` (no update this step) or ``'off'`` (no
            check and no sync: the guard is a default hook, this turns it off).
        max_skips: with ``'skip'``, stop after this many consecutive skipped steps.

    Raises:
        ValueError: an unknown ``action`` (reported as an ``error:`` line naming ``hooks[i]``).
    """

    priority = Priority.HIGH

    def __init__(self, action: str = "stop", max_skips: int = 10, priority: int | str | None = None) -> None:
        super().__init__(priority)
        if action not in ACTIONS:
            raise ValueError(f"nan_guard action must be one of {', '.join(ACTIONS)}, got {action!r}")
        self.action = action
        self.max_skips = int(max_skips)
        self.skipped = 0
        self.overflows = 0
        self._in_a_row = 0

    def before_optimizer_step(self, state) -> None:
        if self.action == "off":
            return
        grads = state.compute_grad_norms()
        loss = state.step_loss if state.step_loss is not None else torch.zeros((), device=grads.norms.device)
        loss_ok = torch.isfinite(loss.detach().float()).reshape(1).to(grads.norms.device)
        finite = torch.cat([loss_ok, torch.isfinite(grads.norms)])
        if bool(finite.all()):  # the one host sync
            self._in_a_row = 0
            return
        bad = (~finite[1:]).nonzero()
        first = grads.names[int(bad[0])] if bad.numel() else None
        loss_value = float(loss)
        if state.scaler is not None and bool(loss_ok.all()):
            self.overflows += 1  # the scaler skips this update and lowers its scale
            return
        what = f"loss {loss_value}" if not bool(loss_ok.all()) else f"loss {loss_value:.6g} (finite)"
        where = f"first non-finite gradient (in parameter order): {first} ({bad.numel()} of {len(grads.names)} parameters)"
        message = f"non-finite values at step {state.step} (0-based; epoch {state.epoch}): {what}; " + (
            where if first else "all gradients finite"
        )
        if self.action == "skip" and self._in_a_row < self.max_skips:
            for param in grads.params:
                param.grad.zero_()
            state.skip_step = True
            self.skipped += 1
            self._in_a_row += 1
            if state.is_main:
                print(f"nan_guard: skipping the update: {message}", flush=True)
            return
        if self.action == "skip":
            message = f"stopping after {self._in_a_row} skipped step(s) in a row; this one: {message}"
        raise NonFiniteError(
            f"{message}. The run is diverging: lower the learning rate, set clip_grad_norm or a warmup, "
            "or resume from an earlier checkpoint"
        )

    def after_step(self, state) -> None:
        if state.is_log_step and (self.skipped or self.overflows):
            state.metrics["nan_guard/skipped"] = self.skipped
            state.metrics["nan_guard/overflows"] = self.overflows

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped, "overflows": self.overflows, "in_a_row": self._in_a_row}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped, self.overflows = state.get("skipped", 0), state.get("overflows", 0)
        self._in_a_row = state.get("in_a_row", 0)
