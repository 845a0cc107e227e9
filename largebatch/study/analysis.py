"""From a study's trials to its findings: each cell's choice and its re-runs, steps to target
as median and range over seeds, efficiency, the fit, and what the data can separate.

**Reported split.** Steps to target are read on the test split of the re-runs (the
held-out split when the study names no test split): the tuning trials chose the
configuration on the held-out split, so their own figures are biased towards luck, and
the re-runs with fresh seeds are not.

**Over seeds.** A cell's steps are the median over its re-runs and their range (min, max);
a seed that did not reach the target counts as more steps than its budget, so a median
exists when more than half reached it, and the range is then open above. Efficiency at
batch B against the smallest batch B0 of the same optimizer is
``S(B0) B0 / (S(B) B)`` (1: perfect scaling), from the medians; its range takes the
extremes over every pair of seeds. A cell where no re-run reached the target bounds its
efficiency from above by its budget: ``S(B0) B0 / (budget B)``.

**Separated.** Two cells are separated when their seed ranges do not overlap and the gap
between them exceeds the resolution of both; ``comparisons`` lists every pair of
optimizers at each batch and every pair of neighbouring batches of each optimizer.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

from largebatch.study import fit as fitting
from largebatch.study import ledger, plan
from largebatch.study.space import edges
from largebatch.study.spec import StudySpec
from largebatch.study.target import crossing_of


@dataclasses.dataclass
class Rerun:
    seed: int
    number: int
    steps: float | None  # on the reported split; None: not reached
    resolution: float | None
    budget: int | None
    heldout_steps: float | None
    b_simple: float | None
    state: str


@dataclasses.dataclass
class CellResult:
    optimizer: str
    batch: int
    tuned: int = 0
    planned: int = 0
    best: dict[str, Any] | None = None  # number, params, held-out steps, final value, edges
    reruns: list[Rerun] = dataclasses.field(default_factory=list)
    failed: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    median: float | None = None
    low: float | None = None
    high: float | None = None  # None with a seed that did not reach the target (open range)
    budget: int | None = None
    resolution: float | None = None
    efficiency: float | None = None
    efficiency_range: tuple[float, float] | None = None
    efficiency_below: float | None = None
    b_simple: float | None = None
    b_simple_range: tuple[float, float] | None = None

    @property
    def key(self) -> str:
        return f"{self.optimizer}/b{self.batch}"


def collect(spec: StudySpec, trials: list[Any], skipped: set[str]) -> list[CellResult]:
    """Every cell's result from the study's trials."""
    from optuna.trial import TrialState

    reported = "test" if spec.data["test"] else "eval"
    smallest = min(spec.batches)
    results = []
    for (label, batch), cell in plan.cells(spec, trials).items():
        result = CellResult(label, batch, planned=spec.trials)
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
        chosen = plan.best(tune, spec.target)
        if chosen is not None:
            outcome = ledger.attrs(chosen)["outcome"]
            marks = edges(spec.optimizer(label).space, chosen.params, batch, smallest)
            crossing = crossing_of(chosen, spec.target)
            result.best = {
                "number": chosen.number,
                "params": dict(chosen.params),
                "heldout_steps": None if crossing is None else crossing.steps,
                "final_heldout": outcome.get("final_eval"),
                "edges": [{"param": p, "side": side, "position": round(u, 3)} for p, side, u in marks],
            }
        for _key, ts in sorted(cell.seeds.items(), key=lambda kv: ledger.attrs(kv[1][-1])["seed"]):
            last = ts[-1]
            if last.state != TrialState.COMPLETE or chosen is None or ledger.attrs(last).get("slot") != ledger.attrs(chosen).get("slot"):
                continue
            outcome = ledger.attrs(last)["outcome"]
            crossing = crossing_of(last, spec.target, reported)
            heldout = crossing_of(last, spec.target)
            noise = outcome.get("noise_at_loss") or {}
            result.reruns.append(
                Rerun(
                    seed=ledger.attrs(last)["seed"],
                    number=last.number,
                    steps=None if crossing is None else crossing.steps,
                    resolution=None if crossing is None else crossing.resolution,
                    budget=outcome.get("total_steps"),
                    heldout_steps=None if heldout is None else heldout.steps,
                    b_simple=_finite(noise.get("b_simple")),
                    state=str(outcome.get("stopped")),
                )
            )
        _summarise(result)
        results.append(result)
    _efficiencies(spec, results)
    return results


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _summarise(cell: CellResult) -> None:
    if not cell.reruns:
        return
    steps = sorted(math.inf if r.steps is None else r.steps for r in cell.reruns)
    middle = statistics.median(steps)
    cell.median = None if math.isinf(middle) else middle
    cell.low = None if math.isinf(steps[0]) else steps[0]
    cell.high = None if math.isinf(steps[-1]) else steps[-1]
    cell.budget = max((r.budget for r in cell.reruns if r.budget), default=None)
    resolutions = [r.resolution for r in cell.reruns if r.resolution is not None]
    cell.resolution = max(resolutions) if resolutions else None
    noise = [r.b_simple for r in cell.reruns if r.b_simple is not None]
    if noise:
        cell.b_simple = statistics.median(noise)
        cell.b_simple_range = (min(noise), max(noise))


def _efficiencies(spec: StudySpec, cells: list[CellResult]) -> None:
    for label in (o.label for o in spec.optimizers):
        mine = sorted((c for c in cells if c.optimizer == label), key=lambda c: c.batch)
        base = next((c for c in mine if c.median is not None), None)
        if base is None:
            continue
        base_steps = [r.steps for r in base.reruns if r.steps is not None]
        for cell in mine:
            ratio = base.batch / cell.batch
            if cell.median is not None:
                cell.efficiency = base.median * ratio / cell.median
                steps = [r.steps for r in cell.reruns if r.steps is not None]
                low = min(base_steps) * ratio / max(steps) if cell.high is not None else 0.0
                cell.efficiency_range = (low, max(base_steps) * ratio / min(steps))
            elif cell.budget and cell.reruns and all(r.steps is None for r in cell.reruns):
                cell.efficiency_below = base.median * ratio / cell.budget


@dataclasses.dataclass
class OptimizerResult:
    optimizer: str
    base_batch: int | None
    fit: fitting.Fit | None
    intervals: dict[str, fitting.Interval] | None
    points: int
    left_out: list[int]
    b20_fit: float | None
    b20_measured: float | None
    b20_measured_range: tuple[float | None, float | None]
    b_simple: float | None


def per_optimizer(spec: StudySpec, cells: list[CellResult], bootstrap_samples: int = 1000) -> list[OptimizerResult]:
    """The fit and the critical batches of each optimizer, from its re-runs that reached the target."""
    out = []
    for label in (o.label for o in spec.optimizers):
        mine = sorted((c for c in cells if c.optimizer == label), key=lambda c: c.batch)
        by_batch = {c.batch: [r.steps for r in c.reruns if r.steps is not None] for c in mine if c.median is not None}
        left_out = [c.batch for c in mine if c.reruns and c.median is None]
        points = [(b, s) for b, steps in by_batch.items() for s in steps]
        fit = fitting.fit_scaling(points)
        intervals = fitting.bootstrap(by_batch, samples=bootstrap_samples) if fit is not None else None
        base = next((c.batch for c in mine if c.median is not None), None)
        batches = [c.batch for c in mine]
        measured = fitting.crossing_batch(batches, [c.efficiency for c in mine], 1 / 1.2)
        low = fitting.crossing_batch(batches, [None if c.efficiency_range is None else c.efficiency_range[0] for c in mine], 1 / 1.2)
        high = fitting.crossing_batch(batches, [None if c.efficiency_range is None else c.efficiency_range[1] for c in mine], 1 / 1.2)
        noise = [r.b_simple for c in mine for r in c.reruns if r.b_simple is not None]
        out.append(
            OptimizerResult(
                optimizer=label,
                base_batch=base,
                fit=fit,
                intervals=intervals,
                points=len(points),
                left_out=left_out,
                b20_fit=None if fit is None or base is None else fitting.batch_at_overhead(fit, base),
                b20_measured=measured,
                b20_measured_range=(low, high),
                b_simple=statistics.median(noise) if noise else None,
            )
        )
    return out


def separated(a: CellResult, b: CellResult) -> bool | None:
    """Whether two cells' steps to target are told apart by the seeds and the resolution
    (None: a median is missing)."""
    if a.median is None or b.median is None:
        return None
    lo, hi = (a, b) if a.median <= b.median else (b, a)
    if lo.high is None or hi.low is None:
        return False
    margin = max(lo.resolution or 0.0, hi.resolution or 0.0)
    return hi.low > lo.high * (1 + margin)


def comparisons(spec: StudySpec, cells: list[CellResult]) -> list[dict[str, Any]]:
    """Pairs of cells and whether the data separate them: optimizers at each batch, then
    neighbouring batches of each optimizer."""
    by = {(c.optimizer, c.batch): c for c in cells}
    labels = [o.label for o in spec.optimizers]
    pairs = [(by[(x, b)], by[(y, b)]) for b in spec.batches for i, x in enumerate(labels) for y in labels[i + 1 :]]
    pairs += [(by[(x, b0)], by[(x, b1)]) for x in labels for b0, b1 in zip(spec.batches, spec.batches[1:], strict=False)]
    return [{"a": a.key, "b": b.key, "separated": separated(a, b)} for a, b in pairs]
