"""The study's statistics from tables of runs with known answers: the choice, medians and
efficiencies, the bootstrap over seeds and the tuning choice, leave-one-batch-out fits,
pairwise ratios, B_20% and the resolution."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from largebatch.study import statistics as st
from largebatch.study.fit import Fit

BATCHES = [256, 512, 1024, 2048, 4096, 8192]


def reruns(s_min=100.0, b_crit=1000.0, noise=0.05, seeds=3, rng_seed=0, optimizer="lamb", batches=BATCHES, budget=math.inf):
    rng = np.random.default_rng(rng_seed)
    out = []
    for b in batches:
        for seed in range(1, seeds + 1):
            steps = s_min * (1 + b_crit / b) * float(np.exp(rng.normal(0, noise)))
            reached = steps <= budget
            out.append(st.Run(optimizer, b, 0, seed, True, steps if reached else None, min(budget, steps * 2), heldout_steps=steps))
    return out


def tuning(optimizer, batch, point, heldout, final=-0.5):
    return st.Run(optimizer, batch, point, 0, False, heldout, 1000.0, heldout_steps=heldout, final_score=final)


def test_the_choice_is_the_fewest_held_out_steps_then_the_best_end_value_then_the_lower_point():
    runs = [tuning("a", 1, 0, None, -0.7), tuning("a", 1, 1, 120.0), tuning("a", 1, 2, 110.0), tuning("a", 1, 3, 110.0)]
    assert st.choose(runs).point == 2
    assert st.choose([tuning("a", 1, 0, None, -0.6), tuning("a", 1, 1, None, -0.7)]).point == 1
    assert st.choose([]) is None


def test_a_cell_reports_its_choices_reruns_with_censored_seeds_counted_as_more_steps():
    table = [tuning("a", 256, 0, 300.0), tuning("a", 256, 1, 330.0), tuning("a", 512, 0, 200.0), tuning("a", 1024, 0, None)]
    table += [st.Run("a", 256, 0, s, True, v, 900.0, 0.04, heldout_steps=v) for s, v in ((1, 290.0), (2, 310.0), (3, 300.0))]
    table += [st.Run("a", 256, 1, 1, True, 999.0, 900.0)]  # a re-run of another point: not this cell's
    table += [st.Run("a", 512, 0, s, True, v, 400.0, heldout_steps=v) for s, v in ((1, 160.0), (2, None), (3, 170.0))]
    table += [st.Run("a", 1024, 0, s, True, v, 180.0) for s, v in ((1, None), (2, None), (3, 150.0))]
    found = st.findings(table, samples=0)
    c256, c512, c1024 = found.cells
    assert (c256.point, c256.median, c256.low, c256.high, c256.resolution) == (0, 300.0, 290.0, 310.0, 0.04)
    assert c256.margin == pytest.approx(0.1) and c256.spread == pytest.approx(310 / 290 - 1) and c256.tuning_decides is False
    assert (c512.median, c512.low, c512.high) == (170.0, 160.0, None)
    assert c512.efficiency == pytest.approx(300 * 256 / (170 * 512))
    assert c512.efficiency_range == (0.0, pytest.approx(310 * 256 / (160 * 512)))
    assert c1024.median is None and c1024.efficiency_below is None  # one seed reached it: no bound either way
    assert c512.spread == math.inf and c512.tuning_decides is None  # no runner-up that reached it


def test_the_bootstrap_interval_covers_the_truth_at_about_the_nominal_rate():
    """Percentile intervals from 3 seeds per batch run narrow of the nominal 95%; over 16
    noisy tables (fixed seeds) they hold the true B_crit and S_min at least 12 times."""
    covered = Counter()
    for rng_seed in range(16):
        found = st.findings(reruns(noise=0.05, rng_seed=100 + rng_seed), samples=100, seed=rng_seed)
        intervals = found.optimizers[0].intervals
        covered["b_crit"] += 1000.0 in intervals["b_crit"]
        covered["s_min"] += 100.0 in intervals["s_min"]
        covered["e_min"] += 100_000.0 in intervals["e_min"]
    assert min(covered.values()) >= 12, covered


def test_the_bootstrap_redraws_the_tuning_choice_when_the_runner_up_is_within_the_seeds_noise():
    """Two tuning points 2% apart on held-out steps, seeds 10% apart: the replicates choose
    the runner-up often, and use its tuning run where it has no re-runs; 2x apart: never."""
    for runner_up, share in ((102.0, (0.3, 0.7)), (200.0, (0.0, 0.0))):
        table = [tuning("a", 256, 0, 100.0), tuning("a", 256, 1, runner_up)]
        table += [st.Run("a", 256, 0, s, True, v, 500.0, heldout_steps=v) for s, v in ((1, 90.0), (2, 100.0), (3, 110.0))]
        draws = st.bootstrap(table, samples=400, seed=1)
        chose = [replicate[("a", 256)] for replicate in draws]
        runner = [runs for runs in chose if runs[0].point == 1]
        assert share[0] <= len(runner) / len(chose) <= share[1]
        assert all(len(runs) == 1 and not runs[0].rerun for runs in runner)
        assert all(len(runs) == 3 and all(r.rerun and r.point == 0 for r in runs) for runs in chose if runs[0].point == 0)


def test_leaving_out_a_batch_the_fit_rests_on_moves_b_crit_outside_its_interval():
    clean = st.findings(reruns(noise=0.03, rng_seed=3), samples=200).optimizers[0]
    assert all(x.inside for x in clean.left_out), [(x.batch, x.fit.b_crit) for x in clean.left_out]
    # 256's runs 40% slower than the curve: with them, B_crit is pulled up; without them it falls back near 1,000
    table = [
        r if r.batch != 256 else st.Run(r.optimizer, r.batch, 0, r.seed, True, r.steps * 1.4, r.budget)
        for r in reruns(noise=0.03, rng_seed=3)
    ]
    bent = st.findings(table, samples=200).optimizers[0]
    without = {x.batch: x for x in bent.left_out}
    assert without[256].inside is False and without[256].fit.b_crit == pytest.approx(1000.0, rel=0.1)
    assert bent.fit.b_crit not in st.Interval(900.0, 1100.0)


def test_pairwise_ratio_intervals_exclude_one_only_for_different_cells():
    """Cells at 100 and 200 steps differ; two draws of the same cell do not, and the seeds
    that would separate them follow from the interval's width as 1/sqrt(seeds)."""
    a = [st.Run("a", 256, 0, s, True, v, 1e4) for s, v in ((1, 95.0), (2, 100.0), (3, 104.0))]
    b = [st.Run("b", 256, 0, s, True, v, 1e4) for s, v in ((1, 190.0), (2, 200.0), (3, 212.0))]
    same = [st.Run("b", 256, 0, s, True, v, 1e4) for s, v in ((1, 93.0), (2, 101.0), (3, 106.0))]
    differ = st.findings(a + b, samples=300).comparisons
    assert [(c.a, c.b) for c in differ] == [("a/b256", "b/b256")]
    assert differ[0].ratio == pytest.approx(2.0) and differ[0].separated and differ[0].interval.low > 1.5
    alike = st.findings(a + same, samples=300).comparisons[0]
    assert alike.separated is False and alike.interval.low < 1.0 < alike.interval.high
    towards_one = alike.interval.low if alike.ratio > 1 else alike.interval.high
    width = abs(math.log(alike.ratio / towards_one))
    assert alike.seeds_needed == math.ceil(3 * (width / abs(math.log(alike.ratio))) ** 2) > 3


