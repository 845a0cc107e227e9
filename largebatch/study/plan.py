"""Which trials a study needs, given the ones it has: the same tuning budget in every cell,
then the best of each cell, for each target, re-run with fresh seeds.

**Tuning.** Every cell runs ``trials`` trials, numbered by their ``slot``. The first
``quasi_random`` are the first points of a scrambled Sobol sequence drawn by Optuna's
``QMCSampler`` (``unit_points``), one coordinate per searched parameter
(``space.dimensions``); every cell maps the same points onto its own ranges. The rest
are proposed one at a time by Optuna's TPE sampler (``sequential_point``), in the unit
cube, from the cell's finished tuning trials: slot k is proposed once every slot before
it has finished (or its failure was skipped), from those trials in slot order, ranked by
the choice's order below, with a seed made of ``sampler_seed``, the cell and k. The same
storage contents give the same point, whatever the workers' timing: a resumed study or
parallel workers queue exactly the same trials (a second worker planning at once proposes
the same point, and the copy is dropped when claimed). Sequential proposals use the
finished trials the quasi-random ones leave, as Shallue et al. 2019 and Nado et al. 2021
tune with quasi-random search and TPE-style refinement (Bergstra et al. 2011).

**Choice** (``best``), per target: among a cell's finished tuning trials, the one that
reached the target on the held-out split in the fewest (interpolated) steps; when none
reached it, the one with the best held-out value at its end. Ties go to the lower slot.
Each target has its own choice, as McCandlish et al. 2018 and Zhang et al. 2024 tune for
each target: the configuration fastest to 78% need not be the one fastest to 86%.

**Re-runs.** Once every tuning slot of a cell has finished (or its failure was skipped),
each target's choice is queued once per seed of ``seeds``; the re-run's key names the
slot it repeats, so targets with the same choice share their re-runs, and should a
retried trial change a choice, the new choice is re-run and the old re-runs stay
recorded but are not reported. A re-run runs until the last target and records the
crossing of every target.

**Failures.** A key whose last trial failed is run again when it was killed (at most
``workers.max_retries`` times), or when the user asks (``retry_failed``, skipped keys
included); skipped when the user asks (``skip_failed``); otherwise it holds its cell back
and is listed (``blocked``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any

from largebatch.study import ledger
from largebatch.study.space import dimensions, point_values
from largebatch.study.spec import StudySpec, Target
from largebatch.study.target import crossing_of


@dataclasses.dataclass
class Cell:
    """One (optimizer, batch) cell's trials by key, from the storage."""

    optimizer: str
    batch: int
    tune: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    seeds: dict[str, list[Any]] = dataclasses.field(default_factory=dict)


def unit_points(spec: StudySpec) -> list[dict[str, float]]:
    """The first ``spec.quasi_random`` points of Optuna's scrambled Sobol sequence
    (``QMCSampler`` with ``sampler_seed``), as ``{param: coordinate in [0, 1)}``."""
    import warnings

    import optuna
    from optuna.distributions import FloatDistribution

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    names = dimensions([o.space for o in spec.optimizers])
    space = {name: FloatDistribution(0.0, 1.0) for name in names}
    sampler = optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True, seed=spec.sampler_seed, warn_independent_sampling=False)
    study = optuna.create_study(sampler=sampler)  # in memory: only to number the points 0, 1, 2, ...
    points = []
    for _ in range(spec.quasi_random):
        trial = study.ask()
        point = sampler.sample_relative(study, study._storage.get_trial(trial._trial_id), space)
        points.append({name: float(point[name]) for name in names})
        study.tell(trial, 0.0)
    return points


def score(trial: Any, target: Target) -> tuple[float, float]:
    """Lower is better: held-out steps to ``target`` (inf when not reached), then the
    held-out value at the end (negated for a metric to maximise)."""
    crossing = crossing_of(trial, target)
    final = (ledger.attrs(trial).get("outcome") or {}).get("final_eval")
    final = math.inf if final is None else (-final if target.mode == "max" else final)
    return (math.inf if crossing is None else crossing.steps, final)


def best(trials: list[Any], target: Target) -> Any | None:
    """The cell's choice for ``target`` among its complete tuning trials (see the module docstring)."""
    done = [t for t in trials if _complete(t)]
    return min(done, key=lambda t: (score(t, target), ledger.attrs(t).get("slot", 0), t.number)) if done else None


