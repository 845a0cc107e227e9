"""``TrainState``: what hooks see, grouped by how long it lives. Hooks get the state, never the engine.

* ``state.run`` (``Run``): built once for the run and fixed: the config, the derived
  numbers, the backend, the model, the optimizer, the schedule, the task, the run
  directory, the random streams.
* ``state.current`` (``Step``): the optimizer step being taken: its window, the current
  micro-batch, its outputs and loss, the gradient norms, a requested skip and the metrics
  hooks publish. The engine starts a fresh one at every step (nothing to reset by hand).
* The counters (``state.step``, ``state.epoch``, ...; ``state.counters`` as one frozen
  ``Counters``): only the engine advances them.
* What lives for the run but changes (``eval_metrics``, a requested stop or evaluation,
  the time spent waiting for data) is the state's own.

Counters are named by their unit:

* ``step``: optimizer steps completed. During a step's events (``before_step`` to
  ``after_optimizer_step``) it is the 0-based index of the step being taken; at
  ``after_step`` it already counts that step.
* ``micro_step``: forward/backward passes completed on this rank (advanced before
  ``after_backward``).
* ``samples_seen``: training samples consumed by all ranks together.
* ``epoch``: epochs completed; during an epoch's events, the 0-based index of the
  current epoch (advanced before ``after_epoch``).
* ``step_in_epoch``: optimizer steps completed in the current epoch (0 again at
  ``after_epoch``).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import torch

from largebatch import dtensors
from largebatch.config.derive import Derived
from largebatch.config.sections import Config
from largebatch.dist import DistInfo
from largebatch.engine.update import NonFiniteGuard
from largebatch.randomness import RandomStreams
from largebatch.rundir import RunDir
from largebatch.tasks import Task


@dataclasses.dataclass(frozen=True)
class Counters:
    """The run's counters (see the module docstring); the engine replaces the object as
    they advance, and checkpoints save and restore it."""

    step: int = 0
    micro_step: int = 0
    samples_seen: int = 0
    epoch: int = 0
    step_in_epoch: int = 0

    def state_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_state_dict(cls, state: dict[str, int]) -> Counters:
        return cls(**{key: int(value) for key, value in state.items()})


@dataclasses.dataclass
class GradNorms:
    """Per-parameter gradient norms of one step, in model parameter order.

    Attributes:
        names: parameter names (those with a gradient).
        params: the parameters themselves.
        norms: 1-D tensor of the L2 norm of each gradient before clipping.
        clip_coef: the factor clipping multiplied the gradients by (a 0-d tensor, at
            most 1), or None when nothing clipped.
    """

    names: list[str]
    params: list[torch.nn.Parameter]
    norms: torch.Tensor
    clip_coef: torch.Tensor | None = None

    @property
    def total(self) -> torch.Tensor:
        """The global L2 norm before clipping."""
        return torch.linalg.vector_norm(self.norms)


@dataclasses.dataclass(eq=False)
class Run:
    """What lives for the whole run, built once by ``largebatch.launch``.

    Attributes:
        config: the resolved config, typed and frozen (``state.run.config.eval.at_end``;
            ``config.to_dict()`` is the plain nested dict, for hooks written against dicts).
        derived: the derived numbers, holding the batch plan (``derived.plan``).
        dist: rank, world size, local rank.
        backend: the device backend.
        model: the model being trained (unwrapped; its ``state_dict`` is the weights).
        train_model: what the forward pass calls (the DDP wrapper when distributed).
        optimizer, schedule, scaler, mixup: as built from the config (scaler may be None).
        task: the objective (``largebatch.tasks``): forward, loss, train and eval metrics.
        run_dir: the run directory (``largebatch.rundir.RunDir``).
        random: the run's random streams (``largebatch.randomness``); the engine reseeds
            the model's generators from it before every forward pass.
        hooks: the run's hooks in firing order (set by the engine); checkpoints save and
            restore each one's ``state_dict``.
        extra_models: models kept beside the trained one, by name (the ``ema`` hook's
            ``'ema'``), registered by hooks in ``before_run``: each is evaluated after the
            model with the same task and loader (metrics ``eval_<name>/...``) unless its
            name is in ``skip_eval_models``, and written at the end of the run as
            ``model_<name>.safetensors``.
        sync_first_micro: under ``dist.strategy`` fsdp/hsdp, reduce the gradients after
            each window's first micro-batch too (set in ``before_run`` by a hook that
            reads that micro-batch's gradient: sharded gradients exist only once reduced).
        guard: the non-finite check of every update (``largebatch.engine.update``, the
            config's ``nan_guard``); checkpoints save its counts.
        plan, rank, world_size, is_main, total_steps, sharded: read from ``derived`` and
            ``dist`` once (``total_steps``: the optimizer steps this run takes, ``max_steps``
            included; ``sharded``: the parameters are FSDP2 DTensors).
        sync_every_micro: under fsdp/hsdp, reduce after every micro-batch
            (``dist.reduce_every_micro_batch``).
    """

    config: Config
    derived: Derived
    dist: DistInfo
    backend: Any
    model: torch.nn.Module
    train_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: Any
    scaler: torch.amp.GradScaler | None
    mixup: Any
    task: Task
    run_dir: RunDir
    random: RandomStreams
    hooks: list[Any] = dataclasses.field(default_factory=list)
    extra_models: dict[str, torch.nn.Module] = dataclasses.field(default_factory=dict)
    skip_eval_models: set[str] = dataclasses.field(default_factory=set)
    sync_first_micro: bool = False

    def __post_init__(self) -> None:
        self.guard = NonFiniteGuard(self.config.nan_guard)
        # fixed for the run: read once
        self.plan = self.derived.plan
        self.rank, self.world_size = self.dist.rank, self.dist.world_size
        self.is_main = self.rank == 0
        self.total_steps = self.derived.run_steps  # optimizer steps this run takes (max_steps included)
        self.sharded = self.derived.sharded  # parameters are FSDP2 DTensors
        self.sync_every_micro = self.config.dist.reduce_every_micro_batch


@dataclasses.dataclass(eq=False)
class Step:
    """What lives for one optimizer step; the engine starts a fresh one at ``before_step``.

    Attributes:
        lr: the base learning rate of this step.
        window_size: micro-batches in this step's window.
        micro_in_window: the current micro-batch's index.
        batch: the current micro-batch (``MixedBatch``) in micro events.
        outputs / loss: the current micro-batch's outputs (``task.forward``: logits for
            classification) and mean loss (``after_forward`` on).
        step_loss: the step's loss so far (mean over the window's micro-batches, detached).
        grad_norms: the per-parameter gradient norms (``GradNorms``), computed at most once
            (``TrainState.compute_grad_norms``), before clipping; ``clip_coef`` set when
            the engine clipped.
        skip_reason: why the optimizer update is skipped, when a hook asked
            (``request_skip``) or the non-finite policy did; None: the update is taken.
        metrics: values hooks publish for the logger this step; tensors are averaged over
            ranks when logged.
        log_record: at a logging step's ``after_step``, the record the logger wrote
            (all-reduced values), for the other sinks to show; None otherwise.
    """

    lr: float
    window_size: int
    micro_in_window: int = 0
    batch: Any = None
    outputs: Any = None
    loss: torch.Tensor | None = None
    step_loss: torch.Tensor | None = None
    grad_norms: GradNorms | None = None
    skip_reason: str | None = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    log_record: dict[str, Any] | None = None

    @property
    def skipped(self) -> bool:
        """Whether this step's optimizer update is skipped."""
        return self.skip_reason is not None

    def request_skip(self, reason: str) -> None:
        """Skip this step's optimizer update (call by ``before_optimizer_step``): the
        counters, the schedule and the data still advance. The first reason is kept."""
        if self.skip_reason is None:
            self.skip_reason = reason


