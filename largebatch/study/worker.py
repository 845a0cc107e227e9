"""``largebatch study run``: workers that plan, claim and run a study's trials until none is left.

Each of ``jobs`` worker threads loops: end the trials of dead workers (``ledger.fail_stale``),
queue what the study needs now (``plan.decide``), claim the next waiting trial, run it as a
subprocess (``runner``) with heartbeats, and record its outcome. Planning and claiming
hold a lock inside the process; across processes and machines the storage makes the claim
atomic (``ledger.claim``). A worker with nothing to claim waits while trials run elsewhere
(their results may unlock the cell's re-runs) and ends when nothing is running or waiting.

Stopping (SIGINT, SIGTERM, Slurm's USR1) ends the running trials and records them as
killed; a later ``study run`` runs them again. ``max_trials`` ends this invocation after
that many trials, to run a study in parts.

What the storage keeps of a trial (its ``--set`` overrides, its error) is redacted
(``largebatch.config.redact``); the trial's command line holds the real values.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from largebatch.config.redact import redact_text
from largebatch.study import arm_trials, branch_trials, ledger, plan, runner
from largebatch.study.spec import StudySpec

REQUEUE_STATUS = 75  # largebatch train stopped by a signal (largebatch.preemption.EXIT_REQUEUE)


@dataclasses.dataclass
class Options:
    """How this invocation runs: worker threads, failure policy, a trial limit, threads per trial."""

    jobs: int = 1
    retry_failed: bool = False
    skip_failed: bool = False
    max_trials: int | None = None
    threads: int | None = None


@dataclasses.dataclass
class Outcome:
    """What an invocation did: trials it ran, those that failed, keys blocked by failures."""

    ran: int = 0
    failed: list[str] = dataclasses.field(default_factory=list)
    blocked: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    stopped: bool = False


def threads_per_trial(spec: StudySpec, options: Options) -> int:
    """OMP threads per trial: ``--threads``, else the study file's ``threads``, else this
    machine's cores / ``--jobs``."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return options.threads or spec.threads or max(1, cpus // max(options.jobs, 1))


