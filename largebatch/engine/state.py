"""``TrainState``: what hooks see. Hooks get the state, never the engine.

Counters are named by their unit and only the engine advances them (the public
attributes are read-only properties):

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
import pathlib
from typing import Any

import torch

from largebatch.batching import BatchPlan
from largebatch.config.typed import Config, typed
from largebatch.dist import DistInfo
from largebatch.optim import sharded
from largebatch.randomness import RandomStreams
from largebatch.tasks import ClassificationTask, Task


@dataclasses.dataclass
class Counters:
    step: int = 0
    micro_step: int = 0
    samples_seen: int = 0
    epoch: int = 0
    step_in_epoch: int = 0

    def state_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict[str, int]) -> None:
        for key, value in state.items():
            setattr(self, key, int(value))


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


class TrainState:
    """Everything a hook may read (and ``metrics`` / ``request_stop`` to write).

    Attributes:
        cfg: the validated config, typed and frozen (``largebatch.config.typed``):
            ``state.cfg.eval.at_end``; what the engine and new hooks read.
        config: the same config as the plain nested dict ``validate`` returns
            (``cfg.to_dict()``): ``state.config["eval"]["at_end"]``, for hooks written
            against dicts; checkpoints save and compare this form.
        derived: the derived numbers (``largebatch.config.derive``).
        plan: the batch arithmetic.
        dist: rank, world size, local rank.
        backend: the device backend.
        model: the model being trained (unwrapped; its ``state_dict`` is the weights).
        train_model: what the forward pass calls (the DDP wrapper when distributed).
        optimizer, schedule, scaler, mixup: as built from the config (scaler may be None).
        task: the objective (``largebatch.tasks``): forward, loss, train and eval
            metrics (default: ``ClassificationTask``).
        run_dir: the run directory.
        random: the run's random streams (``largebatch.randomness``); the engine reseeds
            the model's generators from it before every forward pass.
        batch: the current micro-batch (``MixedBatch``) in micro events.
        outputs / loss: the current micro-batch's outputs (``task.forward``: logits for
            classification) and mean loss (``after_forward`` on).
        window_size / micro_in_window: micro-batches in this step's window, and the
            current one's index.
        step_loss: the step's loss so far (mean over the window's micro-batches, detached).
        lr: the base learning rate of the current (or, after it, the last) step.
        grad_norm: the global gradient norm before clipping, when clipping computed it.
        grad_norms: this step's per-parameter gradient norms (``GradNorms``), computed at
            most once per step by ``compute_grad_norms`` and shared by clipping, the NaN
            guard and the gradient-norm hook (None until a hook asks).
        log_record: at a logging step's ``after_step``, the record the logger wrote
            (all-reduced values), for the other sinks to show; None otherwise.
        eval_requested: set by ``request_eval``; the engine evaluates after the current
            ``after_step`` / ``after_epoch`` and clears it.
        hook_times: ``{(hook name, event): [calls, seconds]}`` when the ``hook_timer``
            hook is on (None: the engine does not time hooks).
        metrics: values hooks publish for the logger this step (cleared each step);
            tensors are averaged over ranks when logged.
        eval_metrics: results of the last evaluation.
        data_wait_seconds: time spent waiting for the loader, cumulative.
        skip_step: set in ``before_optimizer_step`` to skip this optimizer update.
        sync_first_micro: under ``dist.strategy`` fsdp/hsdp, reduce the gradients after
            each window's first micro-batch too (set in ``before_run`` by a hook that
            reads that micro-batch's gradient: sharded gradients exist only once reduced).
        hooks: the run's hooks in firing order (set by the engine); checkpoints save
            and restore each one's ``state_dict``.
        sync_every_micro: under fsdp/hsdp, reduce after every micro-batch
            (``dist.reduce_every_micro_batch``).
        sharded: whether the model's parameters are sharded (FSDP2 DTensors).
        extra_models: models kept beside the trained one, by name (the ``ema`` hook's
            ``'ema'``), registered by hooks in ``before_run``: each is evaluated after the
            model with the same task and loader (metrics ``eval_<name>/...``, merged into
            ``eval_metrics``) unless its name is in ``skip_eval_models``, and written at
            the end of the run as ``model_<name>.safetensors``.
        skip_eval_models: names in ``extra_models`` that evaluation leaves out.
    """

    def __init__(
        self,
        *,
        config: Config | dict[str, Any],
        derived: dict[str, Any],
        plan: BatchPlan,
        dist: DistInfo,
        backend: Any,
        model: torch.nn.Module,
        train_model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        schedule: Any,
        scaler: torch.amp.GradScaler | None,
        mixup: Any,
        run_dir: pathlib.Path,
        random: RandomStreams | None = None,
        task: Task | None = None,
    ) -> None:
        self.cfg = typed(config)
        self.config = self.cfg.to_dict()
        self.derived = derived
        self.plan = plan
        self.dist = dist
        self.backend = backend
        self.model = model
        self.train_model = train_model
        self.optimizer = optimizer
        self.schedule = schedule
        self.scaler = scaler
        self.mixup = mixup
        self.task = task if task is not None else ClassificationTask()
        self.run_dir = run_dir
        self.random = random or RandomStreams(self.cfg.seed, dist.rank, backend)
        self._counters = Counters()
        self.batch = None
        self.outputs: Any = None
        self.loss: torch.Tensor | None = None
        self.window_size = plan.accumulation
        self.micro_in_window = 0
        self.step_loss: torch.Tensor | None = None
        self.lr = 0.0
        self.grad_norm: torch.Tensor | None = None
        self.metrics: dict[str, Any] = {}
        self.eval_metrics: dict[str, float] = {}
        self.eval_batch = None
        self.data_wait_seconds = 0.0
        self.skip_step = False
        self.grad_norms: GradNorms | None = None
        self.log_record: dict[str, Any] | None = None
        self.hook_times: dict[tuple[str, str], list[float]] | None = None
        self.eval_requested = False
        self.stop_reason: str | None = None
        self.stop_resumable = False
        self.sync_first_micro = False
        self.hooks: list[Any] = []
        self.sync_every_micro = self.cfg.dist.reduce_every_micro_batch
        self.sharded = derived.get("strategy", "ddp") != "ddp" and dist.world_size > 1
        self.extra_models: dict[str, torch.nn.Module] = {}
        self.skip_eval_models: set[str] = set()

    # Counters, read-only for hooks.
    step = property(lambda self: self._counters.step)
    micro_step = property(lambda self: self._counters.micro_step)
    samples_seen = property(lambda self: self._counters.samples_seen)
    epoch = property(lambda self: self._counters.epoch)
    step_in_epoch = property(lambda self: self._counters.step_in_epoch)

    @property
    def rank(self) -> int:
        return self.dist.rank

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    @property
    def is_main(self) -> bool:
        return self.dist.rank == 0

    @property
    def accumulation(self) -> int:
        return self.plan.accumulation

    @property
    def epochs(self) -> int:
        return self.cfg.epochs

    @property
    def total_steps(self) -> int:
        """Optimizer steps this run takes (``max_steps`` included)."""
        max_steps = self.cfg.max_steps
        total = self.derived["total_steps"]
        return min(total, max_steps) if max_steps else total

    @property
    def is_log_step(self) -> bool:
        """At ``after_step``: whether this step is logged (every ``log.interval`` and the last)."""
        return self.log_due(self.step)

    def log_due(self, step: int) -> bool:
        """Whether the step that ends with ``step`` completed steps is logged."""
        return step % self.cfg.log.interval == 0 or step >= self.total_steps

    @property
    def will_log(self) -> bool:
        """During a step's events before ``after_step``: whether this step will be logged
        (so a hook can ask for statistics only on the steps that show them)."""
        return self.log_due(self.step + 1)

    def compute_grad_norms(self) -> GradNorms:
        """The current gradients' per-parameter L2 norms, computed once per step.

        One ``torch._foreach_norm`` over every gradient (no host sync; sharded gradients:
        over the local slices, then one all-reduce); the first caller in a step pays for
        it and the others reuse it. Call it only once gradients are complete
        (``before_optimizer_step``); the norms are those before clipping.
        """
        if self.grad_norms is None:
            named = [(n, p) for n, p in self.model.named_parameters() if p.grad is not None]
            grads = [p.grad for _, p in named]
            norms = sharded.grad_norms(grads) if grads else torch.zeros(0, device=self.backend.device)
            self.grad_norms = GradNorms([n for n, _ in named], [p for _, p in named], norms)
        return self.grad_norms

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
        self.stop_resumable = self.stop_resumable or resumable

    @property
    def should_stop(self) -> bool:
        return self.stop_reason is not None

    @property
    def interrupted(self) -> bool:
        """A resumable stop was requested (see ``request_stop``)."""
        return self.stop_resumable