# What the state held before it was grouped by lifetime: old name -> (its place now, a note).
MOVED: dict[str, tuple[str, str]] = {
    **{
        name: (f"state.run.{name}", "")
        for name in (
            "derived plan dist backend model train_model optimizer schedule scaler mixup task run_dir random hooks "
            "extra_models skip_eval_models sync_first_micro sync_every_micro sharded rank world_size is_main total_steps"
        ).split()
    },
    **{
        name: (f"state.current.{name}", "")
        for name in "batch outputs loss step_loss lr window_size micro_in_window grad_norms metrics log_record".split()
    },
    "cfg": ("state.run.config", ""),
    "config": ("state.run.config", "typed and frozen; state.run.config.to_dict() is the plain dict"),
    "accumulation": ("state.run.plan.accumulation", ""),
    "epochs": ("state.run.config.epochs", ""),
    "grad_norm": ("state.current.grad_norms.total", "after state.compute_grad_norms()"),
    "skip_step": ("state.current.skipped", "to skip: state.current.request_skip(reason)"),
    "stop_resumable": ("state.interrupted", ""),
}


def moved_error(name: str) -> AttributeError:
    """The error for a name ``TrainState`` held before it was grouped by lifetime."""
    place, note = MOVED[name]
    return AttributeError(
        f"state.{name} moved to {place}{f' ({note})' if note else ''}: the state is grouped by lifetime "
        "(state.run, state.current, the counters); CHANGELOG.md lists every moved name"
    )


