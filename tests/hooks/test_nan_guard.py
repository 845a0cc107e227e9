"""The non-finite check of every update (``nan_guard``) with a non-finite value injected at
a known step, and checkpoints that never hold one."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from largebatch import checkpoint as ckpt
from largebatch.engine.hook import Hook
from largebatch.engine.update import NonFiniteError
from largebatch.errors import UserError
from largebatch.hooks.checkpoint import CheckpointHook
from tests.hooks.common import build

POISON_STEP = 2


class PoisonGrad(Hook):
    """At step ``POISON_STEP``'s last micro-batch, puts NaN (or inf) into one gradient."""

    def __init__(self, name, value=float("nan")):
        super().__init__()
        self.param_name, self.value = name, value

    def after_backward(self, state):
        if state.step == POISON_STEP and state.current.micro_in_window == state.current.window_size - 1:
            dict(state.run.model.named_parameters())[self.param_name].grad[0] = self.value


class PoisonInput(Hook):
    """At step ``POISON_STEP`` feeds a NaN input: the loss and every gradient go NaN."""

    def before_micro_step(self, state):
        if state.step == POISON_STEP:
            state.current.batch.images[0, 0] = float("nan")


def weights(engine):
    return {k: v.clone() for k, v in engine.state.run.model.state_dict().items()}


class Snapshots(Hook):
    priority = 0

    def __init__(self):
        super().__init__()
        self.before = {}

    def before_step(self, state):
        self.before[state.step] = {k: v.clone() for k, v in state.run.model.state_dict().items()}


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_stop_names_the_first_offending_parameter_and_the_step(tmp_path, value):
    snaps = Snapshots()
    # fc2.bias comes after fc1.* and fc2.weight in parameter order; only it is poisoned.
    engine, _ = build(tmp_path, [PoisonGrad("fc2.bias", value), snaps], steps=4)
    with pytest.raises(Exception) as error:
        engine.run()
    cause = error.value
    assert isinstance(cause, NonFiniteError) and isinstance(cause, UserError)
    message = str(cause)
    assert f"at step {POISON_STEP} " in message and "fc2.bias" in message and "(1 of 4 parameters)" in message
    assert engine.state.step == POISON_STEP  # stopped on the step it happened
    for key, value_before in snaps.before[POISON_STEP].items():  # no update was taken
        assert torch.equal(engine.state.run.model.state_dict()[key], value_before)


def test_a_nan_loss_names_the_first_parameter_in_parameter_order(tmp_path):
    engine, _ = build(tmp_path, [PoisonInput()], steps=4)
    with pytest.raises(Exception) as error:
        engine.run()
    message = str(error.value)
    assert "loss nan" in message and "first non-finite gradient (in parameter order): fc1.weight" in message
    assert f"at step {POISON_STEP} " in message


def test_skip_takes_no_update_and_the_run_goes_on(tmp_path):
    snaps = Snapshots()
    checkpoints = CheckpointHook(interval_steps=1, interval_epochs=0, keep=10, at_end=True)
    hooks = [PoisonGrad("fc2.weight"), snaps, checkpoints]
    engine, records = build(tmp_path, hooks, steps=4, clip_grad_norm=1.0, **{"nan_guard.action": "skip"})
    steps = []
    original = engine.state.run.optimizer.step
    engine.state.run.optimizer.step = lambda *a, **k: (steps.append(engine.state.step), original(*a, **k))[1]
    engine.run()
    assert steps == [0, 1, 3]  # step 2 skipped
    assert engine.state.step == 4
    for key, value in snaps.before[POISON_STEP].items():  # step 2 changed nothing
        assert torch.equal(snaps.before[POISON_STEP + 1][key], value)
    assert records.logged[-1]["nan_guard/skipped"] == 1
    saved = ckpt.list_checkpoints(tmp_path)
    assert [p.name for p in saved] == [f"step-{s:08d}.pt" for s in (1, 2, 3, 4)]
    for path in saved:  # no checkpoint ever holds a non-finite value
        payload = ckpt.read_checkpoint(path)
        tensors = list(payload["model"].values())
        tensors += [v for entry in payload["optimizer"]["state"].values() for v in entry.values() if torch.is_tensor(v)]
        assert all(torch.isfinite(t).all() for t in tensors if t.is_floating_point())


