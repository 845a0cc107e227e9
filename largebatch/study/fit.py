"""The steps-samples trade-off of McCandlish et al. 2018, fitted, with a bootstrap over seeds.

"An Empirical Model of Large-Batch Training" (arXiv:1812.06162, eq. 2.11) models the
optimizer steps S and samples E = S B needed to reach a given loss at batch B as

    S = S_min (1 + B_crit / B),        E = E_min (1 + B / B_crit),        E_min = S_min B_crit,

the same curve in two forms: (S / S_min - 1)(E / E_min - 1) = 1. ``fit_scaling`` fits it
to measured (batch, steps) pairs by least squares on log(steps), with S_min in closed
form for each B_crit (the mean log residual) and B_crit found on a grid over log B_crit,
refined on a 200 times finer grid around its minimum. A B_crit at the end of the searched span (1/1000 of the
smallest batch to 1000 times the largest) means the data show no bend: steps fall as 1/B
throughout (B_crit above the batches measured) or not at all (below them); ``bounded``
says which.

``bootstrap`` resamples the seeds of each batch with replacement (stratified by batch) and
refits, giving percentile intervals for S_min, B_crit and E_min.

Zhang et al. 2024 ("How Does Critical Batch Size Scale in Pre-training?") place the
critical batch where the steps exceed perfect scaling by 20%; against perfect scaling from
the smallest batch B0 measured, the fitted curve crosses that line at
``B = 1.2 B0 + 0.2 B_crit`` (``batch_at_overhead``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

SPAN = 1000.0  # B_crit searched from smallest batch / SPAN to largest batch x SPAN


@dataclasses.dataclass(frozen=True)
class Fit:
    """A fitted S = S_min (1 + B_crit / B).

    Attributes:
        s_min, b_crit, e_min: the fitted constants (E_min = S_min B_crit).
        rms_log: root-mean-square residual of log(steps).
        bounded: '' for an interior fit; 'above' or 'below' when B_crit sits at the end of
            the searched span (the data bound it, they do not locate it).
    """

    s_min: float
    b_crit: float
    rms_log: float
    bounded: str = ""

    @property
    def e_min(self) -> float:
        return self.s_min * self.b_crit

    def steps(self, batch: float) -> float:
        return self.s_min * (1 + self.b_crit / batch)


def _profile(log_b: np.ndarray, log_s: np.ndarray, log_bcrit: float) -> tuple[float, float]:
    """(sum of squared log residuals, log S_min) for one B_crit."""
    shape = np.log1p(np.exp(log_bcrit - log_b))
    log_smin = float(np.mean(log_s - shape))
    residual = log_s - log_smin - shape
    return float(np.sum(residual**2)), log_smin


def _losses(log_b: np.ndarray, log_s: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The profile's loss at every point of ``grid`` (log B_crit) at once."""
    residuals = log_s[None, :] - np.log1p(np.exp(grid[:, None] - log_b[None, :]))
    return np.sum((residuals - residuals.mean(axis=1, keepdims=True)) ** 2, axis=1)


def fit_scaling(points: Sequence[tuple[float, float]]) -> Fit | None:
    """Least-squares fit of log(steps) to log(S_min (1 + B_crit / B)); None with fewer
    than two distinct batch sizes."""
    batches = np.array([b for b, _ in points], dtype=float)
    steps = np.array([s for _, s in points], dtype=float)
    if len(set(batches.tolist())) < 2 or np.any(steps <= 0):
        return None
    log_b, log_s = np.log(batches), np.log(steps)
    lo, hi = math.log(batches.min() / SPAN), math.log(batches.max() * SPAN)
    grid = np.linspace(lo, hi, 801)
    losses = _losses(log_b, log_s, grid)
    i = int(np.argmin(losses))
    fine = np.linspace(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)], 401)  # the cell around the minimum, 200x finer
    best = float(fine[int(np.argmin(_losses(log_b, log_s, fine)))])
    loss, log_smin = _profile(log_b, log_s, best)
    bounded = "above" if i >= len(grid) - 2 else "below" if i <= 1 else ""
    return Fit(math.exp(log_smin), math.exp(best), math.sqrt(loss / len(steps)), bounded)


@dataclasses.dataclass(frozen=True)
class Interval:
    """A bootstrap percentile interval."""

    low: float
    high: float


def bootstrap(by_batch: dict[int, list[float]], samples: int = 1000, level: float = 0.95, seed: int = 0) -> dict[str, Interval] | None:
    """Percentile intervals of ``s_min``, ``b_crit`` and ``e_min`` from refits on the seeds
    of each batch resampled with replacement; None when the data cannot be fitted."""
    rng = np.random.default_rng(seed)
    batches = sorted(b for b, steps in by_batch.items() if steps)
    if len(batches) < 2:
        return None
    draws: dict[str, list[float]] = {"s_min": [], "b_crit": [], "e_min": []}
    for _ in range(samples):
        points = [(b, float(s)) for b in batches for s in rng.choice(by_batch[b], size=len(by_batch[b]), replace=True)]
        fit = fit_scaling(points)
        if fit is None:
            continue
        draws["s_min"].append(fit.s_min)
        draws["b_crit"].append(fit.b_crit)
        draws["e_min"].append(fit.e_min)
    tail = 100 * (1 - level) / 2
    return {k: Interval(float(np.percentile(v, tail)), float(np.percentile(v, 100 - tail))) for k, v in draws.items()}


def batch_at_overhead(fit: Fit, smallest: float, overhead: float = 1.2) -> float:
    """The batch where the fitted steps exceed perfect scaling from ``smallest`` by ``overhead``
    (Zhang et al. 2024's critical batch at 1.2): (B + B_crit) / (B0 + B_crit) = overhead."""
    return overhead * smallest + (overhead - 1) * fit.b_crit


def crossing_batch(batches: Sequence[float], efficiency: Sequence[float | None], threshold: float) -> float | None:
    """Where measured efficiency first falls below ``threshold``, interpolated linearly in
    log(batch) between the last batch above it and the first below; None when it never does
    (or the first batch is already below)."""
    pairs = [(b, e) for b, e in zip(batches, efficiency, strict=True) if e is not None]
    for (b0, e0), (b1, e1) in zip(pairs, pairs[1:], strict=False):
        if e0 >= threshold > e1:
            share = (e0 - threshold) / (e0 - e1)
            return math.exp(math.log(b0) + share * (math.log(b1) - math.log(b0)))
    return None
