"""A study's trials in Optuna: their identity, the queue, heartbeats and endings.

Every trial has a **key**, its identity: ``<optimizer>/b<batch>/q<slot>/s<seed>``, the
cell, the Sobol point ``slot`` and the seed. Tuning trials run with the study's
``tune_seed``; a re-run of a cell's best configuration, the point at ``slot``, runs with
one of ``seeds`` (never the tuning seed), so the seed tells the two apart and a key
names the same trial in every storage whatever order the trials ran in. Trials are queued as Optuna ``WAITING`` trials
(``study.enqueue_trial``, with their parameters fixed and their key in the user
attributes) and a worker **claims** one by setting it ``RUNNING`` through the storage, the
step Optuna's ``study.ask()`` takes to pop its queue, which succeeds for one worker only
(``largebatch.study.storage``). Two workers planning at once may queue a key twice; the
later copy is dropped when claimed (``duplicate_of``), so a key runs once.

A running trial carries its worker (host, pid) and a **heartbeat** (a time, refreshed
while the trial runs). A trial whose worker died (``kill -9``, a lost node) is found
**stale**, its heartbeat older than ``stale_seconds``, or its worker's pid gone on this
host, and ended as FAIL with ``failure='killed'``; a trial whose training failed ends as
FAIL with ``failure='error'``. Both keep their error text; ``largebatch.study.plan``
decides whether a key is run again, as a new trial with the same key (``endings`` tells
``study status`` which trial re-ran a killed one).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

TUNE, SEED = "tune", "seed"


def trial_key(optimizer: str, batch: int, slot: int, seed: int) -> str:
    """A trial's identity: its cell, its Sobol point and its seed."""
    return f"{optimizer}/b{batch}/q{slot}/s{seed}"


def attrs(trial: Any) -> dict[str, Any]:
    return trial.user_attrs


def enqueue(study: Any, params: dict[str, float], user_attrs: dict[str, Any]) -> None:
    """Queue one trial (WAITING) with its parameters fixed."""
    study.enqueue_trial(params, user_attrs=user_attrs, skip_if_exists=False)


def claim(study: Any) -> Any | None:
    """Claim the first waiting trial in queue order (``order``, then trial id), or None.
    A claimed copy of a key that another live trial already holds is dropped."""
    import optuna
    from optuna.trial import TrialState

    storage = study._storage
    waiting = storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.WAITING,))
    for trial in sorted(waiting, key=lambda t: (attrs(t).get("order", ""), t._trial_id)):
        try:
            if not storage.set_trial_state_values(trial._trial_id, state=TrialState.RUNNING):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        holder = _holder(study, trial)
        if holder is not None:
            storage.set_trial_user_attr(trial._trial_id, "duplicate_of", holder)
            storage.set_trial_state_values(trial._trial_id, state=TrialState.PRUNED)
            continue
        storage.set_trial_user_attr(trial._trial_id, "worker", {"host": socket.gethostname(), "pid": os.getpid()})
        beat(study, trial._trial_id)
        return storage.get_trial(trial._trial_id)
    return None


def withdraw(study: Any, trial_id: int, why: str) -> None:
    """End a claimed trial that is no longer wanted, unrun: PRUNED, with ``withdrawn`` saying why."""
    from optuna.trial import TrialState

    study._storage.set_trial_user_attr(trial_id, "withdrawn", why)
    study._storage.set_trial_state_values(trial_id, state=TrialState.PRUNED)


def histories(trials: list[Any], phase: str) -> dict[str, list[Any]]:
    """The trials of ``phase`` by key, oldest first (dropped copies and withdrawn trials left out)."""
    out: dict[str, list[Any]] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        info = attrs(trial)
        if info.get("phase") == phase and "duplicate_of" not in info and "withdrawn" not in info:
            out.setdefault(info["key"], []).append(trial)
    return out


def due(past: list[Any], skipped_it: bool, retry_failed: bool, max_retries: int) -> bool:
    """Whether a key with these trials (oldest first) is queued now: it has none live and is
    not skipped, and either has none yet, or its last was killed (at most ``max_retries``
    times), or failed and ``retry_failed``."""
    from optuna.trial import TrialState

    if any(t.state != TrialState.FAIL for t in past) or (skipped_it and not retry_failed):
        return False
    killed = bool(past) and attrs(past[-1]).get("failure") == "killed"
    return not past or retry_failed or (killed and len(past) <= max_retries)


