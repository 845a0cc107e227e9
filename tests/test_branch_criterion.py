"""The adaptive batch's ``branch`` criterion (``largebatch.engine.branch_fork``): the forks
leave no trace (a run that never grows is, byte for byte, a fixed run at its batch), a run
resumed on either side of a decision ends with the uninterrupted run's bytes, under one
process and under torchrun (ddp, fsdp), and the decision is the study's rule on the
measured losses."""

from __future__ import annotations

import json
import math
import pathlib

import pytest

from largebatch import preemption
from largebatch.config import derive, validate
from largebatch.config.typed import typed
from largebatch.errors import ConfigError
from largebatch.launch import TrainArgs, train
from largebatch.study.branches import critical
from tests.conftest import tiny_config, write_config
from tests.sharding.test_fsdp_runs import ok, torchrun


def branch(start: int, tolerance: float, **more) -> dict:
    """Adaptive from ``start`` to 32, checked every 64 samples, forks of 32 samples, lr rule none."""
    return {
        "type": "adaptive",
        "start_batch_size": start,
        "max_batch_size": 32,
        "check_every_samples": 64,
        "criterion": "branch",
        "branch_samples": 32,
        "branch_tolerance": tolerance,
        "lr_scaling": "none",
        **more,
    }


def config(**overrides) -> dict:
    # two epochs of 128 samples at a constant rate: a fixed run at B and an adaptive run that
    # stays at B take the same steps at the same rate (the position only moves the schedule)
    return tiny_config(
        **{
            "epochs": 2,
            "optimizer.lr": 3e-3,
            "lr_schedule": {"type": "constant", "warmup_steps": 0},
            "eval.at_end": True,
            "checkpoint.at_end": True,
            **overrides,
        }
    )


def run(tmp_path: pathlib.Path, cfg: dict, name: str, resume: str | None = None):
    path = write_config(tmp_path, cfg, name=f"{name}.yaml")
    preemption.clear()
    overrides = ["max_steps=null"] if resume else []
    return train(TrainArgs(config=str(path), overrides=overrides, run_dir=str(tmp_path / name), resume=resume))


