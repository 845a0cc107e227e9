"""Warmup-then-decay schedules and the LR scaling rule against their formulas."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from largebatch.config import derive, validate
from largebatch.config.typed import typed
from largebatch.optim.schedules import LRSchedule, build_schedule
from tests.conftest import derived_of, run_cli, tiny_config, write_config

PEAK, MIN, TOTAL, WARMUP = 0.8, 0.05, 50, 10


def expected_decay(decay: str, progress: float, power: float = 1.0) -> float:
    """The decay shapes written out: the fraction of (peak - min) left at ``progress``."""
    return {
        "linear": 1 - progress,
        "cosine": (1 + math.cos(math.pi * progress)) / 2,
        "polynomial": (1 - progress) ** power,
        "constant": 1.0,
    }[decay]


@pytest.mark.parametrize(
    "decay,power",
    [("linear", 1.0), ("cosine", 1.0), ("polynomial", 2.0), ("polynomial", 0.5), ("constant", 1.0)],
)
def test_each_decay_shape_with_warmup_and_min_lr(decay, power):
    schedule = LRSchedule(PEAK, TOTAL, WARMUP, decay=decay, min_lr=MIN, power=power)
    for step in range(TOTAL + 5):
        if step < WARMUP:
            expected = PEAK * (step + 1) / WARMUP
        elif decay == "constant":
            expected = PEAK
        else:
            progress = min(1.0, (step - WARMUP) / (TOTAL - WARMUP))
            expected = MIN + (PEAK - MIN) * expected_decay(decay, progress, power)
        assert schedule.lr_at(step) == pytest.approx(expected, rel=1e-12, abs=1e-15), step
    if decay != "constant":
        assert schedule.lr_at(WARMUP) == pytest.approx(PEAK)  # decay starts at the peak
        assert schedule.lr_at(TOTAL) == pytest.approx(MIN)  # and ends at min_lr
        assert schedule.lr_at(TOTAL + 100) == pytest.approx(MIN)  # where it stays
        lrs = [schedule.lr_at(s) for s in range(WARMUP, TOTAL + 1)]
        assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_warmup_ramps_from_init_lr_and_reaches_peak_on_its_last_step():
    schedule = LRSchedule(1.0, 100, 4, decay="linear", warmup_init_lr=0.2)
    assert [schedule.lr_at(s) for s in range(4)] == pytest.approx([0.4, 0.6, 0.8, 1.0])
    assert schedule.lr_at(4) == pytest.approx(1.0)


@pytest.mark.parametrize("decay", ["linear", "cosine", "polynomial", "constant"])
def test_no_warmup_starts_at_peak(decay):
    schedule = LRSchedule(PEAK, TOTAL, 0, decay=decay, min_lr=MIN)
    assert schedule.lr_at(0) == pytest.approx(PEAK)


def test_warmup_of_one_step_and_warmup_as_long_as_training():
    one = LRSchedule(PEAK, TOTAL, 1, decay="cosine", min_lr=MIN)
    assert one.lr_at(0) == pytest.approx(PEAK)
    assert one.lr_at(1) == pytest.approx(PEAK)  # progress 0: still at the peak
    whole = LRSchedule(PEAK, 8, 8, decay="cosine", min_lr=MIN)
    assert [whole.lr_at(s) for s in range(8)] == pytest.approx([PEAK * (s + 1) / 8 for s in range(8)])
    assert whole.lr_at(8) == pytest.approx(MIN)  # nothing left to decay over


@pytest.mark.parametrize(
    "kwargs,match",
    [({"decay": "step"}, "unknown decay"), ({"warmup_steps": 51}, "warmup_steps"), ({"warmup_steps": -1}, "warmup_steps")],
)
def test_bad_schedules_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LRSchedule(**{"peak_lr": PEAK, "total_steps": TOTAL, **kwargs})


def test_apply_sets_each_group_lr_times_its_scale():
    params = [torch.zeros(1, requires_grad=True) for _ in range(3)]
    optimizer = torch.optim.SGD(
        [{"params": [params[0]]}, {"params": [params[1]], "lr_scale": 0.5}, {"params": [params[2]], "lr_scale": 0.25}], lr=1.0
    )
    schedule = LRSchedule(PEAK, TOTAL, WARMUP, decay="linear")
    assert schedule.apply(optimizer, 3) == pytest.approx(PEAK * 4 / WARMUP)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([PEAK * 0.4, PEAK * 0.2, PEAK * 0.1])


@pytest.mark.parametrize(
    "rule,factor",
    [("none", 1.0), ("linear", 32 / 8), ("sqrt", math.sqrt(32 / 8))],
)
def test_scaling_rule_from_base_batch(rule, factor):
    overrides = {"lr_schedule.scaling": rule, "optimizer.lr": 0.01}
    if rule != "none":
        overrides["lr_schedule.base_batch_size"] = 8
    cfg = typed(tiny_config(**overrides))  # global batch 32
    derived = derive(cfg, 1, 128).to_dict()
    assert derived["peak_lr"] == pytest.approx(0.01 * factor, rel=1e-15)
    assert derived["lr_scaling"] == {
        "rule": rule,
        "base_batch_size": 8 if rule != "none" else None,
        "global_batch_size": 32,
        "base_lr": 0.01,
        "factor": pytest.approx(factor, rel=1e-15),
        "scaled_lr": pytest.approx(0.01 * factor, rel=1e-15),
    }
    schedule = build_schedule(cfg.lr_schedule, derive(cfg, 1, 128))
    assert schedule.peak_lr == derived["peak_lr"]


def test_vit_b16_recipe_sqrt_scaling_values():
    # LAMB's sqrt rule as in You et al.: lr tuned at 4096 moved to 32768 grows by sqrt(8).
    cfg = validate(
        tiny_config(
            **{
                "global_batch_size": 32768,
                "micro_batch_size": 256,
                "optimizer.lr": 1.8e-2,
                "lr_schedule.scaling": "sqrt",
                "lr_schedule.base_batch_size": 4096,
                "data.train_samples": 32768,
            }
        )
    )
    scaling = derived_of(cfg, 8, 32768)["lr_scaling"]
    assert scaling["factor"] == pytest.approx(2 * math.sqrt(2))
    assert scaling["scaled_lr"] == pytest.approx(1.8e-2 * 2 * math.sqrt(2))


@pytest.mark.slow
def test_config_show_prints_the_scaling(tmp_path):
    overrides = {"optimizer.lr": 0.01, "lr_schedule.scaling": "sqrt", "lr_schedule.base_batch_size": 8}
    result = run_cli("config", "show", str(write_config(tmp_path, tiny_config(**overrides))), "--world-size", "2")
    assert result.returncode == 0, result.stderr
    derived = yaml.safe_load(result.stdout)["derived"]
    assert derived["lr_scaling"] == {
        "rule": "sqrt",
        "base_batch_size": 8,
        "global_batch_size": 32,
        "base_lr": 0.01,
        "factor": 2.0,
        "scaled_lr": 0.02,
    }
    assert derived["peak_lr"] == 0.02