def _holder(study: Any, claimed: Any) -> int | None:
    """The number of an earlier trial holding ``claimed``'s key (waiting, running or complete), if any."""
    from optuna.trial import TrialState

    live = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE)
    key = attrs(claimed).get("key")
    for trial in study._storage.get_all_trials(study._study_id, deepcopy=False, states=live):
        if trial._trial_id < claimed._trial_id and attrs(trial).get("key") == key and "duplicate_of" not in attrs(trial):
            return trial.number
    return None


def beat(study: Any, trial_id: int) -> None:
    """Refresh a running trial's heartbeat."""
    study._storage.set_trial_user_attr(trial_id, "heartbeat", time.time())


def fail(study: Any, trial_id: int, failure: str, error: str) -> bool:
    """End a running trial as FAIL with its error (``failure``: 'error' or 'killed'); False
    when it had already ended (another worker finished or failed it)."""
    import optuna
    from optuna.trial import TrialState

    try:
        study._storage.set_trial_user_attr(trial_id, "failure", failure)
        study._storage.set_trial_user_attr(trial_id, "error", error[-4000:])
        return bool(study._storage.set_trial_state_values(trial_id, state=TrialState.FAIL))
    except optuna.exceptions.UpdateFinishedTrialError:
        return False


def complete(study: Any, trial_id: int, value: float, outcome: dict[str, Any]) -> None:
    """End a running trial as COMPLETE with its objective ``value`` and ``outcome``."""
    from optuna.trial import TrialState

    study._storage.set_trial_user_attr(trial_id, "outcome", outcome)
    study._storage.set_trial_state_values(trial_id, state=TrialState.COMPLETE, values=[value])


def skipped(study: Any) -> set[str]:
    """The keys whose failure the user chose to go on without (``study run --skip-failed``)."""
    return {k.removeprefix("skip:") for k, v in study.user_attrs.items() if k.startswith("skip:") and v}


def skip(study: Any, key: str, skip_it: bool = True) -> None:
    """Record that ``key``'s failure is skipped (``skip_it=False``: no longer, it is run again)."""
    study.set_user_attr(f"skip:{key}", "skipped after failing (study run --skip-failed)" if skip_it else None)


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def fail_stale(study: Any, stale_seconds: float, now: float | None = None) -> list[int]:
    """End every running trial whose worker is gone as FAIL (``failure='killed'``); the numbers ended."""
    from optuna.trial import TrialState

    now = time.time() if now is None else now
    host, ended = socket.gethostname(), []
    for trial in study._storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.RUNNING,)):
        worker, last = attrs(trial).get("worker") or {}, attrs(trial).get("heartbeat")
        age = now - last if last is not None else now - trial.datetime_start.timestamp()
        gone = worker.get("host") == host and worker.get("pid") not in (None, os.getpid()) and _pid_gone(int(worker["pid"]))
        if gone or age > stale_seconds:
            why = f"its worker (pid {worker.get('pid')} on {worker.get('host')}) is gone" if gone else f"no heartbeat for {age:.0f} s"
            if fail(study, trial._trial_id, "killed", f"killed: {why}"):
                ended.append(trial.number)
    return ended


def endings(trials: list[Any], shown: int = 5) -> str:
    """How the ``trials`` that ended without a result ended, for ``study status``: ``N
    failed, M killed``, then each killed trial with the trial that ran its key again
    (``trial 5 lamb/b32/q0/s1 re-run as #12``, or ``not re-run``), the first ``shown`` of them."""
    from optuna.trial import TrialState

    ended = [t for t in trials if t.state == TrialState.FAIL]
    killed = [t for t in ended if attrs(t).get("failure") == "killed"]
    text = f"{len(ended) - len(killed)} failed, {len(killed)} killed"
    notes = []
    for trial in sorted(killed, key=lambda t: t.number)[:shown]:
        key = attrs(trial).get("key")
        again = min((t.number for t in trials if t.number > trial.number and attrs(t).get("key") == key), default=None)
        notes.append(f"trial {trial.number} {key} " + ("not re-run" if again is None else f"re-run as #{again}"))
    if len(killed) > shown:
        notes.append(f"{len(killed) - shown} more")
    return text + (": " + "; ".join(notes) if notes else "")
