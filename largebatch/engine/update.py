"""The optimizer update of a step, inline in the engine: unscale, check, clip, step.

Every step needs these, so they are not hooks and no priority decides their order::

    window's last backward
    scaler.unscale_(optimizer)           fp16: the gradients in true units
    before_optimizer_step                hooks see the complete, unscaled gradients before
                                         clipping, and may ask to skip (state.current.request_skip)
    NonFiniteGuard.check                 a NaN or inf in the loss or a gradient: stop, or skip
    clip to clip_grad_norm               the global norm, once, from the step's one norm pass
    optimizer.step (scaler.step)         unless the step is skipped
    scaler.update()

The per-parameter gradient norms are computed at most once per step
(``TrainState.compute_grad_norms``, one ``torch._foreach_norm``, no host sync) and shared
by the check, the clipping and the hooks that log norms; the clipping factor is kept
beside them (``state.current.grad_norms.clip_coef``). The check costs one host sync per
step (``nan_guard.action='off'`` removes it).

The check (``nan_guard`` section): a gradient holds a non-finite value exactly when its
L2 norm is non-finite (a finite gradient whose norm overflows float32 is a divergence
too). On one, it names the step, the loss and the first parameter, in model parameter
order, whose gradient is non-finite, and then:

* ``action='stop'`` (default): raises ``NonFiniteError``; the command line prints it as
  one ``error:`` line and exits with status 2. No checkpoint is written after it.
* ``action='skip'``: zeroes the gradients and skips the update (the counters, the
  schedule and the data still advance), logged as ``nan_guard/skipped`` (cumulative);
  after ``max_skips`` skips in a row it stops as above.
* ``action='off'``: no check at all (and no host sync).

With a grad scaler (fp16), inf/NaN gradients under a finite loss are the scaler's
business: it skips the update and lowers its scale, and the guard only counts them
(``nan_guard/overflows``). Weights never reach a checkpoint non-finite in any case:
``largebatch.checkpoint`` refuses to save them, naming the tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from largebatch.backends.base import clip_coefficient
from largebatch.config.sections import NanGuardConfig
from largebatch.errors import UserError

if TYPE_CHECKING:  # the state holds the guard (``Run.guard``): imported at run time, a circle
    from largebatch.engine.state import TrainState


class NonFiniteError(UserError):
    """The loss or a gradient became NaN or inf."""


class NonFiniteGuard:
    """The ``nan_guard`` policy and its counts (saved in checkpoints).

    Args:
        section: the config's ``nan_guard`` section.
    """

    def __init__(self, section: NanGuardConfig) -> None:
        self.action = section.action
        self.max_skips = section.max_skips
        self.skipped = 0
        self.overflows = 0
        self.in_a_row = 0

    def check(self, state: TrainState) -> None:
        """Stop or skip a step whose loss or gradients are not finite (see the module docstring).

        Raises:
            NonFiniteError: a non-finite value with ``action='stop'``, or one more skip
                than ``max_skips`` in a row.
        """
        if self.action == "off":
            return
        grads = state.compute_grad_norms()
        step_loss = state.current.step_loss
        loss = step_loss if step_loss is not None else torch.zeros((), device=grads.norms.device)
        loss_ok = torch.isfinite(loss.detach().float()).reshape(1).to(grads.norms.device)
        finite = torch.cat([loss_ok, torch.isfinite(grads.norms)])
        if bool(finite.all()):  # the one host sync
            self.in_a_row = 0
            return
        bad = (~finite[1:]).nonzero()
        first = grads.names[int(bad[0])] if bad.numel() else None
        loss_value = float(loss)
        if state.run.scaler is not None and bool(loss_ok.all()):
            self.overflows += 1  # the scaler skips this update and lowers its scale
            return
        what = f"loss {loss_value}" if not bool(loss_ok.all()) else f"loss {loss_value:.6g} (finite)"
        where = f"first non-finite gradient (in parameter order): {first} ({bad.numel()} of {len(grads.names)} parameters)"
        message = f"non-finite values at step {state.step} (0-based; epoch {state.epoch}): {what}; " + (
            where if first else "all gradients finite"
        )
        if self.action == "skip" and self.in_a_row < self.max_skips:
            for param in grads.params:
                if param.grad is not None:  # every one: the norms are of the parameters with a gradient
                    param.grad.zero_()
            state.current.request_skip(f"nan_guard: {message}")
            self.skipped += 1
            self.in_a_row += 1
            if state.run.is_main:
                print(f"nan_guard: skipping the update: {message}", flush=True)
            return
        if self.action == "skip":
            message = f"stopping after {self.in_a_row} skipped step(s) in a row; this one: {message}"
        raise NonFiniteError(
            f"{message}. The run is diverging: lower the learning rate, set clip_grad_norm or a warmup, "
            "or resume from an earlier checkpoint"
        )

    def publish(self, state: TrainState) -> None:
        """On a logging step, the counts as ``nan_guard/skipped`` and ``nan_guard/overflows``."""
        if state.is_log_step and (self.skipped or self.overflows):
            state.current.metrics["nan_guard/skipped"] = self.skipped
            state.current.metrics["nan_guard/overflows"] = self.overflows

    def state_dict(self) -> dict[str, int]:
        return {"skipped": self.skipped, "overflows": self.overflows, "in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skipped, self.overflows = state.get("skipped", 0), state.get("overflows", 0)
        self.in_a_row = state.get("in_a_row", 0)


def clip(state: TrainState, max_norm: float) -> None:
    """Clip the gradients to a global L2 norm of ``max_norm`` with the backend's clipping
    (torch's foreach clip, or Habana's ``FusedClipNorm``), from the step's one norm pass;
    the factor applied is kept in ``state.current.grad_norms.clip_coef``."""
    norms = state.compute_grad_norms()
    total = state.run.backend.clip_grad_norm(norms.params, max_norm, norms.norms)
    norms.clip_coef = clip_coefficient(total, max_norm)


def take_update(state: TrainState, fire_before: Callable[[], None]) -> None:
    """The update of a step whose window has run (the module docstring's order);
    ``fire_before`` fires ``before_optimizer_step``."""
    run = state.run
    if run.scaler:
        run.scaler.unscale_(run.optimizer)
    fire_before()
    if not state.current.skipped:
        run.guard.check(state)
    max_norm = run.config.clip_grad_norm
    if max_norm and not state.current.skipped:
        clip(state, max_norm)
    if not state.current.skipped:
        if run.scaler:
            run.scaler.step(run.optimizer)
        else:
            run.optimizer.step()
    if run.scaler:
        run.scaler.update()
