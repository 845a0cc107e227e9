"""The batch schedule (``largebatch.batch_schedule``): its validation, the learning-rate
rules, and every schedule indexed by samples seen across a batch change, each against
the formula written out here; a fixed schedule against today's step-indexed numbers."""

from __future__ import annotations

import math
import pathlib

import pytest
import torch

from largebatch import preemption
from largebatch.batch_schedule import BatchController, build_batch_schedule
from largebatch.config import derive, validate
from largebatch.config.typed import typed
from largebatch.engine.hook import Hook, Priority
from largebatch.errors import ConfigError, UserError
from largebatch.hooks.ema import ModelEmaHook
from largebatch.launch import TrainArgs, train
from tests.conftest import tiny_config, write_config
from tests.hooks.common import MICRO, build
from tests.hooks.test_ema import WeightsAfterEachStep

PEAK, WARMUP = 0.1, 2  # build()'s optimizer.lr; warmup in steps at the config's global batch


def ramp(start: int, samples: int, **more) -> dict:
    return {"type": "ramp", "start_batch_size": start, "ramp_samples": samples, **more}


class Steps(Hook):
    """Each step's window, batch, lr, samples before and after, and ``steps_reached(2)``."""

    priority = Priority.LOWEST

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict] = []

    def after_step(self, state) -> None:
        step = state.current
        self.rows.append(
            {
                "window": step.window_size,
                "batch": step.global_batch,
                "lr": step.lr,
                "before": step.samples_before,
                "after": state.samples_seen,
                "every_2": state.steps_reached(2),
                "metrics": dict(step.metrics),
            }
        )


def run_config(config: dict, run_dir: pathlib.Path, resume: str | None = None):
    """Train ``config`` in ``run_dir`` (its config file beside it); resumed: to the end (``max_steps`` dropped)."""
    path = write_config(run_dir.parent, config, name=f"{run_dir.name}.yaml")
    preemption.clear()
    overrides = ["max_steps=null"] if resume else []
    return train(TrainArgs(config=str(path), overrides=overrides, run_dir=str(run_dir), resume=resume))


def schedule_lr(before: float, after: float, total: float, peak: float = PEAK, warmup: int = WARMUP) -> float:
    """Linear warmup to ``peak`` over ``warmup`` steps, then cosine to 0 at ``total``,
    in steps at the config's global batch; warmup reads where the step ends, the decay
    where it starts (the fixed schedule's ``(s + 1) / W`` and ``(s - W) / (T - W)``)."""
    if before < warmup:
        return peak * min(after, warmup) / warmup
    progress = min(1.0, (before - warmup) / (total - warmup))
    return peak * 0.5 * (1 + math.cos(math.pi * progress))


def test_a_fixed_schedule_gives_the_step_indexed_numbers_and_no_batch_metrics(tmp_path):
    recorder = Steps()
    engine, records = build(tmp_path, [recorder], steps=6, accumulation=2, **{"lr_schedule.warmup_steps": WARMUP})
    engine.run()
    rows = recorder.rows
    assert [r["window"] for r in rows] == [2] * 6
    assert [r["lr"] for r in rows] == [schedule_lr(s, s + 1, 6) for s in range(6)]
    assert [r["every_2"] for r in rows] == [s % 2 == 0 for s in range(1, 7)]
    assert not any(key.startswith("batch/") for record in records.logged for key in record)


@pytest.mark.parametrize(
    ("optimizer", "rule", "power"),
    [("adamw", None, 0.5), ("lamb", None, 0.5), ("sgd", None, 1.0), ("lars", None, 1.0), ("adamw", "linear", 1.0), ("sgd", "none", 0.0)],
)
def test_the_lr_rule_by_optimizer_and_configured(optimizer, rule, power):
    cfg = typed(validate(tiny_config(**{"optimizer.type": optimizer, "batch_schedule": ramp(8, 64, lr_scaling=rule)})))
    schedule = build_batch_schedule(cfg, world_size=1)
    assert schedule.batches == (8, 16, 32)
    for batch in schedule.batches:
        assert schedule.lr_multiplier(batch) == pytest.approx((batch / 32) ** power)
    assert schedule.lr_multiplier(32) == 1.0


