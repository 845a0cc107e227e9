"""``TrainState``: what hooks see, grouped by how long it lives. Hooks get the state, never the engine.

* ``state.run`` (``Run``): built once for the run and frozen: the config, the derived
  numbers, the backend, the model, the optimizer, the schedule, the task, the run
  directory, the random streams, the non-finite guard (the objects themselves change
  as they work, a model's weights for one; which objects they are does not).
* ``state.current`` (``Step``): the optimizer step being taken: its window, the current
  micro-batch, its outputs and loss, the gradient norms, a requested skip and the metrics
  hooks publish. The engine starts a fresh one at every step (nothing to reset by hand).
* The counters (``state.step``, ``state.epoch``, ...; ``state.counters`` as one frozen
  ``Counters``): only the engine advances them, by named transitions
  (``advance_micro_step``, ``advance_step``, ``finish_epoch``).
* What lives for the run but changes (the hooks, the models hooks register, the
  evaluation results, a requested stop or evaluation, the time spent waiting for data)
  is the state's own, declared in ``TrainState``.

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
* ``samples_in_epoch``: training samples consumed in the current epoch by all ranks
  together (0 again at ``after_epoch``): the loader's position, which does not depend on
  the world size or on how many micro-batches made each step (``batch_schedule``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import torch

from largebatch import dtensors
from largebatch.backends.base import Backend
from largebatch.batch_schedule import BatchController
from largebatch.batching import BatchPlan
from largebatch.config.derive import Derived
from largebatch.config.sections import Config
from largebatch.data.mixup import MixedBatch, MixupCutmix
from largebatch.dist import DistInfo
from largebatch.engine.hook import Hook
from largebatch.engine.update import NonFiniteGuard
from largebatch.optim.schedules import LRSchedule
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
    samples_in_epoch: int = 0

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


@dataclasses.dataclass(frozen=True, eq=False)
class Run:
    """What lives for the whole run, built once by ``largebatch.launch`` and frozen: no
    field is assigned after it is built (what changes during a run is ``TrainState``'s).

    Attributes:
        config: the resolved config, typed and frozen (``state.run.config.eval.at_end``).
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
        guard: the non-finite check of every update (``largebatch.engine.update``, built
            from the config's ``nan_guard``); checkpoints save its counts.
        batch: the global batch in force (``largebatch.batch_schedule.BatchController``,
            from ``derived.batch_schedule``); checkpoints save it and the adaptive decisions.

    Read from ``derived`` and ``dist`` (properties): ``plan``, ``rank``, ``world_size``,
    ``is_main``, ``total_steps``, ``sharded``.
    """

    config: Config
    derived: Derived
    dist: DistInfo
    backend: Backend
    model: torch.nn.Module
    train_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    scaler: torch.amp.GradScaler | None
    mixup: MixupCutmix
    task: Task
    run_dir: RunDir
    random: RandomStreams
    guard: NonFiniteGuard = dataclasses.field(init=False, repr=False)
    batch: BatchController = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "guard", NonFiniteGuard(self.config.nan_guard))  # frozen: set once, here
        object.__setattr__(self, "batch", BatchController(self.derived.batch_schedule))

    @property
    def plan(self) -> BatchPlan:
        """The batch plan (``derived.plan``)."""
        return self.derived.plan

    @property
    def rank(self) -> int:
        return self.dist.rank

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    @property
    def is_main(self) -> bool:
        """This is rank 0."""
        return self.dist.rank == 0

    @property
    def total_steps(self) -> int:
        """The optimizer steps this run takes (``max_steps`` included)."""
        return self.derived.run_steps

    @property
    def sharded(self) -> bool:
        """The parameters are FSDP2 DTensors (``dist.strategy`` fsdp/hsdp)."""
        return self.derived.sharded


@dataclasses.dataclass(eq=False)
class Step:
    """What lives for one optimizer step; the engine starts a fresh one at ``before_step``.

    Attributes:
        lr: the base learning rate of this step (the schedule's, times ``lr_multiplier``).
        window_size: micro-batches in this step's window.
        global_batch: the global batch in force (``batch_schedule``; the config's
            ``global_batch_size`` when fixed); a window cut by the epoch's end has fewer samples.
        lr_multiplier: the learning-rate rule's factor at ``global_batch`` (1 when fixed).
        samples_before: ``samples_seen`` when the step started.
        criterion: the adaptive batch's criterion value this step (a 0-d tensor the
            ``noise_scale`` hook reports: its smoothed B_simple), or None.
        micro_in_window: the current micro-batch's index.
        batch: the current micro-batch (``MixedBatch``) in micro events.
        outputs / loss: the current micro-batch's outputs (``task.forward``: logits for
            classification) and mean loss (``after_forward`` on). ``outputs`` is typed
            ``Any``: what it is depends on the task, and only the task's ``loss`` and
            metrics read it.
        step_loss: the step's loss so far (mean over the window's micro-batches, detached).
        grad_norms: the per-parameter gradient norms (``GradNorms``), computed at most once
            (``TrainState.compute_grad_norms``), before clipping; ``clip_coef`` set when
            the engine clipped.
        skip_reason: why the optimizer update is skipped, when a hook asked
            (``request_skip``) or the non-finite policy did; None: the update is taken.
        settle: while this step's non-finite check is deferred (``largebatch.engine.update``),
            what reads its outcome; ``skipped`` calls it (a host sync) before answering.
        metrics: values hooks publish for the logger this step; tensors are averaged over
            ranks when logged.
        log_record: at a logging step's ``after_step``, the record the logger wrote
            (all-reduced values), for the other sinks to show; None otherwise.
    """

    lr: float
    window_size: int
    global_batch: int = 0
    lr_multiplier: float = 1.0
    samples_before: int = 0
    criterion: torch.Tensor | None = None
    micro_in_window: int = 0
    batch: MixedBatch | None = None
    outputs: Any = None
    loss: torch.Tensor | None = None
    step_loss: torch.Tensor | None = None
    grad_norms: GradNorms | None = None
    skip_reason: str | None = None
    settle: Callable[[], None] | None = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    log_record: dict[str, Any] | None = None

    @property
    def skipped(self) -> bool:
        """Whether this step's optimizer update is skipped (settling a deferred non-finite
        check first: a host sync, on the steps where a hook asks)."""
        if self.settle is not None:
            self.settle()
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
            "derived plan dist backend model train_model optimizer schedule scaler mixup task run_dir random "
            "sharded rank world_size is_main total_steps"
        ).split()
    },
    **{
        name: (f"state.current.{name}", "")
        for name in "batch outputs loss step_loss lr window_size micro_in_window grad_norms metrics log_record".split()
    },
    "cfg": ("state.run.config", ""),
    "config": ("state.run.config", "typed and frozen: read its sections, state.run.config.optimizer.lr"),
    "accumulation": ("state.run.plan.accumulation", ""),
    "epochs": ("state.run.config.epochs", ""),
    "sync_every_micro": ("state.run.config.dist.reduce_every_micro_batch", ""),
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


@dataclasses.dataclass(eq=False)
class TrainState:
    """Everything a hook may read, by lifetime (module docstring); hooks write only
    ``current.metrics`` and, in ``after_eval``, ``add_eval_metrics``, and ask with
    ``current.request_skip``, ``request_eval``, ``request_stop``, ``register_model`` and
    ``request_first_micro_sync``.

    Attributes:
        run: what lives for the run (``Run``, frozen).
        counters: the counters (``Counters``), also readable one by one (``state.step``);
            advanced by the engine only (``advance_micro_step``, ``advance_step``,
            ``finish_epoch``) and restored from checkpoints (``restore``).
        current: the step being taken (``Step``); the engine starts a fresh one each step.
        hooks: the run's hooks in firing order (set by the engine); checkpoints save and
            restore each one's ``state_dict``.
        extra_models: models kept beside the trained one, by name (the ``ema`` hook's
            ``'ema'``), registered by hooks in ``before_run`` (``register_model``): each
            is evaluated after the model with the same task and loader (metrics
            ``eval_<name>/...``) unless its name is in ``skip_eval_models``, and written at
            the end of the run as ``model_<name>.safetensors``.
        skip_eval_models: names of ``extra_models`` the evaluation leaves out.
        sync_first_micro: under ``dist.strategy`` fsdp/hsdp, reduce the gradients after
            each window's first micro-batch too (``request_first_micro_sync``).
        eval_metrics: results of the last evaluation, set by the engine
            (``record_eval``); hooks add theirs in ``after_eval`` (``add_eval_metrics``).
        last_eval_step: the step the last evaluation ran at (None before one; set with
            ``eval_metrics``, saved in checkpoints and restored with the counters, so a
            resumed run never evaluates one step twice).
        eval_batch: ``(images, labels, outputs)`` of the current evaluation batch, in
            ``after_eval_batch``; None otherwise.
        eval_requested: set by ``request_eval``; the engine evaluates after the current
            ``after_step`` / ``after_epoch`` and clears it.
        data_wait_seconds: time spent waiting for the loader, cumulative.
        hook_times: ``{(hook name, event): [calls, seconds]}`` when the ``hook_timer``
            hook is on (None: the engine does not time hooks).
        stop_reason: why the run ends early, once a hook asked (``request_stop``).
        interrupted: a resumable stop was requested (``request_stop(..., resumable=True)``).

    A name the state held before it was grouped by lifetime (``MOVED``: ``state.run_dir``,
    ``state.metrics``, ...) read or written raises an ``AttributeError`` naming its new place.
    """

    run: Run
    counters: Counters = dataclasses.field(default_factory=Counters)
    current: Step = dataclasses.field(init=False)
    hooks: list[Hook] = dataclasses.field(default_factory=list)
    extra_models: dict[str, torch.nn.Module] = dataclasses.field(default_factory=dict)
    skip_eval_models: set[str] = dataclasses.field(default_factory=set)
    sync_first_micro: bool = False
    eval_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    last_eval_step: int | None = None
    eval_batch: tuple[torch.Tensor, torch.Tensor, Any] | None = None  # outputs: the task's (``Step.outputs``)
    eval_requested: bool = False
    data_wait_seconds: float = 0.0
    hook_times: dict[tuple[str, str], list[float]] | None = None
    stop_reason: str | None = None
    interrupted: bool = False

    def __post_init__(self) -> None:
        self.current = Step(lr=0.0, window_size=self.run.plan.accumulation)

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
    samples_in_epoch = property(lambda self: self.counters.samples_in_epoch)

    # The counters' transitions: the engine's only (``restore``: a resume's).
    def advance_micro_step(self, samples: int) -> None:
        """A forward/backward pass is done: ``samples`` more samples over all ranks."""
        c = self.counters
        self.counters = dataclasses.replace(
            c, micro_step=c.micro_step + 1, samples_seen=c.samples_seen + samples, samples_in_epoch=c.samples_in_epoch + samples
        )

    def advance_step(self) -> None:
        """An optimizer step is done (taken or skipped)."""
        self.counters = dataclasses.replace(self.counters, step=self.counters.step + 1, step_in_epoch=self.counters.step_in_epoch + 1)

    def finish_epoch(self) -> None:
        """An epoch is done: the next one starts at its first step."""
        self.counters = dataclasses.replace(self.counters, epoch=self.counters.epoch + 1, step_in_epoch=0, samples_in_epoch=0)

    def restore(self, counters: dict[str, int], last_eval_step: int | None) -> None:
        """Resume where a checkpoint left off: its counters (``Counters.state_dict``) and
        the step of its last evaluation (``largebatch.checkpoint.load_checkpoint``)."""
        self.counters = Counters.from_state_dict(counters)
        self.last_eval_step = last_eval_step

    # The evaluation's transitions.
    def record_eval(self, metrics: dict[str, float]) -> None:
        """An evaluation ran at this step (the engine's): its results are ``eval_metrics``."""
        self.eval_metrics = metrics
        self.last_eval_step = self.step

    def add_eval_metrics(self, metrics: dict[str, float]) -> None:
        """Add values to the last evaluation's results (call in ``after_eval``): the hooks
        after this one (the logger, the sinks) show them with the evaluation's."""
        self.eval_metrics = {**self.eval_metrics, **metrics}

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

    def steps_reached(self, interval: int) -> bool:
        """At ``after_step``: whether the step just taken reached a multiple of ``interval``
        steps at the config's global batch, i.e. crossed a multiple of ``interval x
        global_batch_size`` samples (``batch_schedule`` fixed: ``step % interval == 0``).
        Intervals given in steps (``checkpoint.interval_steps``, the ``eval`` hook's) mean this."""
        if self.run.batch.schedule.fixed:
            return self.step % interval == 0
        every = interval * self.run.config.global_batch_size
        return self.samples_seen // every > self.current.samples_before // every

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
            grads = [p.grad for _, p in named if p.grad is not None]  # all of them: the filter above
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
        self.interrupted = self.interrupted or resumable

    @property
    def should_stop(self) -> bool:
        return self.stop_reason is not None

    def register_model(self, name: str, model: torch.nn.Module, *, evaluate: bool = True) -> None:
        """Keep ``model`` beside the trained one as ``extra_models[name]`` (call in
        ``before_run``): evaluated as ``eval_<name>/...`` unless ``evaluate`` is False, and
        written at the end of the run as ``model_<name>.safetensors``."""
        self.extra_models[name] = model
        if not evaluate:
            self.skip_eval_models.add(name)

    def request_first_micro_sync(self) -> None:
        """Under fsdp/hsdp, reduce the gradients after each window's first micro-batch
        too (call in ``before_run``, from a hook that reads that micro-batch's gradient:
        sharded gradients exist only once reduced)."""
        self.sync_first_micro = True