def test_skip_stops_after_max_skips_in_a_row(tmp_path):
    engine, _ = build(tmp_path, [PoisonInput()], steps=4, **{"nan_guard.action": "skip", "nan_guard.max_skips": 1})
    poison = engine.hooks[0]
    poison.before_micro_step = lambda state: state.current.batch.images.fill_(float("nan")) if state.step >= 1 else None
    with pytest.raises(Exception) as error:
        engine.run()
    assert "after 1 skipped step(s) in a row" in str(error.value) and engine.state.step == 2


def test_without_the_guard_a_diverged_model_is_never_checkpointed(tmp_path):
    checkpoints = CheckpointHook(interval_steps=1, interval_epochs=0, at_end=False)
    engine, _ = build(tmp_path, [PoisonGrad("fc1.bias"), checkpoints], steps=4, **{"nan_guard.action": "off"})
    with pytest.raises(Exception) as error:
        engine.run()
    message = str(error.value.__cause__)
    assert f"refusing to save the checkpoint of step {POISON_STEP + 1}" in message
    assert "fc1.bias" in message and f"step-{POISON_STEP:08d}.pt, is intact" in message
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == [f"step-{s:08d}.pt" for s in (1, 2)]


def test_non_finite_optimizer_state_is_refused(tmp_path):
    engine, _ = build(tmp_path, [], steps=1, optimizer="lamb")
    engine.run()
    state = engine.state
    param = state.run.model.fc1.weight
    state.run.optimizer.state[param]["exp_avg"][0, 0] = float("inf")
    with pytest.raises(UserError, match=r"optimizer fc1\.weight\.exp_avg \(1 of 48\)"):
        ckpt.save_checkpoint(state, [], keep=1)


def test_with_a_grad_scaler_inf_gradients_are_left_to_the_scaler(tmp_path):
    snaps = Snapshots()
    engine, records = build(tmp_path, [PoisonGrad("fc2.bias", float("inf")), snaps], steps=4)
    engine.state.run = dataclasses.replace(engine.state.run, scaler=torch.amp.GradScaler("cpu", init_scale=16.0))
    engine.run()  # no error: an overflow under fp16 is routine
    assert engine.state.step == 4
    for key, value in snaps.before[POISON_STEP].items():  # the scaler skipped the update
        assert torch.equal(snaps.before[POISON_STEP + 1][key], value)
    assert engine.state.run.scaler.get_scale() == 8.0  # and halved its scale once
    assert records.logged[-1]["nan_guard/overflows"] == 1


@pytest.mark.slow
def test_a_diverging_run_exits_2_naming_the_step_and_parameter(tmp_path):
    from tests.conftest import run_cli, tiny_config, write_config

    # lr 1e30: the first update blows the weights up, so step 1's logits overflow.
    cfg = tiny_config(**{"optimizer.lr": 1e30, "lr_schedule.warmup_steps": 0, "checkpoint.interval_steps": 1})
    run_dir = tmp_path / "run"
    result = run_cli("train", "--config", str(write_config(tmp_path, cfg)), "--run-dir", str(run_dir))
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    from largebatch.config import validate
    from largebatch.config.typed import typed
    from largebatch.models import build_model

    typed_cfg = typed(validate(cfg))
    first_param = next(build_model(typed_cfg.model, typed_cfg.data).named_parameters())[0]
    assert "non-finite values at step 1 " in line and f"first non-finite gradient (in parameter order): {first_param} " in line
    assert [p.name for p in ckpt.list_checkpoints(run_dir)] == ["step-00000001.pt"]


def test_off_checks_nothing(tmp_path):
    engine, _ = build(tmp_path, [PoisonGrad("fc2.bias")], steps=4, **{"nan_guard.action": "off"})
    engine.run()  # the NaN goes through unchecked
    assert engine.state.current.grad_norms is None  # and no norm was computed
    assert torch.isnan(engine.state.run.model.fc2.bias).any()


def test_a_bad_action_is_a_clear_error():
    from largebatch.config import validate
    from largebatch.errors import ConfigError
    from tests.conftest import tiny_config

    with pytest.raises(ConfigError, match=r"got 'halt'; allowed: 'stop', 'skip', 'off'") as info:
        validate(tiny_config(**{"nan_guard.action": "halt"}))
    assert info.value.key == "nan_guard.action"
