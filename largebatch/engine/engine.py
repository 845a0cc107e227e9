"""The training loop. Short on purpose: everything optional is a hook.

The loop's shape and its events are documented in ``largebatch.engine.events``; the
gradient-accumulation rules in ``largebatch.engine.accumulation``; what every update does
(unscale, non-finite check, clip, step) in ``largebatch.engine.update``. What is computed
on a batch (forward, loss, metrics) is the task's (``state.run.task``, ``largebatch.tasks``).
How many micro-batches form each step, and the learning rate that goes with the batch,
follow ``state.run.batch`` (``largebatch.batch_schedule``): each step's window is the
accumulation of the batch in force, cut at the epoch's end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from largebatch.batch_schedule import apply_weight_decay
from largebatch.data.base import Loader
from largebatch.dist import any_rank
from largebatch.engine.accumulation import micro_loss_weight, sync_context
from largebatch.engine.branch_fork import BranchCriterion
from largebatch.engine.events import Event
from largebatch.engine.hook import Hook, HookError
from largebatch.engine.state import Step, TrainState
from largebatch.engine.update import NonFiniteError, take_update


class Engine:
    """Runs training (and evaluation) for a ``TrainState``, firing hooks at each event.

    Args:
        state: the run's state, built by ``largebatch.launch``.
        hooks: hooks to fire; sorted by priority (stable: equal priorities keep order).
        train_loader: yields this rank's micro-batches (the ``largebatch.data.base.Loader`` contract).
        eval_loader: the evaluation loader, or None.
        finish: called on every rank between ``after_train`` and ``after_run`` when the run
            was not interrupted (``largebatch.launch`` writes the final weights there, so
            ``after_run`` hooks such as the trackers find them).
    """

    def __init__(
        self,
        state: TrainState,
        hooks: list[Hook],
        train_loader: Loader,
        eval_loader: Loader | None = None,
        finish: Callable[[TrainState], None] | None = None,
    ) -> None:
        self.state = state
        self.finish = finish
        self.hooks = sorted(hooks, key=lambda h: h.priority)
        state.hooks = self.hooks  # what a checkpoint saves besides the counters and the run
        self.train_loader = train_loader
        self.eval_loader = eval_loader
        self._by_event = {event: [h for h in self.hooks if h.overrides(event)] for event in Event}
        schedule = state.run.batch.schedule
        # the adaptive batch's 'branch' criterion: its loaders, built (and checked) before training starts
        self._branch = BranchCriterion(state) if schedule.type == "adaptive" and schedule.criterion == "branch" else None

    def fire(self, event: Event) -> None:
        """Call every hook that implements ``event``, in priority order (timing each one
        when ``state.hook_times`` is set, see the ``hook_timer`` hook)."""
        for hook in self._by_event[event]:
            times = self.state.hook_times
            start = time.perf_counter() if times is not None else 0.0
            try:
                getattr(hook, event.value)(self.state)
            except NonFiniteError:
                raise  # the guard's, settled where the hook asked for the step's outcome: not the hook's fault
            except Exception as exc:
                raise HookError(hook, event, exc) from exc
            if times is not None:
                entry = times.setdefault((hook.name, event.value), [0, 0.0])
                entry[0] += 1
                entry[1] += time.perf_counter() - start

    def run(self) -> None:
        """Train for the configured epochs (or until a hook requests a stop), then evaluate."""
        state, run = self.state, self.state.run
        try:
            self.fire(Event.BEFORE_RUN)
            self.fire(Event.BEFORE_TRAIN)
            self._set_rates(*self._plan_step(state.step))
            while state.epoch < run.config.epochs and not self._done():
                self.train_loader.set_epoch(state.epoch)
                self.fire(Event.BEFORE_EPOCH)
                self._train_epoch()
                if self._micro_in_epoch() < run.plan.micro_batches_per_epoch:
                    break  # stopped mid-epoch
                state.finish_epoch()
                self.fire(Event.AFTER_EPOCH)
                interval = run.config.eval.interval_epochs
                if interval > 0 and state.epoch % interval == 0:
                    state.request_eval()
                self._eval_if_requested()
            run.guard.settle()  # the last step's deferred non-finite check
            if run.config.eval.at_end and state.last_eval_step != state.step and not state.interrupted:
                self.evaluate()
            self.fire(Event.AFTER_TRAIN)
            if self.finish is not None and not state.interrupted:
                self.finish(state)
            self.fire(Event.AFTER_RUN)
        except BaseException as exc:
            for hook in self._by_event[Event.ON_EXCEPTION]:
                try:
                    hook.on_exception(state, exc)
                except Exception as hook_exc:  # noqa: BLE001 - the original error matters more
                    exc.add_note(f"hook {hook.name} also failed in on_exception: {hook_exc!r}")
            raise

    def close(self) -> None:
        """Release the loaders' workers, pipelines and temporary files."""
        for loader in (self.train_loader, self.eval_loader):
            close = getattr(loader, "close", None)
            if close is not None:
                close()
        if self._branch is not None:
            self._branch.close()

    def _eval_if_requested(self) -> None:
        state = self.state
        if state.eval_requested and not state.interrupted and state.last_eval_step != state.step:
            self.evaluate()
        state.eval_requested = False

    def _done(self) -> bool:
        return self.state.should_stop or self.state.step >= self.state.run.total_steps

    def _micro_in_epoch(self) -> int:
        """Micro-batches this rank has run in the current epoch (from samples: the same at any world size)."""
        return self.state.samples_in_epoch // self.state.run.batch.schedule.unit

    def _plan_step(self, step: int) -> tuple[int, int, float]:
        """``(global batch, window, lr)`` of optimizer step ``step``, which starts at the
        current counters: the batch in force, its accumulation cut at the epoch's end, and
        the schedule's rate at the samples seen (``position``) times the batch's multiplier."""
        state, run = self.state, self.state.run
        schedule, per_epoch = run.batch.schedule, run.plan.micro_batches_per_epoch
        batch = run.batch.batch_for(state.samples_seen)
        left = per_epoch - self._micro_in_epoch()
        window = min(schedule.accumulation(batch), left if left > 0 else per_epoch)
        start = schedule.position(state.samples_seen, step)
        end = schedule.position(state.samples_seen + window * schedule.unit, step + 1)
        return batch, window, run.schedule.lr_between(start, end) * run.batch.lr_multiplier(batch)

    def _set_rates(self, batch: int, window: int, lr: float) -> None:
        run = self.state.run
        run.schedule.set_lr(run.optimizer, lr)
        if run.batch.schedule.keep_wd_timescale:
            apply_weight_decay(run.optimizer, run.batch.weight_decay_multiplier(batch))

    def _train_epoch(self) -> None:
        batches = iter(self.train_loader)
        while self._micro_in_epoch() < self.state.run.plan.micro_batches_per_epoch:
            if self._done():
                return
            self._train_step(batches)

    def _next_batch(self, batches: Iterator) -> tuple[torch.Tensor, torch.Tensor]:
        start = time.perf_counter()
        try:
            images, labels = next(batches)
        except StopIteration:
            raise RuntimeError(
                f"the training loader ended early in epoch {self.state.epoch}: it promised {len(self.train_loader)} micro-batches per epoch"
            ) from None
        self.state.data_wait_seconds += time.perf_counter() - start
        return images, labels

    def _train_step(self, batches: Iterator) -> None:
        state, run = self.state, self.state.run
        run.optimizer.zero_grad(set_to_none=True)
        batch, window, lr = self._plan_step(state.step)
        schedule = run.batch.schedule
        state.current = step = Step(
            lr=lr, window_size=window, global_batch=batch, lr_multiplier=run.batch.lr_multiplier(batch), samples_before=state.samples_seen
        )
        if not schedule.fixed:
            step.metrics.update(
                {"batch/global": batch, "batch/accumulation": schedule.accumulation(batch), "batch/lr_multiplier": step.lr_multiplier}
            )
            if schedule.type == "adaptive":
                step.metrics["batch/criterion"] = run.batch.criterion
        self.fire(Event.BEFORE_STEP)
        sync_all = run.config.dist.reduce_every_micro_batch  # fsdp/hsdp: reduce after every micro-batch
        for micro in range(window):
            step.micro_in_window = micro
            images, labels = self._next_batch(batches)
            step.batch = run.mixup(images, labels, rng=run.random.mixup_generator(state.step, micro))
            self.fire(Event.BEFORE_MICRO_STEP)
            with sync_context(run.train_model, micro, window, sync_first=state.sync_first_micro, sync_all=sync_all):
                run.random.seed_forward(state.step, micro)  # dropout: a function of (seed, rank, step, micro)
                with run.backend.autocast():
                    step.outputs = run.task.forward(run.train_model, step.batch.images)
                    step.loss = run.task.loss(step.outputs, step.batch)
                self.fire(Event.AFTER_FORWARD)
                scaled = step.loss * micro_loss_weight(window)
                (run.scaler.scale(scaled) if run.scaler else scaled).backward()
            run.backend.after_backward()
            detached = step.loss.detach() * micro_loss_weight(window)
            step.step_loss = detached if step.step_loss is None else step.step_loss + detached
            state.advance_micro_step(images.shape[0] * run.world_size)
            self.fire(Event.AFTER_BACKWARD)
        take_update(state, lambda: self.fire(Event.BEFORE_OPTIMIZER_STEP))
        run.backend.after_optimizer_step()
        self._check_batch(step)
        self._set_rates(*self._plan_step(state.step + 1))  # the next step's: a batch change happens only here
        self.fire(Event.AFTER_OPTIMIZER_STEP)
        state.advance_step()
        run.guard.publish(state)
        self.fire(Event.AFTER_STEP)
        self._eval_if_requested()

    def _check_batch(self, step: Step) -> None:
        """Adaptive batch: at a check (the samples crossed a multiple of
        ``check_every_samples``), the criterion decides whether the next step's batch doubles
        (``branch``: forks from the state after this step, ``largebatch.engine.branch_fork``)."""
        state, controller = self.state, self.state.run.batch
        if not controller.check_due(step.samples_before, state.samples_seen):
            return
        value, efficient = float(step.criterion) if step.criterion is not None else float("nan"), None
        if self._branch is not None and 2 * controller.batch <= controller.schedule.batches[-1]:
            every = controller.schedule.check_every_samples
            value, efficient = self._branch.measure(state, state.samples_seen // every)
        controller.decide(value, lambda grow: any_rank(grow, state.run.backend.device), state.samples_seen, state.step + 1, efficient)
        step.metrics["batch/criterion"] = controller.criterion

    def evaluate(self) -> dict[str, float]:
        """The task's metrics over the evaluation split (every sample once across ranks;
        classification: ``eval/loss``, ``eval/top1``, ``eval/top5``), then those of each
        of ``state.extra_models`` as ``eval_<name>/...`` (``after_eval_batch`` fires for
        the model's batches only)."""
        state, run = self.state, self.state.run
        if self.eval_loader is None:
            return {}
        run.guard.settle()  # a step that stops the run is not evaluated
        self.fire(Event.BEFORE_EVAL)

        def after_batch(images: torch.Tensor, labels: torch.Tensor, outputs: Any) -> None:
            state.eval_batch = (images, labels, outputs)
            self.fire(Event.AFTER_EVAL_BATCH)

        try:
            metrics = run.task.evaluate(run.model, self.eval_loader, run.backend, prefix="eval", on_batch=after_batch)
        finally:
            state.eval_batch = None
        for name, model in state.extra_models.items():
            if name not in state.skip_eval_models:
                metrics.update(run.task.evaluate(model, self.eval_loader, run.backend, prefix=f"eval_{name}"))
        state.record_eval(metrics)
        self.fire(Event.AFTER_EVAL)
        return state.eval_metrics