class Workers:
    """The worker threads of one ``study run``."""

    def __init__(self, spec: StudySpec, base: runner.Base, study: Any, options: Options, say: Callable[[str], None] = print) -> None:
        self.spec, self.base, self.study, self.options, self.say = spec, base, study, options, say
        self.points = plan.unit_points(spec)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.outcome = Outcome()
        self.claimed = 0
        self.threads = threads_per_trial(spec, options)
        self.source = branch_trials.source(spec) if spec.branches is not None else None
        self.branch_keys = set() if self.source is None else branch_trials.keys(spec, self.source)
        self.arm_keys = arm_trials.keys(spec)

    def run(self) -> Outcome:
        """Run the workers to the end (or until stopped); install signal handlers while they run."""
        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
        previous = (
            {sig: signal.signal(sig, self._on_signal) for sig in handled} if threading.current_thread() is threading.main_thread() else {}
        )
        threads = [threading.Thread(target=self._loop, name=f"study-worker-{i}", daemon=True) for i in range(self.options.jobs)]
        try:
            for thread in threads:
                thread.start()
            while any(t.is_alive() for t in threads):
                for thread in threads:
                    thread.join(timeout=0.5)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.outcome

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.say(
            f"{signal.Signals(signum).name}: stopping; the running trials are recorded as killed and run again by the next `study run`"
        )
        self.outcome.stopped = True
        self.stop.set()

    def _next(self) -> tuple[Any | None, bool]:
        """Plan and claim under the lock: (a claimed trial or None, whether anything runs or waits)."""
        from optuna.trial import TrialState

        with self.lock:
            ledger.fail_stale(self.study, float(self.spec.workers["stale_seconds"]))
            trials = self.study.get_trials(deepcopy=False)
            skipped = ledger.skipped(self.study)
            wanted, to_skip, blocked = plan.decide(
                self.spec, trials, skipped, self.options.retry_failed, self.options.skip_failed, self.points
            )
            if self.source is not None:
                wanted += [
                    plan.Wanted({}, attrs)
                    for attrs in branch_trials.decide(self.spec, self.source, trials, skipped, self.options.retry_failed)
                ]
            wanted += [plan.Wanted({}, attrs) for attrs in arm_trials.decide(self.spec, trials, skipped, self.options.retry_failed)]
            for key in to_skip:
                ledger.skip(self.study, key)
            for item in wanted:
                if item.attrs["key"] in skipped:
                    ledger.skip(self.study, item.attrs["key"], False)
                ledger.enqueue(self.study, item.params, item.attrs)
            self.outcome.blocked = blocked
            if self.options.max_trials is not None and self.claimed >= self.options.max_trials:
                return None, False
            trial = ledger.claim(self.study)
            while trial is not None and self._withdrawn(trial):
                trial = ledger.claim(self.study)
            if trial is not None:
                self.claimed += 1
                return trial, True
            states = {t.state for t in self.study.get_trials(deepcopy=False)}
            return None, bool(states & {TrialState.WAITING, TrialState.RUNNING})

    def _withdrawn(self, trial: Any) -> bool:
        """Whether a claimed trial is a branch or an arm its section no longer has (the
        section changed after it was queued); if so it is withdrawn, never run."""
        info = ledger.attrs(trial)
        sections = {branch_trials.PHASE: ("branches", self.branch_keys), arm_trials.PHASE: ("arms", self.arm_keys)}
        if info.get("phase") not in sections:
            return False
        section, current = sections[info["phase"]]
        if info["key"] in current:
            return False
        ledger.withdraw(self.study, trial._trial_id, f"no longer in the study file's {section} section")
        self.say(f"trial {trial.number} {info['key']}: withdrawn, no longer in the {section} section")
        return True

    def _loop(self) -> None:
        while not self.stop.is_set():
            trial, busy = self._next()
            if trial is None:
                if not busy:
                    return
                self.stop.wait(float(self.spec.workers["poll_seconds"]))
                continue
            try:
                self._execute(trial)
            except Exception:  # noqa: BLE001 - the trial is recorded as failed with the traceback; the worker goes on
                error = redact_text(traceback.format_exc())
                ledger.fail(self.study, trial._trial_id, "error", error)
                self.outcome.failed.append(ledger.attrs(trial)["key"])
                self.say(f"trial {trial.number} {ledger.attrs(trial)['key']}: failed in the worker:\n{error}")

    def _execute(self, trial: Any) -> None:
        import optuna

        spec, info = self.spec, ledger.attrs(trial)
        if info["phase"] in (branch_trials.PHASE, arm_trials.PHASE):
            self._execute_fixed(trial, info)
            return
        opt, batch = spec.optimizer(info["optimizer"]), int(info["batch"])
        suggesting = optuna.trial.Trial(self.study, trial._trial_id)
        for p in opt.space:  # records each parameter with this cell's range (the value is the queued one)
            low, high = p.bounds(batch, min(spec.batches))
            if p.integer:
                suggesting.suggest_int(p.name, math.ceil(low), math.floor(high), log=p.log)
            else:
                suggesting.suggest_float(p.name, low, high, log=p.log)
        caps = None
        if info["phase"] == ledger.TUNE:
            cell = plan.cells(spec, self.study.get_trials(deepcopy=False))[(opt.label, batch)]
            caps = [plan.cap([t for ts in cell.tune.values() for t in ts], target) for target in spec.targets]
        sets = runner.trial_overrides(spec, self.base, info, suggesting.params, caps)
        run_dir = spec.folder / "trials" / runner.run_dir_name(trial.number, info)
        if run_dir.exists():  # left by a storage made before this one: a trial starts in an empty folder
            aside = run_dir.with_name(f"{run_dir.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
            run_dir.rename(aside)
            self.say(f"trial {trial.number}: {run_dir} existed (from an earlier storage?); moved to {aside.name}")
        storage = self.study._storage
        storage.set_trial_user_attr(trial._trial_id, "run_dir", str(run_dir.relative_to(spec.folder)))
        storage.set_trial_user_attr(trial._trial_id, "overrides", [redact_text(s) for s in sets])  # the real ones: argv only
        storage.set_trial_user_attr(trial._trial_id, "stop_after", caps)
        storage.set_trial_user_attr(trial._trial_id, "threads", self.threads)
        argv = ["--config", str(spec.base_config), "--run-dir", str(run_dir)] + [arg for s in sets for arg in ("--set", s)]
        by = ", ".join(f"{t.value:g} by step {math.ceil(c)}" for t, c in zip(spec.targets, caps or [], strict=False) if c is not None)
        self.say(f"trial {trial.number} {info['key']}: started" + (f" (stops unless at the targets: {by})" if by else ""))
        start = time.monotonic()
        status = runner.run(
            argv,
            run_dir,
            self.threads,
            beat=lambda: ledger.beat(self.study, trial._trial_id),
            every=float(spec.workers["heartbeat_seconds"]),
            stop=self.stop.is_set,
        )
        self._record(trial, info, status, run_dir, time.monotonic() - start)

    def _record(self, trial: Any, info: dict[str, Any], status: int, run_dir: pathlib.Path, seconds: float) -> None:
        outcome = runner.read_outcome(run_dir, self.spec, seconds)
        self.outcome.ran += 1
        if status == 0 or outcome.get("stopped") == "diverged":
            crossing = outcome["crossings"][self.spec.target.key]["eval"]
            ledger.complete(self.study, trial._trial_id, math.inf if crossing is None else crossing["steps"], outcome)
            reached = "not reached" if crossing is None else f"reached at step {crossing['steps']:.1f}"
            self.say(f"trial {trial.number} {info['key']}: {outcome.get('stopped')}, held-out target {reached} ({seconds:.0f} s)")
            return
        self._failed(trial, info, status, run_dir)

    def _execute_fixed(self, trial: Any, info: dict[str, Any]) -> None:
        """A trial with nothing searched: a branch of the critical-batch measurement
        (``branch_trials``; its value is the held-out loss at its end) or an arm
        (``arm_trials``; its value is held-out steps to the last target)."""
        spec, branch = self.spec, info["phase"] == branch_trials.PHASE
        run_dir = spec.folder / "trials" / runner.run_dir_name(trial.number, info)
        storage = self.study._storage
        storage.set_trial_user_attr(trial._trial_id, "run_dir", str(run_dir.relative_to(spec.folder)))
        if branch:
            argv = branch_trials.launch(spec, info, run_dir)
        else:
            sets = runner.arm_overrides(spec, self.base.arm_hooks[info["arm"]], info)
            storage.set_trial_user_attr(trial._trial_id, "overrides", [redact_text(s) for s in sets])  # the real ones: argv only
            storage.set_trial_user_attr(trial._trial_id, "threads", self.threads)
            argv = ["--config", str(spec.base_config), "--run-dir", str(run_dir)] + [arg for s in sets for arg in ("--set", s)]
        self.say(f"trial {trial.number} {info['key']}: started")
        start = time.monotonic()
        beat = lambda: ledger.beat(self.study, trial._trial_id)  # noqa: E731
        status = runner.run(argv, run_dir, self.threads, beat, float(spec.workers["heartbeat_seconds"]), self.stop.is_set)
        seconds = time.monotonic() - start
        outcome = branch_trials.read_outcome(run_dir, seconds) if branch else runner.read_arm_outcome(run_dir, spec, seconds)
        self.outcome.ran += 1
        if status == 0 or outcome.get("stopped") == "diverged":
            end = outcome.get("end_loss")
            found = (math.inf if end is None else end) if branch else arm_trials.value(outcome, spec)
            ledger.complete(self.study, trial._trial_id, found, outcome)
            what = f"held-out loss {outcome.get('start_loss')} -> {end}" if branch else f"held-out steps to {spec.target.key}: {found:.1f}"
            self.say(f"trial {trial.number} {info['key']}: {what} ({outcome['seconds']:.0f} s)")
            return
        self._failed(trial, info, status, run_dir)

    def _failed(self, trial: Any, info: dict[str, Any], status: int, run_dir: pathlib.Path) -> None:
        killed = self.stop.is_set() or status < 0 or status == REQUEUE_STATUS
        error = redact_text(runner.tail(run_dir / "train.log")) or f"exit status {status}"
        ledger.fail(self.study, trial._trial_id, "killed" if killed else "error", f"exit status {status}: {error}")
        self.outcome.failed.append(info["key"])
        self.say(
            f"trial {trial.number} {info['key']}: {'killed' if killed else 'failed'} (exit status {status}); log: {run_dir / 'train.log'}"
        )
