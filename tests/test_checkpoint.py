"""Checkpoints (``largebatch/checkpoint.py``): the run written and read back through the
run directory's names, ``--resume auto`` past unreadable files, never a non-finite save,
hooks' states by firing order, the non-finite check's counts, and the model weights
``model.init_from`` reads from a run directory, a file, a checkpoint. Whole runs stopped
and resumed are in ``tests/test_resume_matrix.py`` and ``tests/test_preemption.py``."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from largebatch import checkpoint as ckpt
from largebatch.config.typed import typed
from largebatch.errors import UserError
from largebatch.rundir import RunDir
from tests.conftest import tiny_config
from tests.engine.helpers import make_engine


def _fake_checkpoint(path, step):
    torch.save({"format": 1, "model": {"w": torch.full((2,), float(step))}, "step": step}, path)


def test_resume_auto_skips_unreadable_checkpoints_and_a_bad_latest_pointer(tmp_path, capsys):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    _fake_checkpoint(folder / "step-00000002.pt", 2)
    _fake_checkpoint(folder / "step-00000004.pt", 4)
    full = (folder / "step-00000004.pt").read_bytes()
    (folder / "step-00000004.pt").write_bytes(full[: len(full) // 2])  # corrupt (truncated)
    (folder / ".step-00000006.pt.tmp").write_bytes(full[:100])  # a crash's leftover
    (folder / "latest").write_text("step-00000006.pt")  # names a file that is not there
    path, payload = ckpt.read_resume_checkpoint("auto", tmp_path)
    assert path.name == "step-00000002.pt" and payload["step"] == 2
    warnings = capsys.readouterr().out.strip().splitlines()
    assert len(warnings) == 2
    assert warnings[0].startswith("warning: skipping unreadable checkpoint:") and "step-00000004.pt" in warnings[0]
    assert (
        warnings[1]
        == "warning: checkpoints/latest names step-00000006.pt, but the newest loadable checkpoint is step-00000002.pt: using it"
    )

    (folder / "step-00000002.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="none of the 2 checkpoint"):
        ckpt.read_resume_checkpoint("auto", tmp_path)
    assert ckpt.read_resume_checkpoint("auto", tmp_path / "empty") is None


def test_non_finite_weights_are_never_checkpointed(tmp_path):
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight[0, 1] = float("nan")
        model.bias[1] = float("inf")
    run = types.SimpleNamespace(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        run_dir=RunDir(tmp_path),
        is_main=True,
        config=typed(tiny_config()),
    )
    state = types.SimpleNamespace(run=run, step=7)
    with pytest.raises(UserError) as error:
        ckpt.save_checkpoint(state, [], keep=3)
    message = str(error.value)
    assert "refusing to save the checkpoint of step 7" in message
    assert "weight (1 of 6)" in message and "bias (1 of 2)" in message and "no earlier checkpoint" in message
    assert not (tmp_path / "checkpoints").exists()


def test_the_non_finite_check_counts_values_not_sums():
    """A tensor whose sum is not finite is counted value by value: finite values whose sum
    overflows are not reported; a NaN beside an inf is."""
    module = torch.nn.Module()
    module.huge = torch.nn.Parameter(torch.full((4,), 3e38))  # finite; the float32 sum overflows to inf
    module.bad = torch.nn.Parameter(torch.tensor([1.0, float("nan"), float("-inf"), 2.0]))
    module.fine = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    module.register_buffer("steps", torch.tensor([5]))  # not floating point: not checked
    assert ckpt.non_finite_tensors(module) == ["bad (2 of 4)"]


def test_two_hooks_of_one_name_keep_their_own_state_in_a_checkpoint():
    from largebatch.engine.hook import Hook

    class Counter(Hook):
        def __init__(self, start: int, priority=None) -> None:
            super().__init__(priority)
            self.value = start

        def state_dict(self):
            return {"value": self.value}

        def load_state_dict(self, state):
            self.value = state["value"]

    # firing order decides the suffix: the LOW-priority one fires second whatever the list order
    late, early, other = Counter(1, priority="LOW"), Counter(2, priority="HIGH"), Counter(3)
    assert ckpt.hook_state_keys([late, early]) == ["Counter#2", "Counter"]
    assert ckpt.hook_state_keys([early, late]) == ["Counter", "Counter#2"]
    saved = ckpt.hook_states([late, early, other])
    assert saved == {"Counter": {"value": 2}, "Counter#2": {"value": 3}, "Counter#3": {"value": 1}}
    # restored into fresh instances listed in another order, each gets its own value back
    fresh = [Counter(0), Counter(0, priority="HIGH"), Counter(0, priority="LOW")]
    for key, hook in zip(ckpt.hook_state_keys(fresh), fresh):
        hook.load_state_dict(saved[key])
    assert [h.value for h in fresh] == [3, 2, 1]


def trained(tmp_path, steps: int, guard: str = "stop"):
    """An engine that took ``steps`` LAMB steps on a small model, its state in ``tmp_path``."""
    from largebatch.optim.lamb import Lamb

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    batches = [(torch.randn(4, 6), torch.randint(3, (4,))) for _ in range(2 * steps)]
    engine = make_engine(
        model,
        batches,
        global_batch_size=8,
        micro_batch_size=4,
        num_samples=8 * steps,
        optimizer=Lamb(model.parameters(), lr=0.01, weight_decay=0.01),
        run_dir=tmp_path,
        **{"data.num_classes": 3, "nan_guard.action": guard},
    )
    engine.run()
    return engine


def test_a_checkpoint_restores_weights_optimizer_counters_and_the_guards_counts(tmp_path):
    engine = trained(tmp_path / "a", steps=3, guard="skip")
    state = engine.state
    state.run.guard.skipped, state.run.guard.overflows = 2, 1
    path = ckpt.save_checkpoint(state, engine.hooks, keep=2)
    assert path == RunDir(tmp_path / "a").checkpoint(3) and (tmp_path / "a/checkpoints/latest").read_text() == path.name
    fresh = trained(tmp_path / "b", steps=1, guard="skip")  # another state to load into
    found, payload = ckpt.read_resume_checkpoint("auto", RunDir(tmp_path / "a"))
    ckpt.load_checkpoint(found, fresh.state, fresh.hooks, fresh.train_loader, ignore_config=True, payload=payload)
    assert fresh.state.counters == state.counters and fresh.state.step == 3
    for (name, a), b in zip(state.run.model.state_dict().items(), fresh.state.run.model.state_dict().values()):
        assert torch.equal(a, b), name
    moments = [s["exp_avg"] for s in state.run.optimizer.state.values()]
    assert all(torch.equal(a, s["exp_avg"]) for a, s in zip(moments, fresh.state.run.optimizer.state.values()))
    assert (fresh.state.run.guard.skipped, fresh.state.run.guard.overflows) == (2, 1)


def test_a_checkpoint_without_the_run_record_a_resume_reads_is_refused_by_name(tmp_path):
    engine = trained(tmp_path, steps=1)
    payload = ckpt.read_checkpoint(ckpt.save_checkpoint(engine.state, engine.hooks, keep=1))
    del payload["nan_guard"]  # as written before the non-finite check was part of every step
    with pytest.raises(
        UserError, match=r"the checkpoint has no nan_guard, which every checkpoint .* start a new run from its weights"
    ) as info:
        ckpt.load_checkpoint(tmp_path, engine.state, engine.hooks, engine.train_loader, ignore_config=True, payload=payload)
    assert info.value.path == str(tmp_path)


def test_model_weights_for_init_from_from_a_run_a_file_and_a_checkpoint(tmp_path):
    engine = trained(tmp_path, steps=1)
    run = RunDir(tmp_path)
    ckpt.save_final_weights(engine.state.run.model, run.weights(), is_main=True)
    assert ckpt.read_model_weights(tmp_path) == run.weights()  # a finished run directory
    assert ckpt.read_model_weights(run.weights()) == run.weights()  # the file itself
    saved = ckpt.read_model_weights(ckpt.save_checkpoint(engine.state, engine.hooks, keep=1))
    assert saved.keys() == engine.state.run.model.state_dict().keys()
    assert all(torch.equal(saved[k], v) for k, v in engine.state.run.model.state_dict().items())
    assert ckpt.read_model_weights(tmp_path / "nowhere") is None
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(UserError, match="cannot read checkpoint"):
        ckpt.read_model_weights(tmp_path / "junk.pt")


def test_a_hook_whose_state_a_checkpoint_cannot_hold_is_named_when_saving(tmp_path):
    import numpy as np

    from largebatch.engine.hook import Hook

    class Mean(Hook):
        def state_dict(self):
            return {"mean": np.mean([1.0, 2.0])}  # numpy.float64, not a float

    engine = trained(tmp_path, steps=1)
    with pytest.raises(UserError) as error:
        ckpt.save_checkpoint(engine.state, [*engine.hooks, Mean()], keep=1)
    assert str(error.value).startswith("hook Mean's state_dict() holds ['mean']: numpy.float64, which a checkpoint does not store")
    assert not (tmp_path / "checkpoints").exists()  # nothing written


def test_a_checkpoint_holds_its_config_redacted_and_resumes_against_the_real_one(tmp_path):
    engine = trained(tmp_path, steps=1)
    hook = {"type": "hooks/notify.py:Notify", "url": "https://alice:s3cr3t@hooks.example.com/x", "api_key": "tok-123"}
    weights = "https://alice:s3cr3t@hub.example.com/vit.safetensors"  # a key a resume compares (not a hook's)
    engine.state.run = dataclasses.replace(engine.state.run, config=typed(tiny_config(hooks=[hook], **{"model.init_from": weights})))
    path = ckpt.save_checkpoint(engine.state, engine.hooks, keep=1)
    assert b"s3cr3t" not in path.read_bytes() and b"tok-123" not in path.read_bytes()
    payload = ckpt.read_checkpoint(path)
    assert payload["config"]["hooks"] == [
        {"type": "hooks/notify.py:Notify", "url": "https://<redacted>@hooks.example.com/x", "api_key": "<redacted>"}
    ]
    assert payload["config"]["model"]["init_from"] == "https://<redacted>@hub.example.com/vit.safetensors"
    ckpt.check_resumable(path, payload, engine.state)  # the run's real config matches its redacted record


def test_a_sharded_checkpoints_weights_are_read_as_data(tmp_path):
    """``model.init_from`` on a sharded (DCP) checkpoint: its weights, read through the
    restricted metadata reader, are the run's final weights; a ``.metadata`` carrying a
    pickled call is refused without running it."""
    import os
    import pickle

    from safetensors.torch import load_file

    from largebatch.launch import TrainArgs, train
    from largebatch.safe_load import UntrustedCheckpoint
    from tests.conftest import write_config

    config = write_config(tmp_path, tiny_config(**{"dist.strategy": "fsdp", "checkpoint.at_end": True}))
    train(TrainArgs(config=str(config), run_dir=str(tmp_path / "run")))  # one process: FSDP2 over a world of 1
    (folder,) = ckpt.list_checkpoints(tmp_path / "run")
    final = load_file(str(tmp_path / "run" / "model.safetensors"))
    weights = ckpt.read_model_weights(folder)
    assert weights.keys() == final.keys() and all(torch.equal(weights[k], final[k]) for k in final)

    class RunsCode:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'it-ran'}",))

    (folder / ".metadata").write_bytes(pickle.dumps(RunsCode()))
    with pytest.raises(UntrustedCheckpoint, match="posix.system"):
        ckpt.read_model_weights(folder)
    with pytest.raises(UntrustedCheckpoint, match="--trust-checkpoint"):
        ckpt.read_resume_checkpoint("auto", tmp_path / "run")
    assert not (tmp_path / "it-ran").exists()
