"""Which trials a study needs, given the ones it has: the same tuning budget in every cell,
then the best of each cell re-run with fresh seeds.

**Tuning.** The unit-cube points are the first ``trials`` points of a scrambled Sobol
sequence drawn by Optuna's ``QMCSampler`` (``unit_points``), one coordinate per searched
parameter (``space.dimensions``); every cell maps the same points onto its own ranges. The
points are drawn once, in one process, and queued as trials, so parallel workers and a
resumed study never draw new ones: a study's trials are a function of its file.

**Choice** (``best``): among a cell's finished tuning trials, the one that reached the
target on the held-out split in the fewest (interpolated) steps; when none reached it, the
one with the best held-out value at its end. Ties go to the lower Sobol point.

**Re-runs.** Once every tuning key of a cell has finished (or its failure was skipped),
the chosen configuration is queued once per seed of ``seeds``; the re-run's key names the
Sobol point it repeats, so should a retried trial change the choice, the new choice is
re-run and the old re-runs stay recorded but are not reported.

**Failures.** A key whose last trial failed is run again when it was killed (at most
``workers.max_retries`` times), or when the user asks (``retry_failed``, skipped keys
included); skipped when the user asks (``skip_failed``); otherwise it holds its cell back
and is listed (``blocked``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from largebatch.study import ledger
from largebatch.study.space import dimensions, point_values
from largebatch.study.spec import StudySpec
from largebatch.study.target import Crossing


@dataclasses.dataclass
class Cell:
    """One (optimizer, batch) cell's trials by key, from the storage."""

    optimizer: str
    batch: int
    tune: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    seeds: dict[str, list[Any]] = dataclasses.field(default_factory=dict)


def unit_points(spec: StudySpec) -> list[dict[str, float]]:
    """The first ``spec.trials`` points of Optuna's scrambled Sobol sequence (``QMCSampler``
    with ``sampler_seed``), as ``{param: coordinate in [0, 1)}``."""
    import warnings

    import optuna
    from optuna.distributions import FloatDistribution

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    names = dimensions([o.space for o in spec.optimizers])
    space = {name: FloatDistribution(0.0, 1.0) for name in names}
    sampler = optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True, seed=spec.sampler_seed, warn_independent_sampling=False)
    study = optuna.create_study(sampler=sampler)  # in memory: only to number the points 0, 1, 2, ...
    points = []
    for _ in range(spec.trials):
        trial = study.ask()
        point = sampler.sample_relative(study, study._storage.get_trial(trial._trial_id), space)
        points.append({name: float(point[name]) for name in names})
        study.tell(trial, 0.0)
    return points


def score(trial: Any, mode: str) -> tuple[float, float]:
    """Lower is better: held-out steps to target (inf when not reached), then the held-out
    value at the end (negated for a metric to maximise)."""
    outcome = ledger.attrs(trial).get("outcome") or {}
    crossing = Crossing.from_dict(outcome.get("eval_crossing"))
    final = outcome.get("final_eval")
    final = math.inf if final is None else (-final if mode == "max" else final)
    return (math.inf if crossing is None else crossing.steps, final)


def best(trials: list[Any], mode: str) -> Any | None:
    """The cell's choice among its complete tuning trials (see the module docstring)."""
    done = [t for t in trials if _complete(t)]
    return min(done, key=lambda t: (score(t, mode), ledger.attrs(t).get("slot", 0), t.number)) if done else None


def cap(trials: list[Any], mode: str) -> float | None:
    """The held-out steps to target of the cell's best so far, or None: a new tuning trial
    that has not reached the target by then cannot become the choice."""
    chosen = best(trials, mode)
    steps = None if chosen is None else score(chosen, mode)[0]
    return None if steps is None or math.isinf(steps) else steps


def _complete(trial: Any) -> bool:
    from optuna.trial import TrialState

    return trial.state == TrialState.COMPLETE


def cells(spec: StudySpec, trials: list[Any]) -> dict[tuple[str, int], Cell]:
    """The study's trials grouped by cell and key (duplicates left out)."""
    out = {(o, b): Cell(o, b) for o, b in spec.cells()}
    for trial in sorted(trials, key=lambda t: t.number):
        info = ledger.attrs(trial)
        cell = out.get((info.get("optimizer"), info.get("batch")))
        if cell is None or "duplicate_of" in info or "key" not in info:
            continue
        group = cell.tune if info.get("phase") == ledger.TUNE else cell.seeds
        group.setdefault(info["key"], []).append(trial)
    return out


@dataclasses.dataclass(frozen=True)
class Wanted:
    """A trial to queue: its fixed parameters and user attributes."""

    params: dict[str, float]
    attrs: dict[str, Any]


def decide(
    spec: StudySpec, trials: list[Any], skipped: set[str], retry_failed: bool, skip_failed: bool, points: list[dict[str, float]]
) -> tuple[list[Wanted], list[str], list[tuple[str, str]]]:
    """What to queue now, which failed keys to mark skipped, and the keys blocked by a
    failure nobody decided on, with their errors (``points``: ``unit_points(spec)``)."""
    from optuna.trial import TrialState

    smallest = min(spec.batches)
    wanted, to_skip, blocked = [], [], []

    def needs(key: str, history: list[Any]) -> bool:
        """Whether ``key`` (with these trials) should be queued now; notes skips and blocks."""
        if any(t.state != TrialState.FAIL for t in history) or (key in skipped and not retry_failed):
            return False
        if not history:
            return True
        last = history[-1]
        killed = ledger.attrs(last).get("failure") == "killed"
        if retry_failed or (killed and len(history) <= int(spec.workers["max_retries"])):
            return True
        if skip_failed:
            to_skip.append(key)
        else:
            blocked.append((key, str(ledger.attrs(last).get("error", "failed"))))
        return False

    for index, cell in enumerate(cells(spec, trials).values()):
        opt = spec.optimizer(cell.optimizer)
        keys = [ledger.trial_key(cell.optimizer, cell.batch, slot, spec.tune_seed) for slot in range(len(points))]
        queued = set()
        for slot, (key, unit) in enumerate(zip(keys, points, strict=True)):
            history = cell.tune.get(key, [])
            if needs(key, history):
                queued.add(key)
                attrs = _attrs(key, ledger.TUNE, cell, spec.tune_seed, f"1-{slot:04d}-{index:04d}", len(history) + 1)
                wanted.append(Wanted(point_values(opt.space, unit, cell.batch, smallest), {**attrs, "slot": slot}))
        done = all((k in skipped and k not in queued) or any(_complete(t) for t in cell.tune.get(k, [])) for k in keys)
        chosen = best([t for ts in cell.tune.values() for t in ts], spec.target.mode) if done else None
        if chosen is None:
            continue
        for seed in spec.seeds:
            slot = int(ledger.attrs(chosen)["slot"])
            key = ledger.trial_key(cell.optimizer, cell.batch, slot, seed)
            history = cell.seeds.get(key, [])
            if needs(key, history):
                attrs = _attrs(key, ledger.SEED, cell, seed, f"0-{index:04d}-{seed:08d}", len(history) + 1)
                wanted.append(Wanted(dict(chosen.params), {**attrs, "slot": slot}))
    return wanted, to_skip, blocked


def _attrs(key: str, phase: str, cell: Cell, seed: int, order: str, attempt: int) -> dict[str, Any]:
    return {"key": key, "phase": phase, "optimizer": cell.optimizer, "batch": cell.batch, "seed": seed, "order": order, "attempt": attempt}
