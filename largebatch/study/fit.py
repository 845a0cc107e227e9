"""The steps-samples trade-off of McCandlish et al. 2018, fitted by a censored likelihood.

"An Empirical Model of Large-Batch Training" (arXiv:1812.06162, eq. 2.11) models the
optimizer steps S and samples E = S B needed to reach a given loss at batch B as

    S = S_min (1 + B_crit / B),        E = E_min (1 + B / B_crit),        E_min = S_min B_crit,

the same curve in two forms: (S / S_min - 1)(E / E_min - 1) = 1.

**Every run counts.** ``fit_scaling`` takes each run as a ``Point``: the batch, the steps
it took to reach the target, or None when it had not reached it within the ``budget``
steps it ran. Log steps are modelled as the curve plus Gaussian noise of a fitted
standard deviation sigma; a run that reached the target contributes the density of its
log steps, one that did not contributes the probability that its log steps exceed
log(budget) (a censored, Tobit, likelihood). Dropping the runs that did not finish would
keep only the lucky draws at the batches where the budget is tight and bend the curve
down there; counting them as "more than their budget" uses what they say.

The likelihood is maximised over S_min, B_crit and sigma: B_crit on a grid over
log B_crit, refined on a 60 times finer grid around its maximum, and for each B_crit
(S_min, sigma) by Newton's method in Olsen's parameters (log S_min / sigma, 1 / sigma),
in which the censored likelihood is concave (Olsen 1978, "Note on the Uniqueness of the
Maximum Likelihood Estimator for the Tobit Model"), so the inner maximum is unique.
sigma is held at least ``SIGMA_FLOOR``: steps read off evaluations are not known more
finely, and a curve through every point would otherwise have an unbounded likelihood.

A B_crit at the end of the searched span (1/1000 of the smallest batch to 1000 times the
largest) means the data show no bend: steps fall as 1/B throughout (B_crit above the
batches measured) or not at all (below them); ``bounded`` says which.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from scipy.special import log_ndtr

SPAN = 1000.0  # B_crit searched from smallest batch / SPAN to largest batch x SPAN
SIGMA_FLOOR = 1e-3  # the smallest noise of log steps the fit allows (0.1% in steps)
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


class Point(NamedTuple):
    """One run: its batch, its steps to target (None: not reached within ``budget`` steps)."""

    batch: float
    steps: float | None
    budget: float


@dataclasses.dataclass(frozen=True)
class Fit:
    """A fitted S = S_min (1 + B_crit / B).

    Attributes:
        s_min, b_crit: the fitted constants (E_min = S_min B_crit).
        sigma: the fitted standard deviation of log steps about the curve.
        bounded: '' for an interior fit; 'above' or 'below' when B_crit sits at the end of
            the searched span (the data bound it, they do not locate it).
        reached, censored: the runs that reached the target and those that did not.
    """

    s_min: float
    b_crit: float
    sigma: float
    bounded: str = ""
    reached: int = 0
    censored: int = 0

    @property
    def e_min(self) -> float:
        return self.s_min * self.b_crit

    def steps(self, batch: float) -> float:
        return self.s_min * (1 + self.b_crit / batch)


def _tobit(z: np.ndarray, censor: np.ndarray, hit: np.ndarray, a: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, ...]:
    """Log-likelihood, gradient and Hessian in Olsen's (a, h) = (mu / sigma, 1 / sigma), for
    every row of ``z`` (log steps less the curve's shape; rows: B_crit values) at once.
    ``hit``: reached (density at ``z``); otherwise censored above ``censor``."""
    a2, h2 = a[:, None], h[:, None]
    r = h2 * z - a2  # reached: standardised residual
    u = a2 - h2 * censor  # censored: log P(log steps > log budget) = log Phi(u)
    log_phi_u = log_ndtr(u)
    mills = np.exp(-0.5 * u**2 - _HALF_LOG_2PI - log_phi_u)
    curvature = -mills * (u + mills)
    ll = np.where(hit, np.log(h2) - _HALF_LOG_2PI - 0.5 * r**2, log_phi_u).sum(axis=1)
    g_a = np.where(hit, r, mills).sum(axis=1)
    g_h = np.where(hit, 1 / h2 - r * z, -mills * censor).sum(axis=1)
    h_aa = np.where(hit, -1.0, curvature).sum(axis=1)
    h_ah = np.where(hit, z, -curvature * censor).sum(axis=1)
    h_hh = np.where(hit, -1 / h2**2 - z**2, curvature * censor**2).sum(axis=1)
    return ll, g_a, g_h, h_aa, h_ah, h_hh


def _profile(log_b: np.ndarray, log_y: np.ndarray, hit: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, ...]:
    """(log-likelihood, log S_min, sigma) maximised over S_min and sigma at each log B_crit of ``grid``."""
    shape = np.log1p(np.exp(grid[:, None] - log_b[None, :]))
    z = log_y[None, :] - shape  # log S_min plus noise, for reached runs; the censoring point otherwise
    h_max = 1 / SIGMA_FLOOR
    reached = np.where(hit, z, np.nan)
    mu = np.nanmean(reached, axis=1)
    spread = np.nanstd(reached, axis=1)
    sigma = np.clip(np.where(np.isfinite(spread) & (spread > 0), spread, 0.1), SIGMA_FLOOR, None)
    a, h = mu / sigma, 1 / sigma
    state = _tobit(z, z, hit, a, h)
    for _ in range(100):
        ll, g_a, g_h, h_aa, h_ah, h_hh = state
        det = h_aa * h_hh - h_ah**2
        step_a = np.where(det > 0, -(h_hh * g_a - h_ah * g_h) / det, g_a / np.abs(h_aa))
        step_h = np.where(det > 0, -(h_aa * g_h - h_ah * g_a) / det, 0.0)
        pinned = (h >= h_max) & (step_h > 0)  # at the noise floor: maximise over a alone
        step_a = np.where(pinned, -g_a / h_aa, step_a)
        step_h = np.where(pinned, 0.0, step_h)
        scale = np.ones_like(a)
        for _ in range(40):  # halve a row's step until its likelihood does not fall (and h stays positive)
            new_a, new_h = a + scale * step_a, np.minimum(h + scale * step_h, h_max)
            new_h = np.where(new_h > 0, new_h, h / 2)
            state = _tobit(z, z, hit, new_a, new_h)
            bad = state[0] < ll - 1e-12
            if not bad.any():
                break
            scale = np.where(bad, scale / 2, scale)
        moved = np.maximum(np.abs(new_a - a), np.abs(new_h - h) / h)
        a, h = new_a, new_h
        if np.all(moved < 1e-10):
            break
    ll = state[0]
    return ll, a / h, 1 / h


def fit_scaling(points: Sequence[Point]) -> Fit | None:
    """The maximum-likelihood S = S_min (1 + B_crit / B) over every run, censored ones
    included; None unless runs reached the target at two or more distinct batches."""
    batches = np.array([p.batch for p in points], dtype=float)
    hit = np.array([p.steps is not None for p in points], dtype=bool)
    values = np.array([p.budget if p.steps is None else p.steps for p in points], dtype=float)
    if len(set(batches[hit].tolist())) < 2 or np.any(values <= 0):
        return None
    log_b, log_y = np.log(batches), np.log(values)
    lo, hi = math.log(batches.min() / SPAN), math.log(batches.max() * SPAN)
    grid = np.linspace(lo, hi, 121)
    i = int(np.argmax(_profile(log_b, log_y, hit, grid)[0]))
    fine = np.linspace(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)], 121)  # the cells around the maximum, 60x finer
    ll, log_smin, sigma = _profile(log_b, log_y, hit, fine)
    j = int(np.argmax(ll))
    bounded = "above" if i >= len(grid) - 2 else "below" if i <= 1 else ""
    return Fit(math.exp(log_smin[j]), math.exp(fine[j]), float(sigma[j]), bounded, int(hit.sum()), int((~hit).sum()))


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
