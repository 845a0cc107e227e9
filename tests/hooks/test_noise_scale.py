"""The noise_scale hook against the true |G|^2 and tr(Sigma) of a problem whose per-sample
gradients are all known: softmax regression with fixed weights over a finite data set,
batches drawn with replacement (so the two-batch-size estimator of McCandlish et al.
2018, Appendix A, is unbiased)."""

from __future__ import annotations

import math
import pathlib

import pytest
import torch

from largebatch.errors import UserError
from largebatch.hooks.logger import MetricsLogger
from largebatch.hooks.noise_scale import NoiseScaleHook
from tests.engine.helpers import make_engine
from tests.hooks.common import Records

SAMPLES, FEATURES, CLASSES = 2048, 6, 7


def problem(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=gen)
    teacher = torch.randn(FEATURES, CLASSES, generator=gen) * 2.0
    y = (x @ teacher + torch.randn(SAMPLES, CLASSES, generator=gen)).argmax(1)  # a noisy teacher's labels
    model = torch.nn.Linear(FEATURES, CLASSES)
    with torch.no_grad():
        model.weight.copy_(torch.randn(CLASSES, FEATURES, generator=gen) * 0.3)
        model.bias.zero_()
    return x, y, model


def true_noise(x, y, model):
    """|G|^2 and tr(Sigma) from every sample's gradient (the data set is the population)."""
    grads = []
    for i in range(SAMPLES):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]).double())
    model.zero_grad()
    per_sample = torch.stack(grads)
    mean = per_sample.mean(0)
    return float(mean.square().sum()), float((per_sample - mean).square().sum(1).mean())


