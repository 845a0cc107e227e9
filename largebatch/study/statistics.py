"""A study's statistics, from a table of runs: no Optuna, no files.

Each ``Run`` is one trial of one (optimizer, batch) cell: a tuning trial at one of the
cell's tuning points, or a re-run of a point with a fresh seed. A run reached the target
in ``steps`` or did not within the ``budget`` steps it ran (censored: "more than
``budget``"). ``findings`` turns the table into every number the report gives; the target
is whatever the table was read for, so one study's trials give one table per target.

**A cell's choice and its steps.** The choice is the tuning run that reached the target on
the held-out split in the fewest steps (none: the best held-out value at its end; ties:
the lower point), the rule the study re-ran. Its steps are the median and range of its
re-runs; a re-run that did not reach the target counts as more steps than any that did, so
a median exists when more than half reached it. Efficiency at batch B against the
optimizer's smallest batch B0 that has a median is ``S(B0) B0 / (S(B) B)`` (1: perfect
scaling), its range from the extremes over every pair of seeds; a cell where no re-run
reached the target bounds it from above by its budget.

**The fit** is ``largebatch.study.fit``'s censored maximum likelihood over every re-run of
the optimizer's cells, those that did not reach the target included.

**Bootstrap.** Each of ``samples`` replicates redraws, in every cell, (1) the tuning
choice: each tuning run's held-out log steps plus Gaussian noise of the seed-to-seed
standard deviation (pooled within cells over every cell's re-runs: what another tuning
seed would have measured; runs that did not reach the target stay behind those that did),
and the fewest is chosen again; (2) the seeds: the chosen point's re-runs drawn with
replacement, as many as it has. A point that was never re-run (a runner-up chosen in the
replicate) contributes its own tuning run, on the held-out split, the only split a tuning
run evaluates: one run with its censoring, not a seed mean. The fit on each replicate
gives percentile intervals for S_min, B_crit and E_min (and B_20%); the medians give the
pairwise ratios. The noise in (1) makes the choice's own variance count: a runner-up
within the seeds' spread of the winner is chosen in a share of the replicates, and its
steps move the intervals.

**Leave one batch out.** The fit without each batch in turn, and whether its B_crit falls
inside the full fit's interval (a fit that moves outside it when one batch is dropped rests
on that batch).

**Pairwise.** Two cells differ when the bootstrap interval of the ratio of their medians
excludes 1. When it does not, the seeds per cell that would separate them, were the
observed ratio the truth, are read from the interval's width on the side of 1, taken to
shrink as 1 / sqrt(seeds) (the part from the tuning choice does not shrink: a lower bound).

**B_20%.** Zhang et al. 2024 ("How Does Critical Batch Size Scale in Pre-training?",
arXiv:2410.21676) put the critical batch where the steps to target exceed linear
scaling by 20%. Against the fit's own perfect-scaling line, its small-batch limit
S -> E_min / B,

    S_min (1 + B_crit / B) = 1.2 S_min B_crit / B   =>   B + B_crit = 1.2 B_crit   =>   B_20% = 0.2 B_crit,

one solution for every fitted curve (the overhead S B / E_min = 1 + B / B_crit grows from 1
without bound); its interval is 0.2 times B_crit's. Against perfect scaling from the
smallest batch measured, B0, the same condition reads (B + B_crit) = 1.2 (B0 + B_crit),
B = 1.2 B0 + 0.2 B_crit: a figure set by the choice of B0 (given beside, not as the
critical batch). The other reading of "20%", steps 1.2 S_min (the large-batch limit), is
the diminishing-returns end, B = 5 B_crit, not the critical batch. The measured B_20% is
where the measured efficiency against B0 crosses 1/1.2 (interpolated in log batch).

**Recipes over seeds** (a study's ``arms``): two arms differ on a measure when the exact
two-sided rank test (Wilcoxon-Mann-Whitney, every split of the pooled seeds enumerated)
gives p at most the level; with a and b seeds it can give no less than 2 / C(a + b, a)
(a = b), so 3 seeds each never separate two arms and 4 are needed for 0.05. The ratio of
medians and its bootstrap interval (``compare``, the seeds resampled within each arm) are
given beside it, and the seeds that would separate a pair not separated.

**Resolution.** The relative width of the evaluations around each reported crossing:
the median over every crossing and the worst. The evaluation set's own noise beside it: a
proportion p measured on n samples has standard error sqrt(p (1 - p) / n); n is read from
the measured values themselves (a proportion over n samples is a whole number of n-ths),
and a shift of one standard error moves a crossing by SE / slope in log steps, with the
slope of the metric per log step between the two evaluations around it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from fractions import Fraction

import numpy as np

from largebatch.study import fit as fitting

OVERHEAD = 1.2  # Zhang et al. 2024's 20%


@dataclasses.dataclass(frozen=True)
class Run:
    """One trial, as the statistics see it.

    Attributes:
        optimizer, batch: its cell.
        point: the tuning point it runs (or repeats, for a re-run).
        seed: its seed.
        rerun: a re-run of the cell's choice (True) or a tuning run (False).
        steps: steps to target on the split reported (a tuning run: the held-out split, the
            only one it evaluates); None: not reached within ``budget``.
        budget: the steps it ran (a diverged run: the steps it was to run).
        resolution: the relative width of the evaluations around the crossing of ``steps``.
        heldout_steps: steps to target on the held-out split (the choice's); None: not reached.
        final_score: the held-out value at its end, lower is better (negated for a metric to
            maximise): the choice among runs that did not reach the target.
        slope: the metric's change per unit of log(step) across the crossing of ``steps``.
        b_simple: the noise-scale estimate at the study's fixed loss, when measured.
        b_simple_loss: the held-out loss of the evaluation it was read at (the first at or
            below the fixed loss: on a coarse grid, often well below it).
        number, stopped: the trial's number and why it stopped (for the record).
    """

    optimizer: str
    batch: int
    point: int
    seed: int
    rerun: bool
    steps: float | None
    budget: float
    resolution: float | None = None
    heldout_steps: float | None = None
    final_score: float = math.inf
    slope: float | None = None
    b_simple: float | None = None
    b_simple_loss: float | None = None
    number: int = -1
    stopped: str = ""


@dataclasses.dataclass(frozen=True)
class Interval:
    """A bootstrap percentile interval."""

    low: float
    high: float

    def __contains__(self, value: float) -> bool:
        return self.low <= value <= self.high

    def overlaps(self, other: Interval) -> bool:
        """Whether the two intervals share a value."""
        return self.low <= other.high and other.low <= self.high


@dataclasses.dataclass
class CellStats:
    """One cell's figures (steps on the reported split of its choice's re-runs)."""

    optimizer: str
    batch: int
    point: int | None = None
    reruns: list[Run] = dataclasses.field(default_factory=list)
    median: float | None = None
    low: float | None = None
    high: float | None = None  # None with a seed that did not reach the target (open range)
    budget: float | None = None
    resolution: float | None = None
    efficiency: float | None = None
    efficiency_range: tuple[float, float] | None = None
    efficiency_below: float | None = None
    margin: float | None = None  # runner-up's held-out steps over the choice's, less 1
    spread: float | None = None  # the re-runs' held-out steps, max over min less 1
    b_simple: float | None = None
    b_simple_range: tuple[float, float] | None = None

    @property
    def key(self) -> str:
        return f"{self.optimizer}/b{self.batch}"

    @property
    def tuning_decides(self) -> bool | None:
        """Whether the choice's margin over its runner-up lies within its seeds' spread."""
        return None if self.margin is None or self.spread is None else self.margin <= self.spread


@dataclasses.dataclass(frozen=True)
class LeftOut:
    """The fit without one batch."""

    batch: int
    fit: fitting.Fit | None
    inside: bool | None  # B_crit inside the full fit's interval; None without one


@dataclasses.dataclass
class OptimizerStats:
    """One optimizer's fit and critical batches."""

    optimizer: str
    base_batch: int | None = None
    fit: fitting.Fit | None = None
    intervals: dict[str, Interval] = dataclasses.field(default_factory=dict)
    left_out: list[LeftOut] = dataclasses.field(default_factory=list)
    b20: float | None = None
    b20_b0: float | None = None
    b20_measured: float | None = None
    b20_measured_range: tuple[float | None, float | None] = (None, None)
    b_simple: float | None = None
    b_simple_losses: tuple[float, float] | None = None  # the held-out losses it was read at


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Two cells: the ratio of their median steps (b over a) and its bootstrap interval."""

    a: str
    b: str
    ratio: float | None
    interval: Interval | None
    seeds: int = 0  # re-runs per cell now (the fewer of the two)
    seeds_needed: int | None = None  # when the interval holds 1: seeds that would separate them

    @property
    def separated(self) -> bool | None:
        if self.interval is None:
            return None
        return not (self.interval.low <= 1.0 <= self.interval.high)


@dataclasses.dataclass(frozen=True)
class Resolution:
    """Over every reported crossing: the median and worst relative width of its bracket,
    the evaluation set's size and standard error at the target, and the median relative
    move of a crossing under a shift of one standard error."""

    median: float | None
    worst: float | None
    crossings: int
    samples: int | None = None
    standard_error: float | None = None
    steps_per_error: float | None = None


@dataclasses.dataclass
class Findings:
    cells: list[CellStats]
    optimizers: list[OptimizerStats]
    comparisons: list[Comparison]
    resolution: Resolution


def choose(tuning: Sequence[Run]) -> Run | None:
    """The cell's choice among its tuning runs (see the module docstring)."""
    return min(tuning, key=_rank) if tuning else None


