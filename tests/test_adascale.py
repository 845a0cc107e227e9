"""``batch_schedule.lr_scaling = 'adascale'``: AdaScale's gain (Johnson et al. 2020) as the
learning-rate multiplier, ``(1 + B_simple / G) / (1 + B_simple / B)`` with the noise_scale
hook's smoothed B_simple (``largebatch.batch_schedule``)."""

from __future__ import annotations

import math

import pytest

from largebatch.batch_schedule import adascale_multiplier, build_batch_schedule
from largebatch.config import validate
from largebatch.config.typed import typed
from largebatch.engine.hook import Hook, Priority
from largebatch.errors import ConfigError
from largebatch.hooks.noise_scale import NoiseScaleHook
from tests.conftest import tiny_config
from tests.hooks import test_noise_scale_closed_form as closed_form
from tests.test_batch_schedule import run_config


def schedule(optimizer: str = "adamw", start: int = 8):
    section = {"type": "ramp", "start_batch_size": start, "ramp_samples": 64, "lr_scaling": "adascale"}
    cfg = tiny_config(**{"optimizer.type": optimizer, "hooks": ["noise_scale"], "batch_schedule": section})
    return build_batch_schedule(typed(validate(cfg)), world_size=1)


@pytest.mark.parametrize(
    ("b_simple", "batch", "reference", "expected"),
    [
        (32.0, 8, 32, 2 / 5),  # (1 + 1) / (1 + 4)
        (8.0, 16, 32, 1.25 / 1.5),
        (32.0, 64, 32, 2 / 1.5),  # above the reference batch: a gain above 1
        (41.0, 32, 256, (1 + 41 / 256) / (1 + 41 / 32)),
        (100.0, 32, 32, 1.0),
    ],
)
def test_the_gain_is_the_papers_ratio_of_expected_squared_gradient_norms(b_simple, batch, reference, expected):
    assert adascale_multiplier(b_simple, batch, reference) == pytest.approx(expected, rel=1e-15)
    # the paper's form: r = (sigma^2 + mu^2) / (sigma^2 / S + mu^2), S = B / B0, sigma^2 = tr(Sigma) / B0
    mu_sq = 0.37
    sigma_sq = b_simple * mu_sq / reference
    assert adascale_multiplier(b_simple, batch, reference) == pytest.approx(
        (sigma_sq + mu_sq) / (sigma_sq / (batch / reference) + mu_sq), rel=1e-12
    )


@pytest.mark.parametrize(("batch", "reference"), [(8, 32), (16, 32), (64, 32), (128, 16)])
def test_the_gain_is_no_scaling_without_noise_and_the_linear_rule_when_noise_dominates(batch, reference):
    assert adascale_multiplier(0.0, batch, reference) == 1.0
    assert adascale_multiplier(1e12, batch, reference) == pytest.approx(batch / reference, rel=1e-9)
    # and the sqrt rule where B_simple is the batches' geometric mean
    assert adascale_multiplier(math.sqrt(batch * reference), batch, reference) == pytest.approx(math.sqrt(batch / reference))
    low, high = sorted((1.0, batch / reference))
    for b_simple in (1.0, 10.0, 100.0, 1000.0):
        assert low < adascale_multiplier(b_simple, batch, reference) < high


@pytest.mark.parametrize(("optimizer", "power"), [("adamw", 0.5), ("lamb", 0.5), ("sgd", 1.0), ("lars", 1.0)])
def test_without_an_estimate_the_optimizers_default_rule_stands_in(optimizer, power):
    ramp = schedule(optimizer)
    assert (ramp.lr_rule, ramp.batches) == ("adascale", (8, 16, 32))
    for no_estimate in (math.nan, -3.0):
        assert ramp.lr_multiplier(8, no_estimate) == pytest.approx((8 / 32) ** power)
    assert ramp.lr_multiplier(8, 32.0) == pytest.approx(0.4)
    assert ramp.lr_multiplier(32, 32.0) == 1.0