def test_a_ramp_grows_by_samples_seen_and_the_lr_follows_samples_and_the_rule(tmp_path):
    # 64 samples per epoch at micro-batch 4, global batch 16; ramp 4 -> 8 -> 16 by sample 32.
    recorder = Steps()
    engine, records = build(
        tmp_path,
        [recorder],
        steps=4,
        accumulation=4,
        epochs=2,
        batch_schedule=ramp(4, 32, lr_scaling="sqrt"),
        **{"lr_schedule.warmup_steps": WARMUP},
    )
    total_reference_steps = engine.state.run.derived.total_steps
    assert total_reference_steps == 8
    engine.run()
    rows = recorder.rows
    # stage boundaries at 0, 16, 32 samples; the batch of a step is the stage where it starts
    assert [r["batch"] for r in rows] == [4] * 4 + [8] * 2 + [16] * 2 + [16] * 4
    assert [r["window"] for r in rows] == [r["batch"] // MICRO for r in rows]
    assert len(rows) == engine.state.run.total_steps == 12
    for r in rows:
        expected = schedule_lr(r["before"] / 16, r["after"] / 16, total_reference_steps) * math.sqrt(r["batch"] / 16)
        assert r["lr"] == pytest.approx(expected, rel=1e-12)
    # an interval of 2 steps means every 32 samples
    assert [r["after"] for r in rows if r["every_2"]] == [32, 64, 96, 128]
    logged = records.logged
    assert [rec["batch/global"] for rec in logged] == [r["batch"] for r in rows]
    assert [rec["batch/accumulation"] for rec in logged] == [r["window"] for r in rows]
    assert [rec["batch/lr_multiplier"] for rec in logged] == pytest.approx([math.sqrt(r["batch"] / 16) for r in rows])
    assert [rec["lr"] for rec in logged] == [r["lr"] for r in rows]


def test_a_window_is_cut_at_the_epoch_end_and_the_epoch_keeps_its_samples(tmp_path):
    # 3 steps of 16 = 48 samples per epoch; ramp 8 -> 16 at sample 8: 8 | 16 16 | 8 (cut)
    recorder = Steps()
    engine, _ = build(tmp_path, [recorder], steps=3, accumulation=4, batch_schedule=ramp(8, 8, lr_scaling="none"))
    engine.run()
    assert [r["window"] for r in recorder.rows] == [2, 4, 4, 2]
    assert recorder.rows[-1]["after"] == 48
    assert engine.state.run.total_steps == 4


def test_the_ema_keeps_its_decay_per_sample_across_a_batch_change(tmp_path):
    decay = 0.8
    recorder, steps = WeightsAfterEachStep(), Steps()
    hook = ModelEmaHook(decay)
    engine, _ = build(tmp_path, [hook, recorder, steps], steps=4, accumulation=4, batch_schedule=ramp(4, 32, lr_scaling="none"))
    engine.run()
    ema = {k: v.double() for k, v in recorder.weights[0].items()}
    for row, weights in zip(steps.rows, recorder.weights[1:]):
        # timm's first update (the count at most 1 step at the config's batch) copies the weights
        d = 0.0 if row["after"] / 16 <= 1 else decay ** (row["batch"] / 16)
        ema = {k: d * ema[k] + (1 - d) * weights[k].double() for k in ema}
    got = hook.ema.module.state_dict()
    for key, value in ema.items():
        torch.testing.assert_close(got[key].double(), value, rtol=1e-6, atol=1e-7)
    assert len({r["batch"] for r in steps.rows}) == 3  # the change happened


def test_weight_decay_follows_the_batch_when_the_timescale_is_kept(tmp_path):
    seen = []

    class WeightDecay(Hook):
        def before_optimizer_step(self, state) -> None:
            seen.append((state.current.global_batch, [g["weight_decay"] for g in state.run.optimizer.param_groups]))

    engine, _ = build(
        tmp_path,
        [WeightDecay()],
        steps=4,
        accumulation=4,
        batch_schedule=ramp(4, 32, lr_scaling="sqrt", keep_wd_timescale=True),
    )
    engine.run()
    for batch, decays in seen:
        k = batch / 16
        # lr x wd / B constant: wd x sqrt(k) / k = wd at the config's batch
        assert decays == pytest.approx([0.1 * k / math.sqrt(k), 0.0])
    assert {b for b, _ in seen} == {4, 8, 16}


def test_config_show_lists_every_stage_and_the_steps_add_up():
    cfg = typed(validate(tiny_config(**{"epochs": 2, "batch_schedule": ramp(8, 64)})))
    derived = derive(cfg, 1, 128)
    shown = derived.to_dict()["batch_schedule"]
    assert shown["type"] == "ramp" and shown["lr_rule"] == "sqrt"
    assert [(s["samples_from"], s["global_batch"], s["accumulation"]) for s in shown["stages"]] == [(0, 8, 1), (32, 16, 2), (64, 32, 4)]
    assert [s["steps"] for s in shown["stages"]] == [4, 2, 6]  # 32 / 8, 32 / 16, then 192 / 32
    assert sum(s["steps"] for s in shown["stages"]) == shown["run_steps"] == derived.run_steps
    assert "batch_schedule" not in derive(typed(validate(tiny_config())), 1, 128).to_dict()


def test_the_adaptive_controller_doubles_only_when_the_criterion_allows_and_never_above_the_maximum():
    cfg = typed(
        validate(
            tiny_config(
                **{
                    "hooks": ["noise_scale"],
                    "batch_schedule": {
                        "type": "adaptive",
                        "start_batch_size": 8,
                        "max_batch_size": 32,
                        "factor": 2.0,
                        "check_every_samples": 64,
                    },
                }
            )
        )
    )
    controller = BatchController(build_batch_schedule(cfg, 1))
    assert controller.batch == 8
    assert not controller.check_due(32, 56) and controller.check_due(56, 64)
    assert not controller.decide(7.9, bool, 64, 8)  # 2 x 7.9 < 16
    assert controller.decide(8.0, bool, 128, 16) and controller.batch == 16  # 2 x 8 >= 16
    assert not controller.decide(math.nan, bool, 192, 20)
    assert controller.decide(100.0, bool, 256, 24) and controller.batch == 32
    assert not controller.decide(1e9, bool, 320, 26) and controller.batch == 32  # the maximum
    restored = BatchController(controller.schedule)
    restored.load_state_dict(controller.state_dict())
    assert (restored.batch, restored.decisions) == (32, controller.decisions)


def test_a_checkpoints_batch_entry_is_checked_against_this_runs_schedule():
    """A checkpoint may come from another config (``--ignore-config``), another world size or
    someone else: a batch this schedule cannot take would train every later step at a wrong
    accumulation, so it is refused, and so is a malformed entry; a good one restores."""
    adaptive = {"type": "adaptive", "start_batch_size": 8, "max_batch_size": 32, "check_every_samples": 64}
    schedule = build_batch_schedule(typed(validate(tiny_config(hooks=["noise_scale"], batch_schedule=adaptive))), 1)
    good = {"batch": 16, "decisions": [[64.0, 8.0, 9.0, 16.0]], "criterion": 9.0}
    restored = BatchController(schedule)
    restored.load_state_dict(good)
    assert (restored.batch, restored.decisions, restored.criterion) == (16, [[64.0, 8.0, 9.0, 16.0]], 9.0)
    for stray in ({**good, "batch": 24}, {**good, "batch": 64}, {**good, "decisions": [[64.0, 8.0, 9.0, 48.0]]}):
        with pytest.raises(UserError, match=r"trained at global batch (24|64|48), which this run's batch_schedule \(adaptive: 8, 16, 32"):
            BatchController(schedule).load_state_dict(stray)
    for malformed in ({**good, "batch": "16"}, {**good, "batch": True}, {**good, "decisions": [[1, 2]]}, {**good, "criterion": None}, [16]):
        with pytest.raises(UserError, match="batch_schedule entry is malformed"):
            BatchController(schedule).load_state_dict(malformed)  # type: ignore[arg-type]
    fixed = BatchController(build_batch_schedule(typed(validate(tiny_config())), 1))
    with pytest.raises(UserError, match="cannot take"):  # a ramp's checkpoint resumed as a fixed run
        fixed.load_state_dict({**good, "decisions": []})
    fixed.load_state_dict({})  # a checkpoint from before the schedule existed
    assert fixed.batch == fixed.schedule.reference_batch


@pytest.mark.parametrize(
    ("section", "world_size", "key", "words"),
    [
        (ramp(12, 64), 1, "batch_schedule.start_batch_size", "set start_batch_size to global_batch_size / 2^k, e.g. 8 or 16"),
        (ramp(8, 64, increment=5), 1, "batch_schedule.increment", "a divisor of 24, e.g. 4"),
        (ramp(8, None), 1, "batch_schedule.ramp_samples", "is required"),
        (ramp(32, 64), 1, "batch_schedule.start_batch_size", "not below global_batch_size 32"),
        ({"type": "fixed", "start_batch_size": 8}, 1, "batch_schedule.start_batch_size", "set type to 'ramp' or 'adaptive'"),
        ({"type": "adaptive", "start_batch_size": 8}, 1, "batch_schedule.criterion", 'add "noise_scale" to hooks'),
        ({"type": "fixed", "keep_wd_timescale": True}, 1, "batch_schedule.keep_wd_timescale", "optimizer.type is 'lamb'"),
        (
            ramp(8, 64),
            2,
            "batch_schedule.start_batch_size",
            "micro_batch_size 8 x world_size 2 = 16 (the batch grows through accumulation); set it to 16",
        ),
    ],
)
def test_a_bad_schedule_is_one_error_naming_the_key_and_the_fix(section, world_size, key, words):
    with pytest.raises(ConfigError) as error:
        cfg = typed(
            validate(tiny_config(**{"batch_schedule": section, "optimizer.type": "lamb" if "keep_wd_timescale" in section else "adamw"}))
        )
        derive(cfg, world_size, 128)
    assert error.value.key == key
    assert words in str(error.value)


@pytest.mark.slow
def test_an_adaptive_run_resumed_on_either_side_of_its_growth_ends_with_the_uninterrupted_runs_bytes(tmp_path, signal_handlers):
    # 16 -> 32 once the noise scale allows (factor 10^6: as soon as the smoothed |G|^2 is
    # positive), checked every 32 samples; the decisions and the estimate's averages resume
    cfg = tiny_config(
        **{
            "epochs": 2,
            "hooks": [{"type": "noise_scale", "beta": 0.5}],
            "batch_schedule": {"type": "adaptive", "start_batch_size": 16, "factor": 1e6, "check_every_samples": 32},
            "checkpoint.at_end": True,
        }
    )
    reference = run_config(cfg, tmp_path / "reference")
    decisions = reference.run.batch.decisions
    assert len(decisions) == 1 and decisions[0][3] == 32
    grew_after = int(decisions[0][1])  # the step at whose end the batch doubled
    for stop in (grew_after - 1, grew_after):
        run_dir = tmp_path / f"stopped-{stop}"
        assert run_config({**cfg, "max_steps": stop}, run_dir).step == stop
        (run_dir / "model.safetensors").unlink()
        resumed = run_config(cfg, run_dir, resume="auto")
        assert resumed.step == reference.step and resumed.run.batch.decisions == decisions
        assert (run_dir / "model.safetensors").read_bytes() == (tmp_path / "reference" / "model.safetensors").read_bytes(), stop
