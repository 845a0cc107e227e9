"""The noise_scale hook and the adaptive criterion on a problem whose noise scale is known
in closed form: least squares, y = w*.x + e with x ~ N(0, I_d) and e ~ N(0, s^2), a fresh
sample each draw (the population is the Gaussian, not a finite set).

With the loss 0.5 (w.x - y)^2 and d = w - w*, a sample's gradient is (d.x - e) x, so

    G = E[x x^T] d = d                                     |G|^2     = |d|^2
    E|g|^2 = E[(d.x)^2 |x|^2] + s^2 E|x|^2 = (D + 2)|d|^2 + D s^2   (Isserlis, D = dim x)
    tr(Sigma) = E|g|^2 - |G|^2 = (D + 1)|d|^2 + D s^2
    B_simple  = tr(Sigma) / |G|^2 = D + 1 + D s^2 / |d|^2

(McCandlish et al. 2018, arXiv:1812.06162). The weights stay put (a learning rate of
1e-12), so every step estimates the same quantities. The engine trains a model it accepts:
the residual w.x - y of ``[x, y]`` rows, under half its mean square."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from largebatch.hooks.logger import MetricsLogger
from largebatch.hooks.noise_scale import NoiseScaleHook
from largebatch.tasks import Task
from tests.engine.helpers import make_engine
from tests.hooks.common import Records

DIM, NOISE = 8, 1.0
OFFSET = 0.5  # |d|: the weights' distance from w*
B_SIMPLE = DIM + 1 + DIM * NOISE**2 / OFFSET**2  # 41


class Residual(torch.nn.Module):
    """``w.x - y`` of each row ``[x, y]``."""

    def __init__(self, weights: torch.Tensor) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(DIM, 1, bias=False)
        with torch.no_grad():
            self.linear.weight.copy_(weights.reshape(1, DIM))

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.linear(rows[:, :DIM]).squeeze(-1) - rows[:, DIM]


class LeastSquares(Task):
    """Half the mean squared residual (the model's output)."""

    def loss(self, outputs, batch):
        return 0.5 * outputs.square().mean()


def gaussian_rows(count: int, micro: int, w_star: torch.Tensor, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        x = torch.randn(micro, DIM, generator=gen)
        y = x @ w_star + NOISE * torch.randn(micro, generator=gen)
        out.append((torch.cat([x, y[:, None]], 1), torch.zeros(micro, dtype=torch.int64)))
    return out


def train(tmp_path, hooks, *, micro: int, global_batch: int, micro_batches: int, config_hooks=(), **overrides):
    gen = torch.Generator().manual_seed(0)
    w_star = torch.randn(DIM, generator=gen)
    offset = torch.randn(DIM, generator=gen)
    model = Residual(w_star + OFFSET * offset / offset.norm())
    engine = make_engine(
        model,
        gaussian_rows(micro_batches, micro, w_star),
        global_batch_size=global_batch,
        micro_batch_size=micro,
        num_samples=micro * micro_batches,
        hooks=hooks,
        optimizer=torch.optim.SGD(model.parameters(), lr=1e-12),  # the weights, and so the truth, stay put
        run_dir=tmp_path,
        config_hooks=list(config_hooks),
        task=LeastSquares(),
        **{"data.num_classes": 2, "optimizer.lr": 1e-12, **overrides},
    )
    engine.run()
    return engine


def test_single_step_estimates_are_unbiased_for_the_closed_form(tmp_path):
    # beta 0: each logged value is one step's estimate; their mean is within 3 standard errors of the truth
    records = Records()
    steps = 600
    train(
        tmp_path,
        [NoiseScaleHook(beta=0.0), MetricsLogger(console=False), records],
        micro=4,
        global_batch=64,
        micro_batches=16 * steps,
        **{"log.interval": 1},
    )
    assert len(records.logged) == steps
    for key, truth in (("grad_sq", OFFSET**2), ("trace_sigma", (DIM + 1) * OFFSET**2 + DIM * NOISE**2)):
        values = [float(r[f"noise_scale/{key}"]) for r in records.logged]
        error = statistics.stdev(values) / math.sqrt(steps)
        assert abs(statistics.fmean(values) - truth) < 3 * error, (key, statistics.fmean(values), truth, error)
        assert error < 0.1 * truth  # the test can tell a wrong value apart
    # the ratio of the means (the smoothed estimate's limit): the delta method's error
    grad = [float(r["noise_scale/grad_sq"]) for r in records.logged]
    trace = [float(r["noise_scale/trace_sigma"]) for r in records.logged]
    g, t = statistics.fmean(grad), statistics.fmean(trace)
    ratio = [(ti - t) / g - t * (gi - g) / g**2 for gi, ti in zip(grad, trace)]  # the ratio's linearised deviations
    error = statistics.stdev(ratio) / math.sqrt(steps)
    assert abs(t / g - B_SIMPLE) < 3 * error and error < 0.1 * B_SIMPLE, (t / g, B_SIMPLE, error)


def test_the_adaptive_batch_grows_below_the_closed_form_threshold_and_not_above(tmp_path):
    # factor x B_simple = 2 sqrt(2) x 32 = 90.5, halfway (in ratio) between 64 and 128: the
    # batch doubles to 2B while 2B <= 90.5, so at 32 it grows (64) and at 64 it does not
    # (128), though the maximum (256) would allow it
    hook = NoiseScaleHook(beta=0.998)
    every = 9600  # 300 steps at 32, 150 at 64: the smoothed estimate has settled at each check
    engine = train(
        tmp_path,
        [hook],
        micro=4,
        global_batch=256,
        micro_batches=2 * every // 4,
        config_hooks=["noise_scale"],
        batch_schedule={
            "type": "adaptive",
            "start_batch_size": 32,
            "factor": 2 * math.sqrt(2) * 32 / B_SIMPLE,
            "check_every_samples": every,
            "lr_scaling": "none",
        },
    )
    controller = engine.state.run.batch
    assert engine.state.samples_seen == 2 * every and engine.state.step == 300 + 150
    ((samples, step, value, batch),) = controller.decisions  # grew once, at the first check
    assert (samples, step, batch) == (every, 300, 64)
    # what each check read: the closed form, within the smoothed estimate's spread
    assert value == pytest.approx(B_SIMPLE, rel=0.2) and controller.criterion == pytest.approx(B_SIMPLE, rel=0.2)
    assert controller.batch == 64