def with_replacement(x, y, count: int, micro: int, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        idx = torch.randint(SAMPLES, (micro,), generator=gen)
        out.append((x[idx], y[idx]))
    return out


def run(tmp_path, *, steps: int, micro: int, accumulation: int, beta: float, log_interval: int = 10, min_ratio: int = 2):
    x, y, model = problem()
    hook = NoiseScaleHook(beta=beta, min_ratio=min_ratio)
    records = Records()
    engine = make_engine(
        model,
        with_replacement(x, y, steps * accumulation, micro),
        global_batch_size=micro * accumulation,
        micro_batch_size=micro,
        num_samples=micro * accumulation * steps,
        hooks=[hook, MetricsLogger(console=False), records],
        optimizer=torch.optim.SGD(model.parameters(), lr=1e-12),  # the weights, and so the truth, stay put
        run_dir=tmp_path,
        **{"data.num_classes": CLASSES, "optimizer.lr": 1e-12, "log.interval": log_interval},
    )
    engine.run()
    return hook, records, (x, y, model)


def test_estimates_match_the_true_gradient_noise_within_ten_percent(tmp_path):
    hook, records, (x, y, model) = run(tmp_path, steps=1500, micro=8, accumulation=8, beta=0.998)
    grad_sq, trace = true_noise(x, y, model)
    b_simple = trace / grad_sq
    assert 8 < b_simple < 64 * 4  # between the two batch sizes' scales: both terms matter
    got = hook.estimates()
    assert got["grad_sq"] == pytest.approx(grad_sq, rel=0.10)
    assert got["trace_sigma"] == pytest.approx(trace, rel=0.10)
    assert got["b_simple"] == pytest.approx(b_simple, rel=0.10)
    last = records.logged[-1]
    assert float(last["noise_scale/b_simple"]) == pytest.approx(got["b_simple"])
    assert {"noise_scale/grad_sq", "noise_scale/trace_sigma"} <= set(last)


def test_without_the_loss_weight_correction_the_estimate_would_be_far_off(tmp_path, monkeypatch):
    # the engine scales each micro-batch's loss by 1/window: the hook must undo it
    monkeypatch.setattr(
        "largebatch.engine.accumulation.micro_loss_weight", lambda window: 1.0
    )  # read by the hook when it runs; the engine holds its own reference
    hook, _, (x, y, model) = run(tmp_path, steps=300, micro=8, accumulation=8, beta=0.99)
    grad_sq, trace = true_noise(x, y, model)
    assert not hook.estimates()["trace_sigma"] == pytest.approx(trace, rel=0.5)


def test_accumulation_one_is_refused_with_the_fix(tmp_path):
    with pytest.raises(Exception) as error:
        run(tmp_path, steps=2, micro=8, accumulation=1, beta=0.9)
    cause = error.value.__cause__ if not isinstance(error.value, UserError) else error.value
    assert isinstance(cause, UserError)
    assert "accumulation 1" in str(cause) and "set micro_batch_size to at most 4" in str(cause)


def test_a_smaller_ratio_than_asked_for_is_refused_with_the_largest_micro_batch_that_gives_it(tmp_path):
    with pytest.raises(Exception) as error:
        run(tmp_path, steps=2, micro=8, accumulation=4, beta=0.9, min_ratio=8)
    cause = error.value.__cause__ if not isinstance(error.value, UserError) else error.value
    assert isinstance(cause, UserError)
    assert "B_big / B_small = 4, below min_ratio 8" in str(cause) and "set micro_batch_size to at most 4" in str(cause)
    hook, _, _ = run(tmp_path / "eight", steps=2, micro=4, accumulation=8, beta=0.9, min_ratio=8)  # 32 / 4 = 8: accepted
    assert all(math.isfinite(v) for v in hook.estimates().values())


def test_at_a_fixed_held_out_loss_the_estimates_of_that_moment_join_that_evaluation_once(tmp_path, preemption_handlers_restored):
    """B_simple read at the first evaluation whose eval/loss is at most ``at_eval_loss``: the
    smoothed estimates logged at that step, in that evaluation's record and no other."""
    import json

    from largebatch.launch import TrainArgs, train
    from tests.conftest import hooks_override, tiny_config, write_config

    loss = 1.25
    cfg = tiny_config(**{"epochs": 6, "micro_batch_size": 4, "data.train_samples": 256, "data.signal": 2.0, "optimizer.lr": 0.002})
    noise = {"type": "noise_scale", "beta": 0.5, "min_ratio": 8, "at_eval_loss": loss}
    sets = ["eval.interval_epochs=0", "eval.at_end=false", hooks_override(noise, {"type": "eval", "interval_steps": 2})]
    train(TrainArgs(str(write_config(tmp_path, cfg)), sets, str(tmp_path / "run"), None, False))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/loss" in r]
    first = next(r for r in evals if r["eval/loss"] <= loss)
    assert evals[0]["eval/loss"] > loss and first is not evals[-1]  # reached mid-run, evaluated after it too
    assert [r for r in evals if "noise_scale/at_loss/b_simple" in r] == [first]
    logged = next(r for r in records if r["step"] == first["step"] and "noise_scale/b_simple" in r)
    for name in ("b_simple", "grad_sq", "trace_sigma"):
        assert first[f"noise_scale/at_loss/{name}"] == pytest.approx(logged[f"noise_scale/{name}"], rel=1e-6)
    assert first["noise_scale/at_loss/step"] == first["step"] and first["noise_scale/at_loss/batch_ratio"] == 8


def test_averages_survive_a_checkpoint(tmp_path):
    hook, _, _ = run(tmp_path, steps=20, micro=4, accumulation=4, beta=0.9)
    saved = hook.state_dict()
    again = NoiseScaleHook(beta=0.9)
    again.load_state_dict(saved)
    engine = make_engine(torch.nn.Linear(2, 2), [], global_batch_size=8, micro_batch_size=4, num_samples=8)
    again.before_run(engine.state)
    assert again.estimates() == hook.estimates()
    assert all(math.isfinite(v) for v in hook.estimates().values())


def test_logged_only_on_logging_steps(tmp_path):
    _, records, _ = run(tmp_path, steps=6, micro=4, accumulation=2, beta=0.5, log_interval=3)
    assert [r["step"] for r in records.logged] == [3, 6]
    assert all("noise_scale/b_simple" in r for r in records.logged)


def _fsdp_worker(rank: int, port: int, out: str) -> None:
    import json
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        x, y, model = problem()
        hook = NoiseScaleHook(beta=0.995)
        steps, micro, accumulation = 700, 8, 4
        engine = make_engine(
            model,
            with_replacement(x, y, steps * accumulation, micro, seed=1 + rank),  # each rank its own draws
            global_batch_size=micro * accumulation * 2,
            micro_batch_size=micro,
            num_samples=micro * accumulation * 2 * steps,
            world_size=2,
            rank=rank,
            hooks=[hook],
            optimizer=lambda sharded: torch.optim.SGD(sharded.parameters(), lr=1e-12),
            run_dir=pathlib.Path(out),
            **{"data.num_classes": CLASSES, "optimizer.lr": 1e-12, "log.interval": 100, "dist.strategy": "fsdp"},
        )
        assert engine.state.run.sharded and engine.state.sync_first_micro is False
        engine.run()
        assert engine.state.sync_first_micro  # the hook asked for the first micro-batch's reduction
        if rank == 0:
            pathlib.Path(out, "estimates.json").write_text(json.dumps(hook.estimates()))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.dist
@pytest.mark.slow
def test_estimates_under_fsdp_match_the_true_gradient_noise_within_ten_percent(tmp_path):
    """Two ranks, FSDP2: g_small is the ranks' mean first micro-batch gradient (B_small =
    micro-batch x 2), g_big the step's (B_big = 64); both sharded, their norms reduced."""
    import json

    import torch.multiprocessing as mp

    from tests.conftest import free_port

    mp.spawn(_fsdp_worker, args=(free_port(), str(tmp_path)), nprocs=2)
    grad_sq, trace = true_noise(*problem())
    got = json.loads((tmp_path / "estimates.json").read_text())
    assert got["grad_sq"] == pytest.approx(grad_sq, rel=0.10)
    assert got["trace_sigma"] == pytest.approx(trace, rel=0.10)
    assert got["b_simple"] == pytest.approx(trace / grad_sq, rel=0.10)


@pytest.mark.slow
def test_the_adaptive_batch_doubles_when_the_noise_scale_allows_and_not_beyond(tmp_path):
    """The criterion on the known problem: B_simple's true value from every sample's
    gradient; with factor x B_simple at 1.5 x 128, a batch of 64 doubles at the first check
    (2B = 128 <= 192) and a batch of 128 does not at the second (256 > 192)."""
    x, y, model = problem()
    grad_sq, trace = true_noise(x, y, model)
    truth = trace / grad_sq
    hook = NoiseScaleHook(beta=0.99)
    engine = make_engine(
        model,
        with_replacement(x, y, 2400, 16),
        global_batch_size=256,
        micro_batch_size=16,
        num_samples=38400,
        hooks=[hook],
        optimizer=torch.optim.SGD(model.parameters(), lr=1e-12),  # the weights, and so the truth, stay put
        run_dir=tmp_path,
        config_hooks=["noise_scale"],
        **{
            "data.num_classes": CLASSES,
            "optimizer.lr": 1e-12,
            "batch_schedule": {
                "type": "adaptive",
                "start_batch_size": 64,
                "factor": 1.5 * 128 / truth,
                "check_every_samples": 19200,
                "lr_scaling": "none",
            },
        },
    )
    engine.run()
    controller = engine.state.run.batch
    assert engine.state.step == 450 and engine.state.samples_seen == 38400  # 300 steps at 64, then 150 at 128
    assert len(controller.decisions) == 1
    samples, step, value, batch = controller.decisions[0]
    assert (samples, step, batch) == (19200, 300, 128)
    assert value == pytest.approx(truth, rel=0.25)
    assert controller.criterion == pytest.approx(truth, rel=0.25)  # the second check: read, and 256 refused
    assert controller.batch == 128
