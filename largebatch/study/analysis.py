"""From a study's trials to its findings: the table of runs for one target, each cell's
choice and trials, and the statistics of ``largebatch.study.statistics``.

**The table.** Every finished trial is one ``statistics.Run`` (the last attempt of each
key; failed and duplicate trials are left out). Its steps to the target are read from the
evaluations it recorded (``outcome['curve']``: step, held-out value, test value, held-out
loss), so any target on the study's metric can be read from the same trials: a tuning
trial on the held-out split, the only one it evaluates; a re-run on the test split (the
held-out split when the study names no test split), which no choice was made on. A run
that did not reach the target is censored at the steps it ran (a diverged run: at its
whole budget, which it could not have used to reach it).

**The choice** is ``statistics.choose``'s, the rule ``plan.best`` re-ran: for the study's
own target, the two agree by construction; for another target, a cell's choice may be a
point that was never re-run, and the cell then has no re-runs to report.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from largebatch.study import ledger, plan, statistics
from largebatch.study.space import edges
from largebatch.study.spec import StudySpec, Target
from largebatch.study.target import first_crossing

HELDOUT, TEST, LOSS = 1, 2, 3  # columns of a recorded curve (LOSS: the held-out loss)


@dataclasses.dataclass
class CellResult:
    """A cell's trials as the report shows them, and its statistics."""

    stats: statistics.CellStats
    tuned: int = 0
    planned: int = 0
    best: dict[str, Any] | None = None  # number, params, held-out steps, final value, edges
    failed: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def optimizer(self) -> str:
        return self.stats.optimizer

    @property
    def batch(self) -> int:
        return self.stats.batch

    @property
    def key(self) -> str:
        return self.stats.key


def runs(spec: StudySpec, trials: list[Any], target: Target | None = None) -> list[statistics.Run]:
    """The table of runs for ``target`` (default: the study's) from the study's trials."""
    from optuna.trial import TrialState

    target = target or spec.target
    if target.metric != spec.target.metric:
        raise ValueError(f"the trials recorded {spec.target.metric}, not {target.metric}")
    reported = TEST if spec.data["test"] else HELDOUT
    table = []
    for cell in plan.cells(spec, trials).values():
        for ts in (*cell.tune.values(), *cell.seeds.values()):
            last = ts[-1]
            if last.state == TrialState.COMPLETE:
                table.append(_run(last, target, reported))
    return table


def _run(trial: Any, target: Target, reported: int) -> statistics.Run:
    info = ledger.attrs(trial)
    outcome = info["outcome"]
    rerun = info.get("phase") != ledger.TUNE
    curve = outcome.get("curve") or []
    column = reported if rerun else HELDOUT
    crossing = first_crossing(((p[0], p[column]) for p in curve), target.value, target.mode)
    heldout = first_crossing(((p[0], p[HELDOUT]) for p in curve), target.value, target.mode)
    values = [p[HELDOUT] for p in curve if p[HELDOUT] is not None]
    final = values[-1] if values else None
    stopped = str(outcome.get("stopped"))
    ran = outcome.get("steps_run", outcome.get("total_steps"))
    slope = None
    if crossing is not None and crossing.lo > 0:
        at = {p[0]: p[column] for p in curve}
        if at.get(crossing.lo) is not None and at.get(crossing.hi) is not None:
            slope = (at[crossing.hi] - at[crossing.lo]) / math.log(crossing.hi / crossing.lo)
    noise_at = outcome.get("noise_at_loss") or {}
    noise = noise_at.get("b_simple")
    step = noise_at.get("step")  # from the storage: compared, never converted (an infinite or NaN step matches nothing)
    noise_loss = next((p[LOSS] for p in curve if len(p) > LOSS and p[0] == step), None) if isinstance(step, int | float) else None
    return statistics.Run(
        optimizer=info["optimizer"],
        batch=int(info["batch"]),
        point=int(info.get("slot", 0)),
        seed=int(info["seed"]),
        rerun=rerun,
        steps=None if crossing is None else crossing.steps,
        budget=float(outcome["total_steps"] if stopped == "diverged" else ran),
        resolution=None if crossing is None else crossing.resolution,
        heldout_steps=None if heldout is None else heldout.steps,
        final_score=math.inf if final is None else (-final if target.mode == "max" else final),
        slope=slope,
        b_simple=float(noise) if isinstance(noise, int | float) and math.isfinite(noise) else None,
        b_simple_loss=float(noise_loss) if isinstance(noise_loss, int | float) and math.isfinite(noise_loss) else None,
        number=trial.number,
        stopped=stopped,
    )


def evaluated_samples(spec: StudySpec, trials: list[Any]) -> int | None:
    """The samples of the reported split, read from the proportions the re-runs measured on
    it (``statistics.sample_count``)."""
    column = TEST if spec.data["test"] else HELDOUT
    values = [
        p[column]
        for t in trials
        if ledger.attrs(t).get("phase") == ledger.SEED
        for p in (ledger.attrs(t).get("outcome") or {}).get("curve") or []
        if p[column] is not None
    ]
    return statistics.sample_count(values) if values else None


def collect(
    spec: StudySpec, trials: list[Any], skipped: set[str], target: Target | None = None, samples: int = 1000
) -> tuple[list[CellResult], statistics.Findings]:
    """Every cell's trials and the study's statistics for ``target`` (default: the study's)."""
    from optuna.trial import TrialState

    target = target or spec.target
    table = runs(spec, trials, target)
    proportion = target.value if target.mode == "max" and 0 < target.value < 1 else None
    found = statistics.findings(table, proportion, evaluated_samples(spec, trials), samples=samples)
    stats = {(c.optimizer, c.batch): c for c in found.cells}
    smallest = min(spec.batches)
    results = []
    for (label, batch), cell in plan.cells(spec, trials).items():
        result = CellResult(stats.get((label, batch)) or statistics.CellStats(label, batch), planned=spec.trials)
        tune = [t for ts in cell.tune.values() for t in ts]
        result.tuned = sum(1 for t in tune if t.state == TrialState.COMPLETE)
        for ts in (*cell.tune.values(), *cell.seeds.values()):
            last = ts[-1]
            if last.state == TrialState.FAIL:
                info = ledger.attrs(last)
                result.failed.append(
                    {
                        "key": info["key"],
                        "number": last.number,
                        "failure": info.get("failure"),
                        "error": info.get("error", ""),
                        "skipped": info["key"] in skipped,
                    }
                )
        point = result.stats.point
        chosen = next((t for t in reversed(tune) if t.state == TrialState.COMPLETE and ledger.attrs(t).get("slot") == point), None)
        if chosen is not None:
            run = next(r for r in table if r.number == chosen.number)
            marks = edges(spec.optimizer(label).space, chosen.params, batch, smallest)
            result.best = {
                "number": chosen.number,
                "params": dict(chosen.params),
                "heldout_steps": run.heldout_steps,
                "final_heldout": None if math.isinf(run.final_score) else (-run.final_score if target.mode == "max" else run.final_score),
                "edges": [{"param": p, "side": side, "position": round(u, 3)} for p, side, u in marks],
            }
        results.append(result)
    return results, found
