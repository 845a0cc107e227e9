"""The critical batch along training, measured by branching (Merrill et al. 2025).

"Critical Batch Size Revisited" (Merrill, Arora, Groeneveld, Hajishirzi 2025,
arXiv:2505.23971) measures the critical batch at a point of training directly: from a
checkpoint of a run at batch B, short branches are trained at k x B (k = 1, 2, 4, 8, ...)
for the same number of samples, the learning rate scaled by the optimizer's rule, and the
critical batch is the largest k x B whose loss stays within a tolerance of the k = 1
branch. Repeated at checkpoints along the run it gives CBS(t), which grows as the loss
falls.

**The rule here** (``critical``). The loss is the held-out loss (``eval/loss``) at the end of
each branch, with the held-out loss of the checkpoint itself, ``L0``, measured at the
start. The tolerance is a fraction of the k = 1 branch's progress: branch k is efficient
when

    L0 - L(k) >= (1 - tolerance) (L0 - L(1)),

that is, when it makes at least ``1 - tolerance`` of the progress the base batch makes
from the same samples. (Merrill et al. compare the smoothed training loss against an
absolute tolerance; on a multi-epoch data set the held-out loss is the unbiased one, and
a tolerance relative to the branch's progress changes little with the branch's length,
where an absolute gap widens in proportion to it. Branches should still be short against
the run: as the loss approaches its floor every branch's progress saturates and the
efficiencies drift towards 1.) The critical k is the largest k
such that every k' up to it is efficient, on the mean loss over seeds; with each seed on
its own (the seeds are paired: every k of one seed sees the same samples in the same
order) it gives a range. ``batch`` interpolates, in log k, where the efficiency
``(L0 - L(k)) / (L0 - L(1))`` falls through ``1 - tolerance``; when every k is
efficient the critical batch is only known to be at least the largest k x B (``bound``).

**What it relates to.** For SGD on a least-squares problem with Gaussian inputs in d
dimensions and no label noise, the gradient noise scale B_noise = tr(Sigma) / |G|^2 is
d + 1 at every point, and a branch at batch b with learning rate k eta0 (the linear rule,
eta0 the best rate at B) multiplies the expected loss per step by exactly
r(b) = (1 - eta)^2 + eta^2 B_noise / b. Measured in log-loss the efficiency is then
exactly independent of the branch's length and falls as 1 - (kB - B) / (2 (B + B_noise))
to first order in kB / B_noise; in the loss itself, the same for branches that lower the
loss by a small fraction: the critical batch with ``tolerance`` t sits near
B + 2 t (B + B_noise).
``tests/study/test_branches.py`` trains that problem with torch and checks both the
exact prediction and the proportionality to B_noise.

This module is the pure measurement (losses in, critical k out) and the table of a study's
branches; ``branch_trials`` plans the branches as trials, ``branch_hook`` measures them,
``branch_plots`` draws CBS(t).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

# The learning-rate rules (sqrt, linear, none) and each optimizer's default are the batch
# schedule's too: one copy, in the base layer.
from largebatch.batch_schedule import DEFAULT_LR_RULE as DEFAULT_LR_RULE
from largebatch.batch_schedule import LR_RULES as LR_RULES

# The efficiency of a larger batch and the tolerance rule are the adaptive batch's 'branch'
# criterion's too (largebatch.engine.branch_fork): one copy, in the base layer.
from largebatch.batch_schedule import branch_efficiency as _efficiency
from largebatch.batch_schedule import critical_k as _choose
from largebatch.batch_schedule import lr_multiplier as lr_multiplier


@dataclasses.dataclass(frozen=True)
class Critical:
    """The critical batch at one checkpoint.

    Attributes:
        k: the largest k efficient with every smaller k (mean loss over seeds); None
            when the k = 1 branch made no progress (nothing to compare against).
        batch: the critical batch, interpolated in log k where the efficiency falls
            through ``1 - tolerance`` (k x B when it never does).
        bound: every k was efficient: the critical batch is at least ``batch``.
        k_by_seed, batch_by_seed: the critical k and batch of each seed on its own.
        efficiency: k -> (L0 - L(k)) / (L0 - L(1)), on the mean losses.
    """

    k: int | None
    batch: float | None
    bound: bool
    k_by_seed: dict[int, int | None]
    batch_by_seed: dict[int, float | None]
    efficiency: dict[int, float]


def critical(start: float, losses: Mapping[int, Mapping[int, float]], base_batch: int, tolerance: float) -> Critical:
    """The critical batch from one checkpoint's branches.

    Args:
        start: the held-out loss at the checkpoint (every branch starts there).
        losses: k -> seed -> the held-out loss at the end of that branch; k = 1 required,
            and every k with the same seeds.
        base_batch: B, the batch of the k = 1 branch.
        tolerance: the fraction of the k = 1 branch's progress a larger batch may lose.

    Returns:
        The critical k and batch (see the module docstring).

    Raises:
        ValueError: no k = 1, seeds that differ between ks, or a tolerance outside (0, 1).
    """
    if 1 not in losses:
        raise ValueError("the k = 1 branch is needed")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance}")
    seeds = set(losses[1])
    if not seeds or any(set(by_seed) != seeds for by_seed in losses.values()):
        raise ValueError("every k needs the same seeds")
    mean = {k: statistics.fmean(by_seed.values()) for k, by_seed in losses.items()}
    by_seed: dict[int, tuple[int, float] | None] = {}
    for seed in sorted(seeds):
        own = _efficiency(start, {k: losses[k][seed] for k in losses})
        by_seed[seed] = None if own is None else _choose(own, base_batch, tolerance)[:2]
    efficiency = _efficiency(start, mean)
    seed_k = {seed: None if v is None else v[0] for seed, v in by_seed.items()}
    seed_batch = {seed: None if v is None else v[1] for seed, v in by_seed.items()}
    if efficiency is None:
        return Critical(None, None, False, seed_k, seed_batch, {})
    k, batch, bound = _choose(efficiency, base_batch, tolerance)
    return Critical(k, batch, bound, seed_k, seed_batch, efficiency)


@dataclasses.dataclass(frozen=True)
class Row:
    """One checkpoint of the CBS(t) table."""

    samples: int
    step: int
    base_batch: int
    start_loss: float | None
    losses: dict[int, dict[int, float]]
    critical: Critical | None
    b_simple: float | None
    missing: int

    def to_dict(self) -> dict[str, Any]:
        c = self.critical
        return {
            "samples": self.samples,
            "step": self.step,
            "base_batch": self.base_batch,
            "start_loss": self.start_loss,
            "losses": {str(k): {str(s): v for s, v in by.items()} for k, by in self.losses.items()},
            "critical_k": None if c is None else c.k,
            "critical_batch": None if c is None else c.batch,
            "bound": None if c is None else c.bound,
            "k_by_seed": None if c is None else {str(s): v for s, v in c.k_by_seed.items()},
            "batch_by_seed": None if c is None else {str(s): v for s, v in c.batch_by_seed.items()},
            "efficiency": None if c is None else {str(k): v for k, v in c.efficiency.items()},
            "b_simple": self.b_simple,
            "missing": self.missing,
        }


def table(results: Sequence[Mapping[str, Any]], ks: Sequence[int], seeds: Sequence[int], tolerance: float) -> list[Row]:
    """The CBS(t) table from finished branches, one row per checkpoint (by samples seen).

    Args:
        results: one mapping per finished branch: ``at_samples``, ``step``, ``base_batch``,
            ``k``, ``seed``, ``start_loss``, ``end_loss`` and ``b_simple`` (the source
            run's at the checkpoint, or None).
        ks, seeds: the branches wanted at every checkpoint; a checkpoint with some missing
            (or with a non-finite end loss: a diverged branch counts as infinitely bad)
            gets a row without a critical batch until they are all in.
        tolerance: as for ``critical``.
    """
    by_checkpoint: dict[int, list[Mapping[str, Any]]] = {}
    for result in results:
        by_checkpoint.setdefault(int(result["at_samples"]), []).append(result)
    rows = []
    for samples, found in sorted(by_checkpoint.items()):
        first = found[0]
        losses: dict[int, dict[int, float]] = {}
        for result in found:
            if result["k"] in ks and result["seed"] in seeds:
                end = result["end_loss"]
                losses.setdefault(int(result["k"]), {})[int(result["seed"])] = math.inf if end is None else float(end)
        starts = [r["start_loss"] for r in found if r["start_loss"] is not None]
        start = statistics.fmean(starts) if starts else None
        missing = len(ks) * len(seeds) - sum(len(v) for v in losses.values())
        result_critical = None
        if not missing and start is not None and 1 in losses:
            result_critical = critical(start, losses, int(first["base_batch"]), tolerance)
        rows.append(
            Row(samples, int(first["step"]), int(first["base_batch"]), start, losses, result_critical, first.get("b_simple"), missing)
        )
    return rows
