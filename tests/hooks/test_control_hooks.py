"""Checkpoint, eval, stop and hook_timer: when they act, and what they leave behind."""

from __future__ import annotations

import collections
import json
import threading
import time

import pytest
import torch

from largebatch import checkpoint as ckpt
from largebatch.engine.hook import Hook, HookError
from largebatch.hooks.checkpoint import CheckpointHook
from largebatch.hooks.eval import EvalHook
from largebatch.hooks.hook_timer import HookTimerHook
from largebatch.hooks.stop import StopHook
from tests.conftest import run_cli, tiny_config, write_config
from tests.engine.helpers import ListLoader
from tests.hooks.common import CLASSES, batches, build


def saved_steps(run_dir):
    return [int(p.stem.split("-")[1]) for p in ckpt.list_checkpoints(run_dir)]


def with_checkpoints(tmp_path, hook, hooks=(), **kwargs):
    engine, records = build(tmp_path, [*hooks, hook], **kwargs)
    return engine, records


def test_checkpoint_every_n_steps_and_every_epoch(tmp_path):
    engine, _ = with_checkpoints(
        tmp_path / "steps", CheckpointHook(interval_steps=3, interval_epochs=0, keep=10, at_end=False), steps=4, epochs=2
    )
    engine.run()
    assert saved_steps(tmp_path / "steps") == [3, 6]
    engine, _ = with_checkpoints(tmp_path / "epochs", CheckpointHook(interval_epochs=1, keep=10, at_end=True), steps=3, epochs=2)
    engine.run()
    assert saved_steps(tmp_path / "epochs") == [3, 6]


class StepsDone(Hook):
    """An event per finished step, for a write that waits until training has gone on."""

    def __init__(self):
        super().__init__()
        self.done = collections.defaultdict(threading.Event)

    def after_step(self, state):
        self.done[state.step].set()


def test_asynchronous_saves_hold_what_synchronous_ones_hold(tmp_path, monkeypatch):
    """The host copy is taken at the step: the writes of steps 2 and 4 start only once
    the next step has updated the weights, and still hold the weights of their step."""
    steps_done = {}
    real = ckpt.atomic_torch_save

    def late_write(obj, path, *args):
        step = int(path.stem.split("-")[1])
        if step in (2, 4) and threading.current_thread() is not threading.main_thread():
            assert steps_done["async"].done[step + 1].wait(timeout=60), f"step {step + 1} never ran while step {step} was written"
        return real(obj, path, *args)

    monkeypatch.setattr(ckpt, "atomic_torch_save", late_write)
    payloads = {}
    for mode in ("sync", "async"):
        steps_done[mode] = StepsDone()
        hook = CheckpointHook(interval_steps=2, interval_epochs=0, keep=10, at_end=False, async_save=mode == "async")
        engine, _ = with_checkpoints(tmp_path / mode, hook, hooks=[steps_done[mode]], steps=4, epochs=2, optimizer="lamb")
        engine.run()
        assert saved_steps(tmp_path / mode) == [2, 4, 6, 8]
        payloads[mode] = [ckpt.read_checkpoint(path) for path in ckpt.list_checkpoints(tmp_path / mode)]
    for sync, background in zip(payloads["sync"], payloads["async"]):
        assert sync["counters"] == background["counters"] and sync["hooks"] == background["hooks"]
        for key, tensor in sync["model"].items():
            assert torch.equal(tensor, background["model"][key]), key
        for index, entry in sync["optimizer"]["state"].items():
            for name, value in entry.items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(background["optimizer"]["state"][index][name])), (index, name)


def test_an_asynchronous_save_that_fails_is_reported_at_the_next_one_naming_its_step(tmp_path, monkeypatch):
    real = ckpt.atomic_torch_save

    def disk_full_at_step_2(obj, path, *args):
        if path.name == "step-00000002.pt":
            raise OSError(28, "No space left on device")
        return real(obj, path, *args)

    monkeypatch.setattr(ckpt, "atomic_torch_save", disk_full_at_step_2)
    hook = CheckpointHook(interval_steps=2, interval_epochs=0, keep=10, at_end=False, async_save=True)
    engine, records = with_checkpoints(tmp_path, hook, steps=4)
    with pytest.raises(HookError, match=r"the checkpoint of step 2, written in the background, failed \(OSError: .*No space left"):
        engine.run()
    assert [r["step"] for r in records.logged] == [1, 2, 3]  # trained on until step 4's save waited for it
    assert saved_steps(tmp_path) == []


class Sleep(Hook):
    def __init__(self, step, seconds):
        super().__init__()
        self.step, self.seconds = step, seconds

    def after_step(self, state):
        if state.step == self.step:
            time.sleep(self.seconds)


def test_checkpoint_every_t_minutes(tmp_path):
    # Steps take milliseconds (a loaded machine: tenths of a second); step 2 sleeps 2 s,
    # and the interval is 1.5 s.
    hook = CheckpointHook(interval_epochs=0, interval_minutes=1.5 / 60, keep=10, at_end=False)
    engine, _ = with_checkpoints(tmp_path, hook, hooks=[Sleep(2, 2.0)], steps=4)
    engine.run()
    assert saved_steps(tmp_path) == [2]