def test_b20_is_a_fifth_of_b_crit_where_steps_exceed_the_fits_perfect_scaling_by_a_fifth():
    """Zhang et al.'s 20% against E_min / B: S(B) = 1.2 E_min / B at B = 0.2 B_crit; the
    B0-relative figure, beside it, solves S(B) = 1.2 S(B0) B0 / B."""
    fit = Fit(s_min=100.0, b_crit=2000.0, sigma=0.01)
    table = [st.Run("a", b, 0, 1, True, fit.steps(b), 1e6) for b in BATCHES]
    result = st.findings(table, samples=0).optimizers[0]
    assert result.b20 == pytest.approx(400.0, rel=2e-3)
    assert result.fit.steps(result.b20) == pytest.approx(1.2 * result.fit.e_min / result.b20)
    assert result.b20_b0 == pytest.approx(1.2 * 256 + 0.2 * 2000.0, rel=2e-3)
    assert fit.steps(result.b20_b0) == pytest.approx(1.2 * fit.steps(256) * 256 / result.b20_b0, rel=2e-3)


def test_resolution_is_the_median_and_worst_over_crossings_with_the_evaluation_sets_standard_error():
    runs = [st.Run("a", 256, 0, s, True, 100.0, 200.0, res, slope=0.05) for s, res in enumerate((0.02, 0.04, 0.03, 0.10, 0.04))]
    runs.append(st.Run("a", 256, 0, 9, True, None, 200.0, None))
    out = st.resolution(runs, 0.78, 10_000)
    assert (out.median, out.worst, out.crossings) == (0.04, 0.10, 5)
    assert out.standard_error == pytest.approx(math.sqrt(0.78 * 0.22 / 10_000))  # 0.41 points
    assert out.steps_per_error == pytest.approx(math.exp(out.standard_error / 0.05) - 1)
    assert st.resolution(runs).standard_error is None


def test_the_sample_count_is_the_common_denominator_of_the_proportions_measured():
    values = [float(Fraction(k, 7500)) for k in (5937, 2288, 5890, 4021)]
    assert st.sample_count(values) == 7500
    assert st.sample_count([0.3169, 0.7786, 0.5361]) == 10_000
    assert st.sample_count([1.7]) is None and st.sample_count([math.pi / 4]) is None


def test_two_intervals_overlap_when_they_share_a_value():
    assert st.Interval(1.0, 2.0).overlaps(st.Interval(2.0, 3.0)) and st.Interval(2.0, 3.0).overlaps(st.Interval(0.0, 5.0))
    assert not st.Interval(1.0, 2.0).overlaps(st.Interval(2.5, 3.0)) and not st.Interval(2.5, 3.0).overlaps(st.Interval(1.0, 2.0))
