"""The branch measurement of the critical batch (largebatch.study.branches) against a
problem whose noise scale is known: least squares with Gaussian inputs, trained with SGD
in torch.

With inputs x ~ N(0, I_d), no label noise and e = w - w*, the per-sample gradient is
x x^T e: its mean is G = e and its covariance has trace (d + 1)|e|^2, so
B_noise = tr(Sigma) / |G|^2 = d + 1 at every point of training. One SGD step at batch b
and rate eta multiplies the expected loss |e|^2 / 2 by exactly
r = (1 - eta)^2 + eta^2 (d + 1) / b, so branches at k x B with the linear rule
(eta = k eta0, eta0 = B / (B + B_noise), the best rate at B) have known expected losses.
"""

from __future__ import annotations

import math

import pytest
import torch

from largebatch.study.branches import critical, lr_multiplier, table

KS = (1, 2, 4, 8, 16, 32, 64)
TOLERANCE = 0.3


def expected_loss(d: int, base: int, k: int, samples: int, start: float = 0.5) -> float:
    """The exact expected loss after ``samples`` samples at k x ``base`` with the linear rule."""
    noise, batch = d + 1, k * base
    eta = k * base / (base + noise)
    return start * ((1 - eta) ** 2 + eta**2 * noise / batch) ** (samples // batch)


def train_branches(d: int, base: int, k: int, samples: int, seeds: int) -> dict[int, float]:
    """SGD on the least-squares problem from a fixed start (loss 0.5), one independent
    problem per seed side by side; the held-out loss (exact: |w - w*|^2 / 2) per seed."""
    start = torch.randn(d, generator=torch.Generator().manual_seed(0))
    w = torch.nn.Parameter((start / start.norm()).repeat(seeds, 1))  # w* = 0
    optimizer = torch.optim.SGD([w], lr=base / (base + d + 1) * lr_multiplier("linear", k))
    data = torch.Generator().manual_seed(1)  # the same draws for every k: paired seeds
    batch = k * base
    for _ in range(samples // batch):
        x = torch.randn(seeds, batch, d, generator=data)
        loss = 0.5 * torch.einsum("sbd,sd->sb", x, w).pow(2).mean(1).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return dict(enumerate((0.5 * w.detach().pow(2).sum(1)).tolist()))


def noise_scale(d: int, samples: int = 20000) -> float:
    """tr(Sigma) / |G|^2 from per-sample gradients at a random point (checks B_noise = d + 1)."""
    generator = torch.Generator().manual_seed(2)
    e = torch.randn(d, generator=generator)
    x = torch.randn(samples, d, generator=generator)
    grads = x * (x @ e)[:, None]
    return float(grads.var(0).sum() / grads.mean(0).pow(2).sum())


@pytest.mark.parametrize(("d", "base", "samples"), [(31, 2, 64), (127, 2, 256)])
def test_measured_critical_batch_matches_the_known_noise_scale(d, base, samples):
    assert noise_scale(d) == pytest.approx(d + 1, rel=0.05)
    exact = critical(0.5, {k: {0: expected_loss(d, base, k, samples)} for k in KS}, base, TOLERANCE)
    measured = critical(0.5, {k: train_branches(d, base, k, samples, seeds=64) for k in KS}, base, TOLERANCE)
    assert measured.k == exact.k and not measured.bound
    assert measured.batch == pytest.approx(exact.batch, rel=0.1)
    # first order in kB / B_noise: the critical batch sits near B + 2 t (B + B_noise)
    assert measured.batch == pytest.approx(base + 2 * TOLERANCE * (base + d + 1), rel=0.25)
    # seeds on their own scatter around the mean's choice, one rung at most
    assert all(abs(math.log2(k / measured.k)) <= 1 for k in measured.k_by_seed.values())


def test_critical_batch_grows_with_the_noise_scale():
    small = critical(0.5, {k: train_branches(31, 2, k, 64, seeds=32) for k in KS}, 2, TOLERANCE)
    large = critical(0.5, {k: train_branches(127, 2, k, 256, seeds=32) for k in KS}, 2, TOLERANCE)
    assert 3 < large.batch / small.batch < 5  # B_noise 128 against 32


def test_every_k_efficient_is_a_bound():
    result = critical(1.0, {1: {0: 0.5, 1: 0.5}, 2: {0: 0.51, 1: 0.5}, 4: {0: 0.55, 1: 0.52}}, 32, 0.2)
    assert (result.k, result.batch, result.bound) == (4, 128.0, True)
    assert result.efficiency[4] == pytest.approx(0.465 / 0.5)


def test_interpolates_in_log_k_and_gives_each_seeds_choice():
    # efficiencies 1, 0.9, 0.5 (mean); tolerance 0.3 crosses 0.7 halfway from k = 2 to k = 4
    losses = {1: {1: 0.5, 2: 0.5}, 2: {1: 0.55, 2: 0.55}, 4: {1: 0.70, 2: 0.80}}
    result = critical(1.0, losses, 10, 0.3)
    assert result.k == 2 and not result.bound
    assert result.batch == pytest.approx(10 * 2**1.5)
    assert result.k_by_seed == {1: 2, 2: 2}
    seeds_apart = critical(1.0, {1: {1: 0.5, 2: 0.5}, 2: {1: 0.55, 2: 0.9}}, 10, 0.3)
    assert seeds_apart.k_by_seed == {1: 2, 2: 1}


def test_a_smaller_k_that_fails_ends_the_search():
    # k = 2 loses too much; k = 4 happens to be within the tolerance, but the rule needs every k up to it
    result = critical(1.0, {1: {0: 0.5}, 2: {0: 0.9}, 4: {0: 0.55}}, 8, 0.2)
    assert result.k == 1


def test_no_progress_at_k1_measures_nothing():
    result = critical(0.5, {1: {0: 0.6}, 2: {0: 0.5}}, 8, 0.2)
    assert result.k is None and result.batch is None


@pytest.mark.parametrize(
    ("losses", "tolerance", "message"),
    [({2: {0: 1.0}}, 0.2, "k = 1"), ({1: {0: 1.0}, 2: {1: 1.0}}, 0.2, "same seeds"), ({1: {0: 1.0}}, 1.0, "tolerance")],
)
def test_refuses_incomplete_input(losses, tolerance, message):
    with pytest.raises(ValueError, match=message):
        critical(2.0, losses, 8, tolerance)


def test_lr_rules():
    assert [lr_multiplier(rule, 4) for rule in ("sqrt", "linear", "none")] == [2.0, 4.0, 1.0]


def test_table_waits_for_every_branch_and_counts_diverged_ones_as_worst():
    def result(samples, k, seed, end):
        return {
            "at_samples": samples,
            "step": samples // 8,
            "base_batch": 8,
            "k": k,
            "seed": seed,
            "start_loss": 1.0,
            "end_loss": end,
            "b_simple": 5.0,
        }

    results = [result(64, 1, 1, 0.5), result(64, 2, 1, None), result(128, 1, 1, 0.5)]
    rows = table(results, ks=(1, 2), seeds=(1,), tolerance=0.2)
    assert [(r.samples, r.missing) for r in rows] == [(64, 0), (128, 1)]
    assert rows[0].critical is not None and rows[0].critical.k == 1 and rows[0].critical.efficiency[2] == -math.inf
    assert rows[1].critical is None and rows[0].b_simple == 5.0
