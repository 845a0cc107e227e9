"""A study's ``arms`` section as trials: named training recipes compared over seeds.

::

    arms = dict(
        lamb_256=dict(set=['global_batch_size=256', 'optimizer.lr=0.01']),
        lamb_2048=dict(set=['global_batch_size=2048', 'optimizer.lr=0.03'], seeds=[1, 2, 3, 4, 5]),
    )                                          # seeds: the arm's own (None: the study's seeds)

Each (arm, seed) is one trial in the study's storage, claimed and run by the study's
workers like any other (``study run``, Slurm array workers), with the key
``arm/<label>/<digest>/s<seed>``; the digest is of the arm's overrides, so an arm whose
``set`` changes is a new arm (its old trials stay recorded, unreported, and waiting ones
are withdrawn). A trial is ``largebatch train`` on the study's base config with the
study's ``set``, then the arm's ``set``, then the seed and the study's protocol
(``runner.protocol_overrides``: the held-out split, evaluations placed by the study's hook
on its schedule, no checkpoints), and the hooks of the arm's config followed by the study's
``TargetEvalHook``, which evaluates the test split beside the held-out one and does **not
stop at the targets**: every arm trains to its own end, for its final test accuracy.

What a trial keeps (``read_outcome``): the crossing of every target on each split, with the
samples seen and training seconds there (``largebatch.study.evaluation``: wall time less
evaluation); its totals (steps, samples, training seconds); its final held-out and test
values; and, for a recipe whose batch changes, what the run logged about it: every
``batch/*`` key of its metrics.jsonl, as the steps where its value changed (absent when
the run logs none).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pathlib
from typing import Any

from largebatch.errors import UserError
from largebatch.rundir import RunDir, read_metrics
from largebatch.study import ledger

PHASE = "arm"
KEYS = {"set": [], "seeds": None}


@dataclasses.dataclass(frozen=True)
class Arm:
    """One recipe: its label, its ``--set`` overrides (after the study's) and its seeds."""

    label: str
    overrides: tuple[str, ...]
    seeds: tuple[int, ...]

    @property
    def digest(self) -> str:
        """A short hash of the overrides: the arm's identity in its trials' keys."""
        return hashlib.sha256(json.dumps(list(self.overrides)).encode()).hexdigest()[:8]

    def key(self, seed: int) -> str:
        return f"arm/{self.label}/{self.digest}/s{seed}"


def parse(value: Any, seeds: tuple[int, ...], where: str) -> tuple[Arm, ...]:
    """The ``arms`` section, checked for its shape (each arm's config: ``checks``).

    Raises:
        UserError: not a dict of arms, fewer than two, a label that is not a plain name, an
            unknown key, overrides not of the form ``key=value``, seeds not distinct integers.
    """
    if not isinstance(value, dict) or len(value) < 2:
        raise UserError(
            f"must name at least two recipes to compare, as arms = dict(label=dict(set=[...]), ...), got {value!r}", key="arms", path=where
        )
    out = []
    for label, entry in value.items():
        name = f"arms.{label}"
        if not isinstance(label, str) or not label.replace("_", "").replace("-", "").isalnum():
            raise UserError("an arm's label is a plain name (letters, digits, '-' and '_')", key=name, path=where)
        entry = {} if entry is None else entry
        if not isinstance(entry, dict):
            raise UserError(f"must be a dict(set=[...], seeds=[...]), got {entry!r}", key=name, path=where)
        unknown = sorted(set(entry) - set(KEYS))
        if unknown:
            raise UserError(f"unknown key; known keys: {', '.join(KEYS)}", key=f"{name}.{unknown[0]}", path=where)
        sets = entry.get("set", [])
        if not isinstance(sets, list) or any(not isinstance(s, str) or "=" not in s or not s.partition("=")[0].strip() for s in sets):
            raise UserError(f"each override is 'key.path=value' as for --set, got {sets!r}", key=f"{name}.set", path=where)
        own = entry.get("seeds")
        own = list(seeds) if own is None else own
        if (
            not isinstance(own, list)
            or not own
            or any(isinstance(s, bool) or not isinstance(s, int) for s in own)
            or len(set(own)) < len(own)
        ):
            raise UserError(f"must be a list of distinct integer seeds, got {own!r}", key=f"{name}.seeds", path=where)
        out.append(Arm(label, tuple(sets), tuple(own)))
    return tuple(out)


def keys(spec: Any) -> set[str]:
    """The keys of every trial of the section as it stands."""
    return {arm.key(seed) for arm in spec.arms for seed in arm.seeds}


def decide(spec: Any, trials: list[Any], skipped: set[str], retry_failed: bool) -> list[dict[str, Any]]:
    """The user attributes of the arm trials to queue now (no searched parameters): each
    (arm, seed) with none live, or whose last attempt was killed (at most
    ``workers.max_retries`` times), or failed and ``retry_failed``. Seeds in order, then arms,
    so a study stopped early has every arm at its first seeds."""
    history = ledger.histories(trials, PHASE)
    wanted = []
    for index, arm in enumerate(spec.arms):
        for position, seed in enumerate(arm.seeds):
            name = arm.key(seed)
            past = history.get(name, [])
            if ledger.due(past, name in skipped, retry_failed, int(spec.workers["max_retries"])):
                order = f"3-{position:04d}-{index:04d}"
                wanted.append({"key": name, "phase": PHASE, "arm": arm.label, "seed": seed, "order": order, "attempt": len(past) + 1})
    return wanted


def value(outcome: dict[str, Any], spec: Any) -> float:
    """A finished arm trial's objective: held-out steps to the last target (inf: not reached)."""
    crossing = outcome["crossings"][spec.target.key]["eval"]
    return math.inf if crossing is None else float(crossing["steps"])


def batch_log(run_dir: pathlib.Path) -> dict[str, list[list[float]]]:
    """Each ``batch/*`` key a run logged, as ``[step, value]`` where its value changed ({}: none)."""
    metrics = RunDir(run_dir).metrics
    out: dict[str, list[list[float]]] = {}
    for record in read_metrics(metrics) if metrics.is_file() else []:
        for name, logged in record.items():
            if name.startswith("batch/") and isinstance(logged, int | float) and (name not in out or out[name][-1][1] != logged):
                out.setdefault(name, []).append([record.get("step", 0), logged])
    return out


def results(spec: Any, trials: list[Any]) -> list[dict[str, Any]]:
    """The finished trials of the section as it stands: per trial its arm, seed, number and
    outcome (newest first when a key ran twice: the latest counts)."""
    from optuna.trial import TrialState

    wanted = keys(spec)
    found: dict[str, dict[str, Any]] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        info = ledger.attrs(trial)
        if info.get("phase") == PHASE and trial.state == TrialState.COMPLETE and info["key"] in wanted and "duplicate_of" not in info:
            found[info["key"]] = {"arm": info["arm"], "seed": info["seed"], "number": trial.number, "outcome": info.get("outcome") or {}}
    return list(found.values())
