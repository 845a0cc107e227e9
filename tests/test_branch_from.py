"""``--branch-from``: a new run started from another run's checkpoint, at another global
batch and learning rate, with the checkpoint's weights and optimizer state and its own
counters (the critical-batch study's branches, largebatch.study.branches).

References: SGD without momentum has no optimizer state, so its branch must end with the
bytes of a run started from the same weights by ``model.init_from``; with AdamW the
branch must start with exactly the checkpoint's moments (and so end elsewhere than the
``init_from`` run, which starts them at zero).
"""

from __future__ import annotations

import pytest
import torch

from largebatch.checkpoint import read_checkpoint
from largebatch.errors import UserError
from largebatch.launch import TrainArgs, build_run, train
from tests.conftest import assert_same_weights, run_cli, tiny_config, write_config

BRANCH = ["global_batch_size=64", "lr_schedule.type=constant", "lr_schedule.warmup_steps=0", "max_steps=2", "seed=5", "epochs=2"]


def source(tmp_path, optimizer: dict) -> tuple:
    """Two epochs at batch 32 (4 steps each), a checkpoint after the first."""
    cfg = tiny_config(**{"epochs": 2, "optimizer": optimizer, "checkpoint.interval_epochs": 1, "checkpoint.keep": 5})
    config = write_config(tmp_path, cfg)
    train(TrainArgs(config=str(config), run_dir=str(tmp_path / "source")))
    return config, tmp_path / "source" / "checkpoints" / "step-00000004.pt"


def test_sgd_branch_equals_a_run_from_the_same_weights(tmp_path):
    config, checkpoint = source(tmp_path, {"type": "sgd", "lr": 0.05, "momentum": 0.0})
    branch = train(TrainArgs(config=str(config), overrides=BRANCH, run_dir=str(tmp_path / "branch"), branch_from=str(checkpoint)))
    assert branch.step == 2 and branch.run.derived.plan.global_batch_size == 64
    reference = TrainArgs(config=str(config), overrides=[*BRANCH, f"model.init_from={checkpoint}"], run_dir=str(tmp_path / "ref"))
    train(reference)
    assert_same_weights(tmp_path / "branch" / "model.safetensors", tmp_path / "ref" / "model.safetensors")


def test_adamw_branch_starts_with_the_checkpoints_weights_and_moments(tmp_path):
    config, checkpoint = source(tmp_path, {"type": "adamw", "lr": 1e-3})
    payload = read_checkpoint(checkpoint)
    engine, _ = build_run(TrainArgs(config=str(config), overrides=BRANCH, run_dir=str(tmp_path / "b"), branch_from=str(checkpoint)))
    try:
        state = engine.state
        assert (state.step, state.epoch, state.samples_seen) == (0, 0, 0)
        for name, value in state.run.model.state_dict().items():
            assert torch.equal(value, payload["model"][name]), name
        moments = state.run.optimizer.state_dict()["state"]
        assert moments.keys() == payload["optimizer"]["state"].keys()
        for index, saved in payload["optimizer"]["state"].items():
            for key, value in saved.items():
                assert torch.equal(moments[index][key], value), (index, key)
    finally:
        engine.close()
    train(TrainArgs(config=str(config), overrides=BRANCH, run_dir=str(tmp_path / "branch"), branch_from=str(checkpoint)))
    train(TrainArgs(config=str(config), overrides=[*BRANCH, f"model.init_from={checkpoint}"], run_dir=str(tmp_path / "ref")))
    with pytest.raises(AssertionError, match="differ"):
        assert_same_weights(tmp_path / "branch" / "model.safetensors", tmp_path / "ref" / "model.safetensors")


def test_a_missing_or_unfitting_checkpoint_is_one_error_line(tmp_path):
    config, checkpoint = source(tmp_path, {"type": "adamw", "lr": 1e-3})
    with pytest.raises(UserError, match="branch-from: checkpoint not found"):
        train(TrainArgs(config=str(config), run_dir=str(tmp_path / "a"), branch_from=str(tmp_path / "nothing.pt")))
    result = run_cli(
        "train", "--config", str(config), "--run-dir", str(tmp_path / "b"), "--branch-from", str(checkpoint), "--set", "optimizer.type=lamb"
    )
    assert result.returncode == 2 and result.stderr.startswith("error:") and "holds adamw's state" in result.stderr, result.stderr


def test_a_branch_stopped_and_resumed_ends_as_one_never_stopped(tmp_path):
    config, checkpoint = source(tmp_path, {"type": "adamw", "lr": 1e-3})
    whole = train(TrainArgs(config=str(config), overrides=BRANCH, run_dir=str(tmp_path / "whole"), branch_from=str(checkpoint)))
    saving = [*BRANCH, "checkpoint.interval_steps=1"]
    part = TrainArgs(config=str(config), overrides=[*saving, "max_steps=1"], run_dir=str(tmp_path / "part"), branch_from=str(checkpoint))
    assert train(part).step == 1
    # --resume auto beside --branch-from: the branch's own checkpoint wins over the source's
    rest = TrainArgs(config=str(config), overrides=saving, run_dir=str(tmp_path / "part"), resume="auto", branch_from=str(checkpoint))
    assert train(rest).step == whole.step == 2
    assert_same_weights(tmp_path / "whole" / "model.safetensors", tmp_path / "part" / "model.safetensors")