def _rank(run: Run) -> tuple[float, float, int]:
    return (math.inf if run.heldout_steps is None else run.heldout_steps, run.final_score, run.point)


def findings(
    runs: Sequence[Run],
    target: float | None = None,
    evaluated: int | None = None,
    samples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> Findings:
    """Every figure of the report from a table of runs.

    Args:
        runs: the table (any order).
        target: the target value, for the standard error of a proportion (None: not one).
        evaluated: the samples of the split the steps are read on (see ``sample_count``).
        samples: bootstrap replicates.
        level: the intervals' coverage.
        seed: the bootstrap's random seed (the same table and seed give the same figures).

    Returns:
        Per cell, per optimizer, the pairwise comparisons and the resolution.
    """
    groups = _cells(runs)
    cells = [_cell(opt, batch, tuning, reruns) for (opt, batch), (tuning, reruns) in groups.items()]
    optimizers = list(dict.fromkeys(c.optimizer for c in cells))
    for label in optimizers:
        _efficiencies([c for c in cells if c.optimizer == label])
    draws = bootstrap(runs, samples, seed)
    results = [_optimizer(label, cells, groups, draws, level) for label in optimizers]
    return Findings(cells, results, _comparisons(cells, draws, level), resolution([r for c in cells for r in c.reruns], target, evaluated))


def _cells(runs: Iterable[Run]) -> dict[tuple[str, int], tuple[list[Run], dict[int, list[Run]]]]:
    """(tuning runs, re-runs by point) per cell, optimizers in order of appearance, batches ascending."""
    out: dict[tuple[str, int], tuple[list[Run], dict[int, list[Run]]]] = {}
    order = list(dict.fromkeys(r.optimizer for r in runs))
    for run in sorted(runs, key=lambda r: (order.index(r.optimizer), r.batch, r.seed, r.number)):
        tuning, reruns = out.setdefault((run.optimizer, run.batch), ([], {}))
        if run.rerun:
            reruns.setdefault(run.point, []).append(run)
        else:
            tuning.append(run)
    return out


def _chosen_point(tuning: list[Run], reruns: dict[int, list[Run]]) -> int | None:
    chosen = choose(tuning)
    return chosen.point if chosen is not None else min(reruns, default=None)


def _cell(optimizer: str, batch: int, tuning: list[Run], by_point: dict[int, list[Run]]) -> CellStats:
    point = _chosen_point(tuning, by_point)
    cell = CellStats(optimizer, batch, point, list(by_point.get(point, [])) if point is not None else [])
    ranked = sorted(tuning, key=_rank)
    if len(ranked) >= 2 and ranked[0].heldout_steps is not None and ranked[1].heldout_steps is not None:
        cell.margin = ranked[1].heldout_steps / ranked[0].heldout_steps - 1
    heldout = [r.heldout_steps for r in cell.reruns]
    if len(heldout) >= 2:
        cell.spread = math.inf if None in heldout else max(heldout) / min(heldout) - 1  # type: ignore[type-var,operator]
    if not cell.reruns:
        return cell
    steps = sorted(math.inf if r.steps is None else r.steps for r in cell.reruns)
    middle = statistics.median(steps)
    cell.median = None if math.isinf(middle) else middle
    cell.low = None if math.isinf(steps[0]) else steps[0]
    cell.high = None if math.isinf(steps[-1]) else steps[-1]
    cell.budget = max(r.budget for r in cell.reruns)
    resolutions = [r.resolution for r in cell.reruns if r.resolution is not None]
    cell.resolution = max(resolutions) if resolutions else None
    noise = [r.b_simple for r in cell.reruns if r.b_simple is not None]
    if noise:
        cell.b_simple = statistics.median(noise)
        cell.b_simple_range = (min(noise), max(noise))
    return cell


def _efficiencies(mine: list[CellStats]) -> None:
    base = next((c for c in mine if c.median is not None), None)
    if base is None or base.median is None:
        return
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


def seed_sigma(runs: Iterable[Run]) -> float:
    """The seed-to-seed standard deviation of log held-out steps, pooled within cells over
    every point's re-runs that reached the target (0 with none to pool)."""
    groups: dict[tuple[str, int, int], list[float]] = {}
    for r in runs:
        if r.rerun and r.heldout_steps is not None:
            groups.setdefault((r.optimizer, r.batch, r.point), []).append(math.log(r.heldout_steps))
    squares = sum(float(np.sum((np.array(v) - np.mean(v)) ** 2)) for v in groups.values())
    freedom = sum(len(v) - 1 for v in groups.values())
    return math.sqrt(squares / freedom) if freedom > 0 else 0.0


Draws = list[dict[tuple[str, int], list[Run]]]


def bootstrap(runs: Sequence[Run], samples: int, seed: int = 0) -> Draws:
    """``samples`` replicates of every cell's runs, by cell (see the module docstring)."""
    rng = np.random.default_rng(seed)
    groups = _cells(runs)
    sigma = seed_sigma(r for _, reruns in groups.values() for rs in reruns.values() for r in rs)
    draws: Draws = []
    for _ in range(samples):
        replicate = {}
        for key, (tuning, by_point) in groups.items():
            point = _chosen_point(tuning, by_point)
            if len(tuning) >= 2 and sigma > 0:
                noise = rng.normal(0.0, sigma, size=len(tuning))
                point = min(
                    (
                        (math.log(r.heldout_steps) + e if r.heldout_steps is not None else math.inf, r.final_score, r.point, r)
                        for r, e in zip(tuning, noise, strict=True)
                    ),
                    key=lambda item: item[:3],
                )[3].point
            pool = by_point.get(point, []) if point is not None else []
            if pool:
                replicate[key] = [pool[i] for i in rng.integers(0, len(pool), size=len(pool))]
            elif by_point:  # a re-run cell whose replicate chose a point never re-run
                replicate[key] = [r for r in tuning if r.point == point][:1]
            else:  # not re-run yet: no figures, as in the fit to the data
                replicate[key] = []
        draws.append(replicate)
    return draws


def _points(runs: Iterable[Run]) -> list[fitting.Point]:
    return [fitting.Point(r.batch, r.steps, r.budget) for r in runs]


def _interval(values: Sequence[float], level: float) -> Interval:
    tail = (1 - level) / 2
    low, high = np.quantile(np.array(values, dtype=float), [tail, 1 - tail], method="inverted_cdf")
    return Interval(float(low), float(high))


def _optimizer(label: str, cells: list[CellStats], groups, draws: Draws, level: float) -> OptimizerStats:
    mine = [c for c in cells if c.optimizer == label]
    out = OptimizerStats(label, base_batch=next((c.batch for c in mine if c.median is not None), None))
    out.fit = fitting.fit_scaling(_points(r for c in mine for r in c.reruns))
    batches = [c.batch for c in mine]
    out.b20_measured = fitting.crossing_batch(batches, [c.efficiency for c in mine], 1 / OVERHEAD)
    out.b20_measured_range = (
        fitting.crossing_batch(batches, [None if c.efficiency_range is None else c.efficiency_range[0] for c in mine], 1 / OVERHEAD),
        fitting.crossing_batch(batches, [None if c.efficiency_range is None else c.efficiency_range[1] for c in mine], 1 / OVERHEAD),
    )
    noise = [r.b_simple for c in mine for r in c.reruns if r.b_simple is not None]
    out.b_simple = statistics.median(noise) if noise else None
    losses = [r.b_simple_loss for c in mine for r in c.reruns if r.b_simple is not None and r.b_simple_loss is not None]
    out.b_simple_losses = (min(losses), max(losses)) if losses else None
    if out.fit is None:
        return out
    out.b20 = (OVERHEAD - 1) * out.fit.b_crit
    if out.base_batch is not None:
        out.b20_b0 = OVERHEAD * out.base_batch + (OVERHEAD - 1) * out.fit.b_crit
    keys = [(c.optimizer, c.batch) for c in mine]
    fits = [fitting.fit_scaling(_points(r for k in keys for r in replicate[k])) for replicate in draws]
    fits = [f for f in fits if f is not None]
    if fits:
        out.intervals = {
            "s_min": _interval([f.s_min for f in fits], level),
            "b_crit": _interval([f.b_crit for f in fits], level),
            "e_min": _interval([f.e_min for f in fits], level),
            "b20": _interval([(OVERHEAD - 1) * f.b_crit for f in fits], level),
        }
    for batch in batches:
        refit = fitting.fit_scaling(_points(r for c in mine if c.batch != batch for r in c.reruns))
        band = out.intervals.get("b_crit")
        out.left_out.append(LeftOut(batch, refit, None if refit is None or band is None else refit.b_crit in band))
    return out


def _median_steps(runs: Sequence[Run]) -> float:
    return statistics.median(math.inf if r.steps is None else r.steps for r in runs) if runs else math.nan


def _comparisons(cells: list[CellStats], draws: Draws, level: float) -> list[Comparison]:
    """Optimizers at each batch, then neighbouring batches of each optimizer."""
    by = {(c.optimizer, c.batch): c for c in cells}
    labels = list(dict.fromkeys(c.optimizer for c in cells))
    batches = sorted({c.batch for c in cells})
    pairs = [
        (by[(x, b)], by[(y, b)]) for b in batches for i, x in enumerate(labels) for y in labels[i + 1 :] if (x, b) in by and (y, b) in by
    ]
    for x in labels:
        mine = [c for c in cells if c.optimizer == x]
        pairs += list(zip(mine, mine[1:], strict=False))
    return [compare(a, b, draws, level) for a, b in pairs]


def compare(a: CellStats, b: CellStats, draws: Draws, level: float = 0.95) -> Comparison:
    """The ratio of b's median steps to a's, its bootstrap interval, and the seeds that would
    separate them (see the module docstring); no interval unless both medians exist."""
    seeds = min(len(a.reruns), len(b.reruns))
    if a.median is None or b.median is None or not draws:
        return Comparison(a.key, b.key, None, None, seeds)
    ratio = b.median / a.median
    ratios = []
    for replicate in draws:
        top, bottom = _median_steps(replicate.get((b.optimizer, b.batch), [])), _median_steps(replicate.get((a.optimizer, a.batch), []))
        ratios.append(1.0 if math.isinf(top) and math.isinf(bottom) else top / bottom)
    interval = _interval(ratios, level)
    needed = None
    if interval.low <= 1.0 <= interval.high and ratio != 1.0:
        width = math.log(ratio / interval.low) if ratio > 1 else math.log(interval.high / ratio)
        needed = math.ceil(seeds * (width / abs(math.log(ratio))) ** 2) if math.isfinite(width) else None
    return Comparison(a.key, b.key, ratio, interval, seeds, needed)


def sample_count(values: Iterable[float], largest: int = 10**6) -> int | None:
    """The number of samples behind proportions measured on one set: the least common
    denominator of the values as fractions (None when they are not proportions of one set
    of at most ``largest`` samples)."""
    count = 1
    for value in values:
        if not 0.0 <= value <= 1.0:
            return None
        fraction = Fraction(value).limit_denominator(largest)
        if abs(float(fraction) - value) > 1e-13:  # a stored k / n is off by a rounding; other numbers by far more
            return None
        count = count * fraction.denominator // math.gcd(count, fraction.denominator)
        if count > largest:
            return None
    return count if count > 1 else None


def proportion_se(p: float, samples: int) -> float:
    """The standard error of a proportion ``p`` measured on ``samples`` samples."""
    return math.sqrt(p * (1 - p) / samples)


def resolution(runs: Sequence[Run], target: float | None = None, samples: int | None = None) -> Resolution:
    """The median and worst resolution over the runs' crossings, with the evaluation set's
    standard error at ``target`` on ``samples`` samples (a proportion) and the median
    relative move of a crossing it makes."""
    widths = sorted(r.resolution for r in runs if r.steps is not None and r.resolution is not None)
    out = Resolution(statistics.median(widths) if widths else None, widths[-1] if widths else None, len(widths))
    if target is None or samples is None or not 0 < target < 1:
        return out
    error = proportion_se(target, samples)
    moves = [math.expm1(error / abs(r.slope)) for r in runs if r.steps is not None and r.slope]
    return dataclasses.replace(out, samples=samples, standard_error=error, steps_per_error=statistics.median(moves) if moves else None)


def rank_sum_test(a: Sequence[float], b: Sequence[float]) -> float:
    """The exact two-sided permutation p-value of the difference in mean ranks between the
    values of ``a`` and ``b`` (the Wilcoxon-Mann-Whitney test, by enumeration of every split
    of the pooled values; ties share their ranks, infinities rank last or first): the share
    of splits whose difference is at least the one observed."""
    pooled = [*a, *b]
    order = sorted(range(len(pooled)), key=lambda i: pooled[i])
    ranks = [0.0] * len(pooled)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and pooled[order[end + 1]] == pooled[order[start]]:
            end += 1
        for i in order[start : end + 1]:
            ranks[i] = (start + end) / 2 + 1
        start = end + 1
    total = sum(ranks)

    def gap(chosen: Sequence[int]) -> float:
        mine = sum(ranks[i] for i in chosen)
        return abs(mine / len(a) - (total - mine) / len(b))

    observed = gap(range(len(a)))
    splits = [gap(c) for c in itertools.combinations(range(len(pooled)), len(a))]
    return sum(g >= observed - 1e-9 for g in splits) / len(splits)


def smallest_p(a: int, b: int) -> float:
    """The smallest p-value ``rank_sum_test`` can give with ``a`` and ``b`` seeds (every
    value of one arm beyond every value of the other): 2 / C(a + b, a) with a = b."""
    return rank_sum_test(range(a), range(a, a + b))


def seeds_to_resolve(alpha: float = 0.05) -> int:
    """The fewest seeds per arm (the same in both) at which ``rank_sum_test`` can reach ``alpha``."""
    return next(n for n in range(2, 64) if smallest_p(n, n) <= alpha)


@dataclasses.dataclass(frozen=True)
class SeedComparison:
    """Two arms on one measure: the ratio of medians (b over a) with its bootstrap interval
    over seeds, the rank test's p-value and the smallest it could give with these seeds."""

    a: str
    b: str
    ratio: float | None
    interval: Interval | None
    p: float
    smallest_p: float
    alpha: float
    seeds_needed: int | None  # when not separated: seeds per arm that would separate them, were the ratio as measured

    @property
    def separated(self) -> bool:
        """Whether the test separates them: p at most alpha (never when the seeds cannot reach it)."""
        return self.p <= self.alpha


def seed_comparisons(
    values: dict[str, list[float | None]], lower_is_better: bool = True, samples: int = 1000, alpha: float = 0.05, seed: int = 0
) -> list[SeedComparison]:
    """Every pair of arms (in ``values``' order) on one measure (per arm, one value per seed;
    None: not reached, or not measured, the worst), each compared with ``rank_sum_test`` and
    ``compare``'s bootstrap ratio of medians. Not separated, the seeds that would separate
    them: ``compare``'s estimate from the interval's width, and at least ``seeds_to_resolve``."""
    worst = math.inf if lower_is_better else -math.inf
    runs = [  # a value to maximise not measured (a diverged run) has no place in a ratio of medians: left out of it
        Run(label, 0, 0, index, True, v, 0.0, number=index)
        for label, found in values.items()
        for index, v in enumerate(found)
        if lower_is_better or v is not None
    ]
    groups = _cells(runs)
    cells = {label: _cell(label, 0, *groups[(label, 0)]) for label in values if (label, 0) in groups}
    draws = bootstrap(runs, samples, seed)
    floor = seeds_to_resolve(alpha)
    out = []
    labels = list(cells)
    for i, x in enumerate(labels):
        for y in labels[i + 1 :]:
            found = compare(cells[x], cells[y], draws, 1 - alpha)
            ratio, interval = found.ratio, found.interval
            a = [worst if v is None else v for v in values[x]]
            b = [worst if v is None else v for v in values[y]]
            p = rank_sum_test(a, b)
            needed = None
            if p > alpha and ratio is not None and ratio != 1:
                needed = max(floor, found.seeds_needed or 0) if found.seeds_needed is not None or found.separated else None
            out.append(SeedComparison(x, y, ratio, interval, p, smallest_p(len(a), len(b)), alpha, needed))
    return out
