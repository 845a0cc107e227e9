"""The training loop. Short on purpose: everything optional is a hook.

The loop's shape and its events are documented in ``largebatch.engine.events``; the
gradient-accumulation rules in ``largebatch.engine.accumulation``. What is computed on
a batch (forward, loss, metrics) is the task's (``state.task``, ``largebatch.tasks``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from largebatch.data.base import Loader
from largebatch.engine.accumulation import micro_loss_weight, sync_context
from largebatch.engine.events import Event
from largebatch.engine.hook import Hook, HookError
from largebatch.engine.state import TrainState
from largebatch.errors import UserError


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
        state.hooks = self.hooks  # what a checkpoint saves besides the state itself
        self.train_loader = train_loader
        self.eval_loader = eval_loader
        self._by_event = {event: [h for h in self.hooks if h.overrides(event)] for event in Event}
        self._last_eval_step: int | None = None

    def fire(self, event: Event) -> None:
        """Call every hook that implements ``event``, in priority order (timing each one
        when ``state.hook_times`` is set, see the ``hook_timer`` hook)."""
        for hook in self._by_event[event]:
            times = self.state.hook_times
            start = time.perf_counter() if times is not None else 0.0
            try:
                getattr(hook, event.value)(self.state)
            except Exception as exc:
                detail = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"  # a user's mistake speaks for itself
                raise HookError(f"hook {hook.name} failed in {event.value}: {detail}") from exc
            if times is not None:
                entry = times.setdefault((hook.name, event.value), [0, 0.0])
                entry[0] += 1
                entry[1] += time.perf_counter() - start

    def run(self) -> None:
        """Train for the configured epochs (or until a hook requests a stop), then evaluate."""
        state, counters = self.state, self.state._counters
        try:
            self.fire(Event.BEFORE_RUN)
            self.fire(Event.BEFORE_TRAIN)
            state.schedule.apply(state.optimizer, state.step)
            state.lr = state.schedule.lr_at(state.step)
            while counters.epoch < state.epochs and not self._done():
                self.train_loader.set_epoch(counters.epoch)
                self.fire(Event.BEFORE_EPOCH)
                self._train_epoch()
                if counters.step_in_epoch < state.plan.steps_per_epoch:
                    break  # stopped mid-epoch
                counters.epoch += 1
                counters.step_in_epoch = 0
                self.fire(Event.AFTER_EPOCH)
                interval = state.cfg.eval.interval_epochs
                if interval > 0 and counters.epoch % interval == 0:
                    state.request_eval()
                self._eval_if_requested()
            if state.cfg.eval.at_end and self._last_eval_step != state.step and not state.interrupted:
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

    def _eval_if_requested(self) -> None:
        state = self.state
        if state.eval_requested and not state.interrupted and self._last_eval_step != state.step:
            self.evaluate()
        state.eval_requested = False

    def _done(self) -> bool:
        return self.state.should_stop or self.state.step >= self.state.total_steps

    def _train_epoch(self) -> None:
        state = self.state
        batches = iter(self.train_loader)
        for window in state.plan.window_sizes()[state.step_in_epoch :]:
            if self._done():
                return
            self._train_step(batches, window)

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

    def _train_step(self, batches: Iterator, window: int) -> None:
        state, counters = self.state, self.state._counters
        state.optimizer.zero_grad(set_to_none=True)
        state.metrics = {}
        state.skip_step = False
        state.grad_norm = None
        state.grad_norms = None
        state.log_record = None
        state.window_size = window
        state.step_loss = None
        self.fire(Event.BEFORE_STEP)
        for micro in range(window):
            state.micro_in_window = micro
            images, labels = self._next_batch(batches)
            state.batch = state.mixup(images, labels, rng=state.random.mixup_generator(state.step, micro))
            self.fire(Event.BEFORE_MICRO_STEP)
            with sync_context(state.train_model, micro, window, sync_first=state.sync_first_micro, sync_all=state.sync_every_micro):
                state.random.seed_forward(state.step, micro)  # dropout: a function of (seed, rank, step, micro)
                with state.backend.autocast():
                    state.outputs = state.task.forward(state.train_model, state.batch.images)
                    state.loss = state.task.loss(state.outputs, state.batch)
                self.fire(Event.AFTER_FORWARD)
                scaled = state.loss * micro_loss_weight(window)
                (state.scaler.scale(scaled) if state.scaler else scaled).backward()
            state.backend.after_backward()
            detached = state.loss.detach() * micro_loss_weight(window)
            state.step_loss = detached if state.step_loss is None else state.step_loss + detached
            counters.micro_step += 1
            counters.samples_seen += images.shape[0] * state.world_size
            self.fire(Event.AFTER_BACKWARD)
        if state.scaler:
            state.scaler.unscale_(state.optimizer)
        self.fire(Event.BEFORE_OPTIMIZER_STEP)
        if not state.skip_step:
            if state.scaler:
                state.scaler.step(state.optimizer)
            else:
                state.optimizer.step()
        if state.scaler:
            state.scaler.update()
        state.backend.after_optimizer_step()
        state.schedule.apply(state.optimizer, state.step + 1)
        self.fire(Event.AFTER_OPTIMIZER_STEP)
        counters.step += 1
        counters.step_in_epoch += 1
        self.fire(Event.AFTER_STEP)
        state.lr = state.schedule.lr_at(state.step)
        self._eval_if_requested()

    def evaluate(self) -> dict[str, float]:
        """The task's metrics over the evaluation split (every sample once across ranks;
        classification: ``eval/loss``, ``eval/top1``, ``eval/top5``), then those of each
        of ``state.extra_models`` as ``eval_<name>/...`` (``after_eval_batch`` fires for
        the model's batches only)."""
        state = self.state
        if self.eval_loader is None:
            return {}
        self.fire(Event.BEFORE_EVAL)

        def after_batch(images: torch.Tensor, labels: torch.Tensor, outputs: Any) -> None:
            state.eval_batch = (images, labels, outputs)
            self.fire(Event.AFTER_EVAL_BATCH)

        try:
            metrics = state.task.evaluate(state.model, self.eval_loader, state.backend, prefix="eval", on_batch=after_batch)
        finally:
            state.eval_batch = None
        for name, model in state.extra_models.items():
            if name not in state.skip_eval_models:
                metrics.update(state.task.evaluate(model, self.eval_loader, state.backend, prefix=f"eval_{name}"))
        state.eval_metrics = metrics
        self._last_eval_step = state.step
        self.fire(Event.AFTER_EVAL)
        return state.eval_metrics