def test_eval_every_n_steps_never_twice_for_a_step(tmp_path):
    engine, records = build(tmp_path, [EvalHook(interval_steps=2)], steps=4, **{"eval.interval_epochs": 1, "eval.at_end": True})
    engine.eval_loader = ListLoader(batches(2, seed=5), CLASSES)
    engine.run()
    assert [step for step, _ in records.evals] == [2, 4]  # the epoch end and the run end are step 4 too
    assert all(set(result) >= {"eval/loss", "eval/top1", "eval/top5"} for _, result in records.evals)


def test_stop_at_max_steps_with_a_checkpoint_first(tmp_path):
    engine, _ = with_checkpoints(tmp_path, CheckpointHook(interval_epochs=0, at_end=False), hooks=[StopHook(max_steps=3)], steps=6)
    engine.run()
    assert engine.state.step == 3 and not engine.state.interrupted
    assert saved_steps(tmp_path) == [3]


@pytest.mark.slow
def test_stop_after_a_time_limit_exits_75_after_a_checkpoint_and_resumes(tmp_path):
    cfg = tiny_config(**{"epochs": 2, "hooks": [{"type": "stop", "minutes": 1e-6}], "checkpoint.interval_epochs": 0})
    config = write_config(tmp_path, cfg)
    run_dir = tmp_path / "run"
    result = run_cli("train", "--config", str(config), "--run-dir", str(run_dir))
    assert result.returncode == 75, result.stderr[-2000:]
    assert "time limit of 1e-06 minutes reached at step 1" in result.stdout
    assert saved_steps(run_dir) == [1] and not (run_dir / "model.safetensors").exists()
    resumed = run_cli("train", "--config", str(config), "--run-dir", str(run_dir), "--resume", "auto", "--set", "hooks=[]")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout and (run_dir / "model.safetensors").exists()


def test_hook_timer_finds_the_slow_hook(tmp_path, capsys):
    class Slow(Hook):
        def after_step(self, state):
            time.sleep(0.05)

    engine, _ = build(tmp_path, [HookTimerHook(top=3), Slow()], steps=4)
    engine.run()
    report = json.loads((tmp_path / "hook_times.json").read_text())
    slowest = report["hooks"][0]
    assert (slowest["hook"], slowest["event"], slowest["calls"]) == ("Slow", "after_step", 4)
    assert slowest["seconds"] >= 4 * 0.05 and report["run_seconds"] >= slowest["seconds"]
    assert {(r["hook"], r["event"]) for r in report["hooks"]} >= {("MetricsLogger", "after_step"), ("Records", "after_step")}
    assert "Slow.after_step" in capsys.readouterr().out
    torch.testing.assert_close(slowest["ms_per_call"], 1000 * slowest["seconds"] / 4)


BAD_ARGUMENTS = [
    ("checkpoint", "keep", -1),
    ("checkpoint", "keep", 0),
    ("checkpoint", "interval_steps", 0),
    ("checkpoint", "interval_epochs", -1),
    ("checkpoint", "interval_minutes", 0),
    ("checkpoint", "at_end", "yes"),
    ("checkpoint", "async_save", 1),
    ("logger", "console", "maybe"),
    ("ema", "decay", 1.5),
    ("eval", "interval_steps", -1),
    ("eval", "interval_epochs", -2),
    ("stop", "max_steps", 0),
    ("stop", "minutes", -1),
    ("trust_ratio", "top_k", -3),
    ("hook_timer", "top", -1),
    ("throughput", "peak_tflops", 0),
]


@pytest.mark.parametrize(("hook", "argument", "value"), BAD_ARGUMENTS, ids=[f"{h}.{a}={v!r}" for h, a, v in BAD_ARGUMENTS])
def test_a_built_in_hooks_argument_is_checked_as_its_config_key_is(hook, argument, value):
    """``hooks=[dict(type='checkpoint', keep=-1)]`` is refused as ``checkpoint.keep=-1`` is,
    naming ``hooks[0].keep``: a negative keep would delete each checkpoint as it is written."""
    from largebatch.config.schema import validate_section
    from largebatch.errors import ConfigError
    from largebatch.hooks import _builtin_class, instantiate

    cls = _builtin_class(hook)
    with pytest.raises(ConfigError) as refused:
        instantiate(cls, {"decay": 0.9, argument: value} if hook == "ema" else {argument: value}, "hooks[0]")
    assert refused.value.key == f"hooks[0].{argument}"
    rule = cls.argument_checks[argument]
    if isinstance(rule, str):  # the config key it mirrors refuses the value too; a range, in the same words
        section, key = rule.split(".")
        with pytest.raises(ConfigError) as as_config:
            validate_section(section, {key: value})
        if "must be" in as_config.value.message:
            assert as_config.value.message == refused.value.message


def test_every_argument_of_the_checkpoint_hook_is_checked():
    import inspect

    assert set(CheckpointHook.argument_checks) == set(inspect.signature(CheckpointHook).parameters) - {"priority"}