def cap(trials: list[Any], target: Target) -> float | None:
    """The held-out steps to ``target`` of the cell's best so far, or None: a new tuning
    trial that has not reached the target by then cannot become the choice for it."""
    chosen = best(trials, target)
    steps = None if chosen is None else score(chosen, target)[0]
    return None if steps is None or math.isinf(steps) else steps


def sequential_point(spec: StudySpec, label: str, batch: int, slot: int, finished: list[tuple[dict[str, float], Any]]) -> dict[str, float]:
    """Slot ``slot``'s unit-cube point, proposed by Optuna's TPE sampler from ``finished``
    (``(unit point, trial)`` of the cell's finished tuning trials, in slot order), each told
    its rank by the choice's order for the last target, then the earlier ones (0: best);
    seeded by ``sampler_seed``, the cell and the slot, so the same trials give the same point."""
    import warnings

    import optuna
    from optuna.distributions import FloatDistribution

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    names = [p.name for p in spec.optimizer(label).space]
    space = {name: FloatDistribution(0.0, 1.0) for name in names}
    order = sorted(range(len(finished)), key=lambda i: ([score(finished[i][1], t) for t in reversed(spec.targets)], i))
    rank = {index: position for position, index in enumerate(order)}
    digest = hashlib.sha256(f"{spec.sampler_seed}/{label}/{batch}/{slot}".encode()).hexdigest()
    sampler = optuna.samplers.TPESampler(seed=int(digest[:8], 16), n_startup_trials=0, multivariate=True)
    study = optuna.create_study(sampler=sampler)  # in memory, rebuilt each time from the storage's trials
    for index, (unit, _) in enumerate(finished):
        study.add_trial(optuna.trial.create_trial(params={n: unit[n] for n in names}, distributions=space, value=float(rank[index])))
    proposed = study.ask(space)
    return {name: float(f"{proposed.params[name]:.12g}") for name in names}


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
        keys = [ledger.trial_key(cell.optimizer, cell.batch, slot, spec.tune_seed) for slot in range(spec.trials)]
        queued: set[str] = set()
        finished: list[tuple[dict[str, float], Any]] = []
        for slot, key in enumerate(keys):
            history = cell.tune.get(key, [])
            complete = [t for t in history if _complete(t)]
            if slot >= len(points) and not all(_settled(cell, k, skipped, queued) for k in keys[:slot]):
                break  # a sequential point waits for every slot before it
            if needs(key, history):
                queued.add(key)
                unit = points[slot] if slot < len(points) else sequential_point(spec, cell.optimizer, cell.batch, slot, finished)
                attrs = _attrs(key, ledger.TUNE, cell, spec.tune_seed, f"1-{slot:04d}-{index:04d}", len(history) + 1)
                extra = {"slot": slot} if slot < len(points) else {"slot": slot, "unit": unit}
                wanted.append(Wanted(point_values(opt.space, unit, cell.batch, min(spec.batches)), {**attrs, **extra}))
            if complete:
                trial = complete[0]
                finished.append((points[slot] if slot < len(points) else ledger.attrs(trial)["unit"], trial))
        done = all(_settled(cell, k, skipped, queued) for k in keys)
        if not done:
            continue
        tune = [t for ts in cell.tune.values() for t in ts]
        chosen = {int(ledger.attrs(c)["slot"]): c for c in (best(tune, target) for target in spec.targets) if c is not None}
        for slot, trial in sorted(chosen.items()):
            for seed in spec.seeds:
                key = ledger.trial_key(cell.optimizer, cell.batch, slot, seed)
                history = cell.seeds.get(key, [])
                if needs(key, history):
                    attrs = _attrs(key, ledger.SEED, cell, seed, f"0-{index:04d}-{slot:04d}-{seed:08d}", len(history) + 1)
                    wanted.append(Wanted(dict(trial.params), {**attrs, "slot": slot}))
    return wanted, to_skip, blocked


def _settled(cell: Cell, key: str, skipped: set[str], queued: set[str]) -> bool:
    """Whether a tuning key is finished, or failed and skipped (and not queued again)."""
    return (key in skipped and key not in queued) or any(_complete(t) for t in cell.tune.get(key, []))


def _attrs(key: str, phase: str, cell: Cell, seed: int, order: str, attempt: int) -> dict[str, Any]:
    return {"key": key, "phase": phase, "optimizer": cell.optimizer, "batch": cell.batch, "seed": seed, "order": order, "attempt": attempt}
