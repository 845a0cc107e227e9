"""The optimizer update of a step, inline in the engine: unscale, check, clip, step.

Every step needs these, so they are not hooks and no priority decides their order::

    window's last backward
    NonFiniteGuard.settle                the previous step's deferred check, if one is pending
    scaler.unscale_(optimizer)           fp16: the gradients in true units
    before_optimizer_step                hooks see the complete, unscaled gradients before
                                         clipping, and may ask to skip (state.current.request_skip)
    NonFiniteGuard.check                 a NaN or inf in the loss or a gradient: stop, or skip
    clip to clip_grad_norm               the global norm, once, from the step's one norm pass
    optimizer.step (scaler.step)         unless the step is skipped (deferred: the kernel reads the flag)
    scaler.update()

The per-parameter gradient norms are computed at most once per step
(``TrainState.compute_grad_norms``, one ``torch._foreach_norm``, no host sync) and shared
by the check, the clipping and the hooks that log norms; the clipping factor is kept
beside them (``state.current.grad_norms.clip_coef``).

When the check reads its flag on the host: with an optimizer that skips an update on a
device flag by itself (torch's ``fused=True`` Adam, AdamW and SGD, which read ``found_inf``
as under ``GradScaler``, and largebatch's LAMB and LARS, which read it on every path:
``largebatch.optim.layerwise``), no grad scaler and unsharded parameters (``dist.strategy``
ddp), the check is *deferred*: the flag goes to the optimizer's kernel on the device (a
non-finite step leaves the parameters and the optimizer's state bit for bit as they were)
and to the host in pinned memory (``largebatch.host_copy``), where it is read one step
later (``NonFiniteGuard.settle``: at the next step's update, once that step's forward and
backward are queued), so the step has no host sync. It is read at once where the outcome
is needed sooner: a hook reading ``state.current.skipped`` (the ``ema`` hook every step,
``trust_ratio`` on logged steps), a logged step (its ``nan_guard/...`` counts), a
checkpoint, an evaluation, the end of training. Every other optimizer (foreach AdamW, SGD,
Habana's FusedLamb, whose ``step`` takes no flag), any run with a grad scaler and
fsdp/hsdp keep the synchronous check: one host sync per step.
``nan_guard.action='off'`` removes both.

The check (``nan_guard`` section): a gradient holds a non-finite value exactly when its
L2 norm is non-finite (a finite gradient whose norm overflows float32 is a divergence
too). On one, it names the step, the loss and the first parameter, in model parameter
order, whose gradient is non-finite, and then:

* ``action='stop'`` (default): raises ``NonFiniteError``; the command line prints it as
  one ``error:`` line and exits with status 2. No checkpoint is written after it. A
  deferred check stops where it is read, at the latest in the next step's update: the bad
  step's update was not applied, its ``after_optimizer_step`` and ``after_step`` hooks have
  run (a checkpoint it would save reads the flag first and is not written), and the next
  step's forward and backward ran without an update (``state.step`` is one more than the
  step the message names).
* ``action='skip'``: zeroes the gradients and skips the update (the counters, the
  schedule and the data still advance), logged as ``nan_guard/skipped`` (cumulative);
  after ``max_skips`` skips in a row it stops as above. Deferred, the outcome is the same
  bit for bit (parameters, optimizer state, counts, metrics, message); the gradients are
  zeroed when the flag is read, if they are still there, and the clipping ran on the bad
  gradients (``clip_coef`` is dropped then).
* ``action='off'``: no check at all (and no host sync).

With a grad scaler (fp16), inf/NaN gradients under a finite loss are the scaler's
business: it skips the update and lowers its scale, and the guard only counts them
(``nan_guard/overflows``). Weights never reach a checkpoint non-finite in any case:
``largebatch.checkpoint`` refuses to save them, naming the tensors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from largebatch.backends.base import clip_coefficient
from largebatch.config.sections import NanGuardConfig
from largebatch.errors import UserError
from largebatch.host_copy import HostCopy

if TYPE_CHECKING:  # the state holds the guard (``Run.guard``): imported at run time, a circle
    from largebatch.engine.state import Run, Step, TrainState


class NonFiniteError(UserError):
    """The loss or a gradient became NaN or inf."""


@dataclasses.dataclass(eq=False)
class Checked:
    """What a step's check found, on the host: enough to name the step and the parameter.

    Attributes:
        step / epoch: the step checked and its epoch (0-based counters).
        loss: the step's loss.
        flags: finite or not: the loss first, then each gradient's norm.
        names / params: the parameters with a gradient, in model parameter order.
        owner: the step's ``Step``; its gradients are still there while it is ``state.current``.
    """

    step: int
    epoch: int
    loss: float
    flags: list[bool]
    names: list[str]
    params: list[torch.nn.Parameter]
    owner: Step


@dataclasses.dataclass(eq=False)
class Deferred:
    """A step's check on its way to the host: ``values``, the loss, then 1.0 or 0.0 for
    each of ``flags``."""

    state: TrainState
    checked: Checked
    values: HostCopy


def skips_on_found_inf(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step()`` skips the update by itself where ``found_inf`` says so:
    torch's fused Adam, AdamW and SGD (``_step_supports_amp_scaling``: they read it as under
    ``GradScaler``) and largebatch's LAMB and LARS (``skips_on_found_inf``, which
    ``GradScaler`` does not look at)."""
    return any(bool(getattr(optimizer, name, False)) for name in ("_step_supports_amp_scaling", "skips_on_found_inf"))