def logged(run_dir: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_forks_that_never_grow_the_batch_leave_the_bytes_of_a_fixed_run(tmp_path):
    # at a small rate AdamW's progress follows its step count: the 2B fork (half the steps)
    # keeps about half the B fork's progress, never 1 - 1e-6 of it
    section = branch(8, 1e-6, check_every_samples=128)
    adaptive = run(tmp_path, config(**{"global_batch_size": 32, "optimizer.lr": 3e-4, "batch_schedule": section}), "adaptive")
    fixed = run(tmp_path, config(**{"global_batch_size": 8, "optimizer.lr": 3e-4}), "fixed")
    assert adaptive.run.batch.decisions == [] and adaptive.step == fixed.step == 32
    checks = [r["batch/criterion"] for r in logged(tmp_path / "adaptive") if "loss" in r and r["step"] % 16 == 0]
    assert len(checks) == 2 and all(math.isfinite(c) and c < 1 - 1e-6 for c in checks)  # two checks forked, neither grew
    assert (tmp_path / "adaptive" / "model.safetensors").read_bytes() == (tmp_path / "fixed" / "model.safetensors").read_bytes()
    eval_adaptive = [r for r in logged(tmp_path / "adaptive") if "eval/loss" in r]
    eval_fixed = [r for r in logged(tmp_path / "fixed") if "eval/loss" in r]
    assert [r["eval/loss"] for r in eval_adaptive] == [r["eval/loss"] for r in eval_fixed]


def test_the_decision_is_the_study_rule_on_the_measured_losses(tmp_path, monkeypatch):
    from largebatch.engine import branch_fork

    measured: list[float | None] = []
    heldout = branch_fork.heldout_loss

    def recording(run_, loader):
        value = heldout(run_, loader)
        measured.append(value)
        return value

    monkeypatch.setattr(branch_fork, "heldout_loss", recording)
    state = run(tmp_path, config(**{"global_batch_size": 32, "batch_schedule": branch(8, 0.5)}), "grown")
    criteria = [r["batch/criterion"] for r in logged(tmp_path / "grown") if "batch/criterion" in r]
    # each check: L0, L(B), L(2B); the efficiency and the verdict are branches.critical's
    checks = [measured[i : i + 3] for i in range(0, len(measured), 3)]
    grew = [d[3] for d in state.run.batch.decisions]
    assert grew, "the batch never grew: the test needs a growth"
    batch, growths = 8, []
    for start, end_1, end_2 in checks:
        assert start is not None and end_1 is not None and end_2 is not None
        found = critical(start, {1: {0: end_1}, 2: {0: end_2}}, batch, 0.5)
        if end_1 >= start:  # the B fork made no progress: nothing to compare with, logged as NaN
            assert found.k is None and any(math.isnan(c) for c in criteria)
            continue
        assert found.efficiency[2] == pytest.approx((start - end_2) / (start - end_1), rel=1e-12)
        assert found.efficiency[2] in criteria
        if found.k == 2:
            batch *= 2
            growths.append(float(batch))
    assert growths == grew


@pytest.mark.slow
def test_a_branch_run_resumed_on_either_side_of_a_decision_ends_with_the_uninterrupted_runs_bytes(tmp_path, signal_handlers):
    cfg = config(**{"global_batch_size": 32, "batch_schedule": branch(8, 0.5)})
    reference = run(tmp_path, cfg, "reference")
    decisions = reference.run.batch.decisions
    assert decisions, "the batch never grew: the test needs a growth"
    grew_after = int(decisions[0][1])
    for stop in (grew_after - 1, grew_after):
        name = f"stopped-{stop}"
        assert run(tmp_path, {**cfg, "max_steps": stop}, name).step == stop
        (tmp_path / name / "model.safetensors").unlink()
        resumed = run(tmp_path, cfg, name, resume="auto")
        assert resumed.step == reference.step and resumed.run.batch.decisions == decisions
        assert (tmp_path / name / "model.safetensors").read_bytes() == (tmp_path / "reference" / "model.safetensors").read_bytes(), stop


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_branch_run_under_torchrun_resumes_across_a_decision_exactly(tmp_path, strategy):
    # 2 ranks x micro-batch 8: adaptive 16 -> 32, forks of 32 samples every 64
    cfg = config(**{"global_batch_size": 32, "batch_schedule": branch(16, 0.9), "clip_grad_norm": 1.0, "dist": {"strategy": strategy}})
    straight = tmp_path / "straight"
    ok(torchrun(tmp_path, cfg, straight))
    grown = [r["step"] for r in logged(straight) if r.get("batch/global") == 32]
    assert grown, "the batch never grew: the test needs a growth"
    decision = grown[0] - 1  # the step at whose end the forks ran
    for stop in (decision - 1, decision):
        run_dir = tmp_path / f"stopped-{stop}"
        ok(torchrun(tmp_path, {**cfg, "max_steps": stop}, run_dir))
        (run_dir / "model.safetensors").unlink()
        result = ok(torchrun(tmp_path, cfg, run_dir, "--resume", "auto", "--set", "max_steps=null"))
        assert f"at step {stop}" in result.stdout
        assert (run_dir / "model.safetensors").read_bytes() == (straight / "model.safetensors").read_bytes(), stop


def test_config_show_prints_the_criterion_and_the_forks_share():
    cfg = typed(validate(tiny_config(**{"batch_schedule": branch(8, 0.1)})))
    shown = derive(cfg, 1, 128).to_dict()["batch_schedule"]
    assert shown["criterion"] == {
        "name": "branch",
        "check_every_samples": 64,
        "branch_samples": 32,
        "branch_tolerance": 0.1,
        "fork_share": 1.0,
    }


@pytest.mark.parametrize(
    ("section", "key", "words"),
    [
        (branch(8, 0.2, branch_samples=None), "batch_schedule.branch_samples", "is required with criterion 'branch'"),
        (branch(8, 0.2, branch_samples=48), "batch_schedule.branch_samples", "set it to a multiple of 32, e.g. 32"),
        ({**branch(8, 0.2), "criterion": "noise_scale"}, "batch_schedule.branch_samples", "criterion 'branch' only"),
        (
            {"type": "ramp", "start_batch_size": 8, "ramp_samples": 64, "branch_samples": 32},
            "batch_schedule.branch_samples",
            "set type to 'adaptive'",
        ),
        (branch(8, 1.0), "batch_schedule.branch_tolerance", ""),
    ],
)
def test_a_bad_branch_setting_is_one_error_naming_the_key(section, key, words):
    cfg = tiny_config(**{"batch_schedule": section, "hooks": ["noise_scale"]})
    with pytest.raises(ConfigError) as error:
        derive(typed(validate(cfg)), 1, 128)
    assert error.value.key == key
    assert words in str(error.value)


def test_a_forks_snapshot_holds_the_state_a_skipped_lamb_step_left():
    """A fork starts from a step the deferred non-finite check skipped on the device flag:
    LAMB's step counts in the snapshot (restored after the forks) are those before it."""
    import types

    import torch

    from largebatch.engine.branch_fork import Snapshot
    from largebatch.engine.update import step_unless
    from largebatch.optim.lamb import Lamb

    model = torch.nn.Linear(3, 2)
    optimizer = Lamb(model.parameters(), lr=0.01)
    for bad in (False, True):
        for param in model.parameters():
            param.grad = torch.full_like(param, math.nan if bad else 1.0)
        step_unless(optimizer, torch.tensor(float(bad)))
    run = types.SimpleNamespace(model=model, optimizer=optimizer, scaler=None, backend=types.SimpleNamespace(device=torch.device("cpu")))
    assert [state["step"] for state in Snapshot(run).optimizer_state.values()] == [1, 1]