class TrainState:
    """Everything a hook may read, by lifetime (module docstring); hooks write only
    ``current.metrics``, and ask with ``current.request_skip``, ``request_eval`` and
    ``request_stop``.

    Attributes:
        run: what lives for the run (``Run``).
        current: the step being taken (``Step``).
        counters: the counters (``Counters``), also readable one by one (``state.step``).
        eval_metrics: results of the last evaluation.
        last_eval_step: the step the last evaluation ran at (None before one; saved in
            checkpoints, so a resumed run never evaluates one step twice).
        eval_batch: ``(images, labels, outputs)`` of the current evaluation batch, in
            ``after_eval_batch``; None otherwise.
        eval_requested: set by ``request_eval``; the engine evaluates after the current
            ``after_step`` / ``after_epoch`` and clears it.
        data_wait_seconds: time spent waiting for the loader, cumulative.
        hook_times: ``{(hook name, event): [calls, seconds]}`` when the ``hook_timer``
            hook is on (None: the engine does not time hooks).
        stop_reason: why the run ends early, once a hook asked (``request_stop``).

    A name the state held before it was grouped by lifetime (``MOVED``: ``state.run_dir``,
    ``state.metrics``, ...) read or written raises an ``AttributeError`` naming its new place.
    """

    def __init__(self, run: Run) -> None:
        self.run = run
        self.counters = Counters()
        self.current = Step(lr=0.0, window_size=run.plan.accumulation)
        self.eval_metrics: dict[str, float] = {}
        self.last_eval_step: int | None = None
        self.eval_batch: tuple[Any, Any, Any] | None = None
        self.eval_requested = False
        self.data_wait_seconds = 0.0
        self.hook_times: dict[tuple[str, str], list[float]] | None = None
        self.stop_reason: str | None = None
        self._stop_resumable = False

    if not typing.TYPE_CHECKING:  # hidden from the type checker: a name the state lacks stays an error there

        def __getattr__(self, name: str) -> Any:  # called only for names the state lacks
            if name in MOVED:
                raise moved_error(name)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in MOVED:
            raise moved_error(name)
        super().__setattr__(name, value)

    # The counters, read-only.
    step = property(lambda self: self.counters.step)
    micro_step = property(lambda self: self.counters.micro_step)
    samples_seen = property(lambda self: self.counters.samples_seen)
    epoch = property(lambda self: self.counters.epoch)
    step_in_epoch = property(lambda self: self.counters.step_in_epoch)

    @property
    def epoch_number(self) -> int:
        """The 1-based number of the epoch the latest step belongs to (0 before the first),
        as logs and the console show it."""
        return self.epoch + 1 if self.step_in_epoch > 0 else self.epoch

    @property
    def is_log_step(self) -> bool:
        """At ``after_step``: whether this step is logged (every ``log.interval`` and the last)."""
        return self.log_due(self.step)

    def log_due(self, step: int) -> bool:
        """Whether the step that ends with ``step`` completed steps is logged."""
        return step % self.run.config.log.interval == 0 or step >= self.run.total_steps

    @property
    def will_log(self) -> bool:
        """During a step's events before ``after_step``: whether this step will be logged
        (so a hook can ask for statistics only on the steps that show them)."""
        return self.log_due(self.step + 1)

    def compute_grad_norms(self) -> GradNorms:
        """The current gradients' per-parameter L2 norms, computed once per step.

        One ``torch._foreach_norm`` over every gradient (no host sync; sharded gradients:
        over the local slices, then one all-reduce); the first caller in a step pays for
        it and the others, the engine's clipping and non-finite check included, reuse it.
        Call it only once gradients are complete (``before_optimizer_step``); the norms
        are those before clipping.
        """
        if self.current.grad_norms is None:
            named = [(n, p) for n, p in self.run.model.named_parameters() if p.grad is not None]
            grads = [p.grad for _, p in named]
            norms = dtensors.grad_norms(grads) if grads else torch.zeros(0, device=self.run.backend.device)
            self.current.grad_norms = GradNorms([n for n, _ in named], [p for _, p in named], norms)
        return self.current.grad_norms

    def request_eval(self) -> None:
        """Evaluate once the current ``after_step`` (or ``after_epoch``) has run."""
        self.eval_requested = True

    def request_stop(self, reason: str, *, resumable: bool = False) -> None:
        """End the run after the current optimizer step.

        Args:
            reason: shown in the log.
            resumable: the run is interrupted, to be resumed later (preemption): the
                checkpoint hook saves this step, and the end-of-run evaluation and final
                weights are skipped.
        """
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stop_resumable = self._stop_resumable or resumable

    @property
    def should_stop(self) -> bool:
        return self.stop_reason is not None

    @property
    def interrupted(self) -> bool:
        """A resumable stop was requested (see ``request_stop``)."""
        return self._stop_resumable