def defers(guard_action: str, run: Run) -> bool:
    """Whether the check's host read waits a step: the optimizer skips an update on a
    device flag by itself (``skips_on_found_inf``), no grad scaler is on (fp16 keeps the
    synchronous check) and the parameters are not sharded (a plain flag beside DTensors:
    not tried)."""
    return guard_action != "off" and skips_on_found_inf(run.optimizer) and run.scaler is None and not run.sharded


class NonFiniteGuard:
    """The ``nan_guard`` policy and its counts (saved in checkpoints). With a deferred check
    pending, the counts lack that step until ``settle`` reads it (``publish`` and
    ``state_dict`` settle first).

    Args:
        section: the config's ``nan_guard`` section.
    """

    def __init__(self, section: NanGuardConfig) -> None:
        self.action = section.action
        self.max_skips = section.max_skips
        self.skipped = 0
        self.overflows = 0
        self.in_a_row = 0
        self._pending: Deferred | None = None

    def check(self, state: TrainState) -> torch.Tensor | None:
        """Check the step's loss and gradients (see the module docstring).

        Returns:
            On the deferred path (``defers``), the device flag ``found_inf`` (1.0: not
            finite) the optimizer's step must read; the outcome is settled later
            (``settle``). Otherwise None, with the outcome settled here.

        Raises:
            NonFiniteError: a non-finite value with ``action='stop'``, or one more skip
                than ``max_skips`` in a row (synchronous path).
        """
        if self.action == "off":
            return None
        grads = state.compute_grad_norms()
        step_loss = state.current.step_loss
        device = grads.norms.device
        loss = (step_loss if step_loss is not None else torch.zeros((), device=device)).detach().float().reshape(1).to(device)
        finite = torch.cat([torch.isfinite(loss), torch.isfinite(grads.norms)])
        checked = Checked(state.step, state.epoch, 0.0, [], grads.names, grads.params, state.current)
        if defers(self.action, state.run):
            self._pending = Deferred(state, checked, HostCopy(torch.cat([loss, finite.float()])))
            state.current.settle = self.settle
            return (~finite.all()).float()
        if bool(finite.all()):  # the one host sync of the synchronous path
            self.in_a_row = 0
            return None
        checked.loss, checked.flags = float(loss), finite.tolist()
        self._outcome(state, checked)
        return None

    def settle(self) -> None:
        """Read the deferred check's flags (waiting at most for the step that made them)
        and act on them as the synchronous check would have; nothing when none is pending.

        Raises:
            NonFiniteError: as ``check``.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return
        checked = pending.checked
        checked.owner.settle = None
        values = pending.values.tolist()
        checked.loss, checked.flags = values[0], [bool(v) for v in values[1:]]
        if all(checked.flags):
            self.in_a_row = 0
            return
        self._outcome(pending.state, checked)

    def _outcome(self, state: TrainState, checked: Checked) -> None:
        """A check found a non-finite value: count an overflow, skip the step, or stop."""
        loss_ok = checked.flags[0]
        bad = [i for i, ok in enumerate(checked.flags[1:]) if not ok]
        first = checked.names[bad[0]] if bad else None
        if state.run.scaler is not None and loss_ok:
            self.overflows += 1  # the scaler skips this update and lowers its scale
            return
        what = f"loss {checked.loss}" if not loss_ok else f"loss {checked.loss:.6g} (finite)"
        where = f"first non-finite gradient (in parameter order): {first} ({len(bad)} of {len(checked.names)} parameters)"
        message = f"non-finite values at step {checked.step} (0-based; epoch {checked.epoch}): {what}; " + (
            where if first else "all gradients finite"
        )
        if self.action == "skip" and self.in_a_row < self.max_skips:
            step = checked.owner
            if step is state.current:  # its gradients are still there: zeroed, as no update used them
                for param in checked.params:
                    if param.grad is not None:  # every one: the norms are of the parameters with a gradient
                        param.grad.zero_()
            if step.grad_norms is not None:
                step.grad_norms.clip_coef = None  # a deferred check let the clipping run: it did not count
            step.request_skip(f"nan_guard: {message}")
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
        """On a logging step, the counts as ``nan_guard/skipped`` and ``nan_guard/overflows``
        (settling a deferred check first, so they count this step)."""
        if not state.is_log_step:
            return
        self.settle()
        if self.skipped or self.overflows:
            state.current.metrics["nan_guard/skipped"] = self.skipped
            state.current.metrics["nan_guard/overflows"] = self.overflows

    def state_dict(self) -> dict[str, int]:
        """The counts, with a deferred check settled first.

        Raises:
            NonFiniteError: the settled check stops the run (before anything is saved).
        """
        self.settle()
        return {"skipped": self.skipped, "overflows": self.overflows, "in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skipped, self.overflows = state.get("skipped", 0), state.get("overflows", 0)
        self.in_a_row = state.get("in_a_row", 0)
        self._pending = None


def step_unless(optimizer: torch.optim.Optimizer, found_inf: torch.Tensor) -> None:
    """``optimizer.step()``, which leaves the parameters and the optimizer's state exactly as
    they were when ``found_inf`` is 1.0: decided on the device, by the optimizer's kernel
    (set as ``GradScaler.step`` sets them; the gradients are in true units, so no scale)."""
    given = {"grad_scale": None, "found_inf": found_inf}  # the attributes torch's optimizers read
    for name, value in given.items():
        setattr(optimizer, name, value)
    try:
        optimizer.step()
    finally:
        for name in given:
            delattr(optimizer, name)


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
    run.guard.settle()  # the previous step's deferred check: this step's window is queued behind it
    if run.scaler:
        run.scaler.unscale_(run.optimizer)
    fire_before()
    step = state.current  # its ``skip_reason``, not ``skipped``: reading that would settle this step's check
    found_inf = run.guard.check(state) if step.skip_reason is None else None
    max_norm = run.config.clip_grad_norm
    if max_norm and step.skip_reason is None:
        clip(state, max_norm)
    if step.skip_reason is None:
        if run.scaler:
            run.scaler.step(run.optimizer)
        elif found_inf is not None:
            step_unless(run.optimizer, found_inf)
        else:
            run.optimizer.step()
    if run.scaler:
        run.scaler.update()