def test_adascale_without_the_noise_scale_hook_is_one_error_naming_the_fix():
    section = {"type": "fixed", "lr_scaling": "adascale"}
    with pytest.raises(ConfigError) as error:
        validate(tiny_config(batch_schedule=section))
    assert error.value.key == "batch_schedule.lr_scaling"
    assert 'add "noise_scale" to hooks' in str(error.value)


class Multipliers(Hook):
    """Each step's batch and lr multiplier, and the controller's B_simple when the step was planned."""

    priority = Priority.LOWEST

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, float, float]] = []
        self._planned_from = math.nan

    def before_step(self, state) -> None:
        self._planned_from = state.run.batch.b_simple

    def after_step(self, state) -> None:
        self.rows.append((state.current.global_batch, state.current.lr_multiplier, self._planned_from))


def test_on_the_closed_form_problem_the_multiplier_is_the_gain_at_its_known_noise_scale(tmp_path):
    # least squares with B_simple = 41 (tests/hooks/test_noise_scale_closed_form.py); a ramp
    # that stays at 32 of global batch 256 for the whole run: the gain (1 + 41/256) / (1 + 41/32)
    # = 0.509, where sqrt would give 0.354 and linear 0.125
    recorder, steps, micro, batch, reference = Multipliers(), 400, 4, 32, 256
    engine = closed_form.train(
        tmp_path,
        [NoiseScaleHook(beta=0.998), recorder],
        micro=micro,
        global_batch=reference,
        micro_batches=steps * batch // micro,
        config_hooks=["noise_scale"],
        batch_schedule={"type": "ramp", "start_batch_size": batch, "ramp_samples": 10 * steps * batch, "lr_scaling": "adascale"},
    )
    rows = recorder.rows
    assert len(rows) == steps and {row[0] for row in rows} == {batch}
    # the first step has no estimate: the default rule's (the config's optimizer, adamw: sqrt)
    assert rows[0][1] == pytest.approx(math.sqrt(batch / reference)) and math.isnan(rows[0][2])
    # every later step: exactly the gain of the estimate the step was planned from
    for _, multiplier, b_simple in rows[1:]:
        assert b_simple >= 0 and multiplier == adascale_multiplier(b_simple, batch, reference)
    # once settled, the estimate is the closed form's within its spread, and so the multiplier
    # is the gain at B_simple within the same spread
    assert engine.state.run.batch.b_simple == pytest.approx(closed_form.B_SIMPLE, rel=0.2)
    low, high = (adascale_multiplier(closed_form.B_SIMPLE * f, batch, reference) for f in (1.2, 0.8))
    assert all(low < multiplier < high for _, multiplier, _ in rows[-steps // 4 :]), (low, high, rows[-1])


@pytest.mark.slow
def test_an_adascale_run_resumed_on_either_side_of_a_ramps_change_ends_with_the_uninterrupted_runs_bytes(tmp_path, signal_handlers):
    # 128 samples an epoch, 2 epochs; ramp 16 -> 32 at sample 96: six steps at 16, then at 32.
    # Accumulation 2 and 4: the hook estimates every step, so the rate follows its averages.
    cfg = tiny_config(
        **{
            "epochs": 2,
            "hooks": [{"type": "noise_scale", "beta": 0.5}],
            "batch_schedule": {"type": "ramp", "start_batch_size": 16, "ramp_samples": 96, "lr_scaling": "adascale"},
            "checkpoint.at_end": True,
        }
    )

    reference = run_config(cfg, tmp_path / "reference")
    assert math.isfinite(reference.run.batch.b_simple)  # the gain, not the fallback, set the last rates
    for stop in (5, 6, 7):  # the last step at 16 starts at sample 80 and ends at 96; step 7 is the first at 32
        run_dir = tmp_path / f"stopped-{stop}"
        assert run_config({**cfg, "max_steps": stop}, run_dir).step == stop
        (run_dir / "model.safetensors").unlink()
        resumed = run_config(cfg, run_dir, resume="auto")
        assert resumed.step == reference.step
        assert (run_dir / "model.safetensors").read_bytes() == (tmp_path / "reference" / "model.safetensors").read_bytes(), stop
