"""The hook a study adds to every trial: evaluations placed for steps to target, and the stop.

A trial is evaluated on a coarse geometric grid of steps (each step ``coarse`` times the
last, from ``first_fraction`` of the run). Steps to target need the crossing finer than
that, and two ways give it:

* **Refining** (``refine``, one process): between two evaluations the hook keeps a copy
  of the weights at every step of a fine grid (each ``fine`` times the last, at least one
  step apart; copies on the CPU). When an evaluation finds a target reached on a split
  where the one before had not, every kept copy in between is evaluated, so the bracket
  around the first crossing (``largebatch.study.target``) is one fine step wide whatever
  the curve does inside it: held-out curves dip (a value above the target, then one below
  it, then above again), and a bisection, which assumes a curve that only rises, can find
  a later crossing than the first. That costs every kept step of one coarse interval per
  target (about log(coarse) / log(fine), 9 with the defaults), and no evaluations elsewhere.
  Those evaluations go to ``study_trial.json`` (``refined``), not to the run's metrics.
* **A dense grid** (several processes, or ``refine=False``): once the held-out (or test)
  value is within ``dense_within`` of the next target, or the last two evaluations,
  extended along log(step), would reach it by the next coarse step, the grid itself turns
  fine. A curve that jumps past the target between two coarse evaluations keeps the coarse
  bracket; the study's report states the resolution reached.

Several targets (values of one metric, ``targets``, easiest first) are watched at once; the
run goes on until the last.

It stops the run (an ordinary end: exit status 0) when:

* every split it watches reached the last target (``stop_at_target``): the held-out split,
  and the test split when ``test_split`` is given (its values are added to each
  evaluation's record as ``test/<metric>``, ``test/loss``);
* ``stop_after`` gives, per target, a step by which the held-out value must have reached
  it (evaluated there), and every target is either reached or past its step: the trial
  can no longer reach any target in fewer steps than the cell's best so far for it, so it
  cannot become the cell's choice for any (an exact cut, not a guess).

What happened is written to ``study_trial.json`` in the run directory: the reason it
stopped (``target``, ``beaten``, ``budget``, ``diverged``), the steps run, the budget, the
refining evaluations (``[step, held-out value, test value, held-out loss]``), the
thread count torch ran with and the
process's CPU seconds (the trial's cost on an idle machine, whatever else runs).
A run that diverges (``nan_guard``'s ``NonFiniteError``) is recorded as diverged there
before the error ends the process.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any

import torch

from largebatch.engine.hook import Hook, Priority

OUTCOME = "study_trial.json"


def next_eval_step(step: int, ratio: float) -> int:
    """The step after ``step`` on a grid of ratio ``ratio``: at least one step later."""
    return max(step + 1, math.ceil(step * ratio - 1e-9))


class TargetEvalHook(Hook):
    """Evaluate for steps to targets; stop at the last target, or when beaten.

    Args:
        metric: the task's metric (``top1``: ``eval/top1``).
        targets: the values to reach (one number, or several: the run goes on to the last).
        mode: ``max`` (reach at least a target) or ``min`` (at most).
        test_split: shard prefix of a split evaluated beside the held-out one and reported
            as ``test/...`` (None: none).
        coarse, fine: ratios between evaluation steps away from and near the target.
        dense_within: how close to a target (in the metric's units) the fine grid starts.
        first_fraction: the first evaluation, as a share of the run's steps.
        stop_at_target: stop once every watched split reached the last target.
        stop_after: per target, the step (evaluated) past which the run is of no use for it
            unless the held-out split reached it there (None: no such step); a single
            number applies to every target.
        batch_size: test evaluation batch per rank (default: ``eval.batch_size``).
        refine: evaluate every kept weight snapshot around a crossing (one process only; else the dense grid).
    """

    priority = Priority.NORMAL  # before the sinks (VERY_LOW) write the evaluation record

    def __init__(
        self,
        metric: str,
        targets: float | list[float],
        mode: str = "max",
        test_split: str | None = None,
        coarse: float = 1.4,
        fine: float = 1.04,
        dense_within: float = 0.03,
        first_fraction: float = 1 / 32,
        stop_at_target: bool = True,
        stop_after: float | list[float | None] | None = None,
        batch_size: int | None = None,
        refine: bool = True,
        priority: int | str | None = None,
    ) -> None:
        super().__init__(priority)
        if mode not in ("max", "min"):
            raise ValueError(f"mode is 'max' or 'min', got {mode!r}")
        if not 1 < fine <= coarse:
            raise ValueError(f"need 1 < fine <= coarse, got fine={fine}, coarse={coarse}")
        values = [float(t) for t in (targets if isinstance(targets, list | tuple) else [targets])]
        self.metric, self.targets, self.mode, self.test_split = metric, values, mode, test_split
        self.coarse, self.fine, self.dense_within, self.first_fraction = coarse, fine, dense_within, first_fraction
        self.stop_at_target, self.batch_size = stop_at_target, batch_size
        caps = stop_after if isinstance(stop_after, list | tuple) else [stop_after] * len(values)
        if len(caps) != len(values):
            raise ValueError(f"stop_after gives {len(caps)} steps for {len(values)} targets")
        self.caps = [None if c is None else math.ceil(c - 1e-9) for c in caps]
        self.splits = ["eval"] + (["test"] if test_split else [])
        self.reached = {split: [False] * len(values) for split in self.splits}
        self.previous: dict[str, tuple[int, float]] = {}
        self.stopped = "budget"
        self.diverged: str | None = None
        self.refine = refine
        self.refined: dict[int, list[float | None]] = {}  # step -> [held-out value, test value, held-out loss]
        self._snapshots: list[tuple[int, dict[str, torch.Tensor]]] = []
        self._fine_next = 1
        self._next = 1
        self._loaders: dict[str, Any] = {}
        self.progress: dict[int, list[float]] = {}  # step -> [step, samples seen, training seconds]
        self._clock = (time.monotonic(), 0.0)  # (start of training, seconds since spent measuring)
        self._last = [0, 0, 0.0]
        self._eval_started = 0.0

    def before_run(self, state) -> None:
        run = state.run
        self._next = max(1, math.ceil(run.total_steps * self.first_fraction))
        self._next = min([self._next, *(c for c in self.caps if c is not None)])
        self._fine_next = self._next
        self.refine = self.refine and run.world_size == 1 and not run.sharded
        splits = {"test": self.test_split} if self.test_split else {}
        if self.refine:
            splits["eval"] = run.config.data.eval_split
        for prefix, split in splits.items():
            from largebatch import data as data_mod

            cfg = run.config
            self._loaders[prefix] = data_mod.build_eval_loader(
                dataclasses.replace(cfg.data, eval_split=split),
                batch_size=self.batch_size or cfg.eval.batch_size or cfg.micro_batch_size,
                rank=run.rank,
                world_size=run.world_size,
                device=run.backend.device,
                cache=cfg.eval.cache,
            )

    def before_train(self, state) -> None:
        self._clock = (time.monotonic(), 0.0)

    def after_step(self, state) -> None:
        now = time.monotonic()
        self._last = [state.step, state.samples_seen, round(now - self._clock[0] - self._clock[1], 3)]
        if self.refine and state.step >= self._fine_next:
            if state.step < self._next:  # an evaluation step needs no copy
                weights = state.run.model.state_dict()
                self._snapshots.append((state.step, {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}))
                self.progress[state.step] = self._last
            self._fine_next = next_eval_step(state.step, self.fine)
            self._clock = (self._clock[0], self._clock[1] + time.monotonic() - now)  # the copy is measurement, not training
        if state.step >= self._next:
            state.request_eval()

    def _hit(self, value: float | None, target: float) -> bool:
        if value is None or not math.isfinite(value):
            return False
        return value >= target if self.mode == "max" else value <= target

    def _evaluate_kept(self, state, step: int) -> list[float | None]:
        """The held-out and test values (and held-out loss) of the weights kept at ``step``."""
        if step not in self.refined:
            run = state.run
            model = run.model
            current = {k: v.detach().clone() for k, v in model.state_dict().items()}
            model.load_state_dict(dict(self._snapshots)[step])
            try:
                found = run.task.evaluate(model, self._loaders["eval"], run.backend, prefix="eval")
                if "test" in self._loaders:
                    found.update(run.task.evaluate(model, self._loaders["test"], run.backend, prefix="test"))
            finally:
                model.load_state_dict(current)
            self.refined[step] = [found.get(f"eval/{self.metric}"), found.get(f"test/{self.metric}"), found.get("eval/loss")]
        return self.refined[step]

    def _refine(self, state) -> None:
        """Evaluate every weight snapshot kept since the last evaluation: the first crossing
        lies among them, wherever the curve dips in between."""
        for step, _ in self._snapshots:
            self._evaluate_kept(state, step)

    def _close(self, split: str, step: int, value: float) -> bool:
        """Whether ``split`` is near enough its next target for the fine grid."""
        if all(self.reached[split]):
            return False
        target = self.targets[self.reached[split].index(False)]
        gap = (target - value) if self.mode == "max" else (value - target)
        if gap <= self.dense_within:
            return True
        before = self.previous.get(split)
        if before is None or before[0] <= 0 or step <= before[0]:
            return False
        slope = (value - before[1]) / (math.log(step) - math.log(before[0]))
        ahead = value + slope * math.log(self.coarse)  # the straight line in log(step) at the next coarse step
        return (target - ahead if self.mode == "max" else ahead - target) <= self.dense_within

    def before_eval(self, state) -> None:
        self._eval_started = time.monotonic()
        self.progress[state.step] = self._last if self._last[0] == state.step else [state.step, state.samples_seen, self._last[2]]

    def after_eval(self, state) -> None:
        self._measure_eval(state)
        self._clock = (self._clock[0], self._clock[1] + time.monotonic() - self._eval_started)

    def _measure_eval(self, state) -> None:
        if "test" in self._loaders:
            test = state.run.task.evaluate(state.run.model, self._loaders["test"], state.run.backend, prefix="test")
            state.add_eval_metrics({k: v for k, v in test.items() if not k.endswith("/samples")})
        step, close, crossed = state.step, False, False
        for split in self.splits:
            value = float(state.eval_metrics.get(f"{split}/{self.metric}", math.nan))
            if not math.isfinite(value):
                continue
            close = close or self._close(split, step, value)
            for index, target in enumerate(self.targets):
                if self._hit(value, target) and not self.reached[split][index]:
                    crossed, self.reached[split][index] = True, True
            self.previous[split] = (step, value)
        if crossed and self.refine:
            self._refine(state)
        self._snapshots.clear()
        self._next = next_eval_step(step, self.fine if close and not self.refine else self.coarse)
        pending = [c for c, done in zip(self.caps, self.reached["eval"], strict=True) if c is not None and not done and c > step]
        self._next = min([self._next, *pending])
        self._fine_next = max(self._fine_next, step + 1)
        useless = all(done or (c is not None and step >= c) for c, done in zip(self.caps, self.reached["eval"], strict=True))
        if self.stop_at_target and all(all(r) for r in self.reached.values()):
            self.stopped = "target"
            reached = ", ".join(f"{t:g}" for t in self.targets)
            state.request_stop(f"target {self.metric} {reached} reached on {' and '.join(self.splits)}")
        elif useless and not all(self.reached["eval"]):
            self.stopped = "beaten"
            state.request_stop(f"targets not reached by the steps where the cell's best had reached them ({self.caps})")

    def _write(self, state) -> None:
        if not state.run.is_main:
            return
        outcome = {
            "stopped": self.stopped,
            "steps_run": state.step,
            "total_steps": state.run.total_steps,
            "diverged": self.diverged,
            "refined": [[step, *values] for step, values in sorted(self.refined.items())],
            "threads": torch.get_num_threads(),
            "progress": [self.progress[step] for step in sorted(self.progress)]
            + ([self._last] if self._last[0] not in self.progress else []),
            "cpu_seconds": round(time.process_time(), 1),  # this process's CPU time: the trial's cost on an idle machine
        }
        (state.run.run_dir / OUTCOME).write_text(json.dumps(outcome) + "\n")

    def after_run(self, state) -> None:
        self._write(state)
        for loader in self._loaders.values():
            close = getattr(loader, "close", None)
            if close is not None:
                close()

    def on_exception(self, state, exc: BaseException) -> None:
        from largebatch.engine.update import NonFiniteError

        cause = exc.__cause__ if exc.__cause__ is not None else exc
        if isinstance(exc, NonFiniteError) or isinstance(cause, NonFiniteError):
            self.stopped, self.diverged = "diverged", str(cause)
            self._write(state)
