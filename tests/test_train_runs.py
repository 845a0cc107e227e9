"""Whole runs through the command line: torchrun with 2 ranks, exact resume, the outputs."""

import json
import shutil
import sys

import pytest
import timm
import torch
import yaml
from safetensors.torch import load_file

from tests.conftest import (
    PLACEMENT,
    RANK_WEIGHTS,
    REPO,
    TORCHRUN,
    assert_same_weights,
    clean_env,
    four_rank_config,
    free_port,
    hooks_override,
    placements,
    run_cli,
    tiny_config,
    write_config,
)

SAVE_RANKS = "hooks=[{type: tests/support/rank_weights.py:SaveRankWeights}]"


@pytest.mark.dist
@pytest.mark.slow
def test_torchrun_two_ranks_end_with_identical_weights(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(REPO / "train.py"),
        "--config",
        str(REPO / "configs/demo/vit-tiny-synthetic.py"),
        "--run-dir",
        str(run_dir),
        "--set",
        SAVE_RANKS,
    ]
    import subprocess

    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=clean_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rank0, rank1 = load_file(run_dir / "rank0.safetensors"), load_file(run_dir / "rank1.safetensors")
    final = load_file(run_dir / "model.safetensors")
    assert rank0.keys() == rank1.keys() == final.keys()
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key
        assert torch.equal(rank0[key], final[key]), key
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["derived"]["world_size"] == 2 and config["derived"]["accumulation"] == 4
    # The weights load into the timm model the config names.
    model_cfg = {k: v for k, v in config["model"].items() if k != "name"}
    model = timm.create_model(config["model"]["name"], num_classes=10, img_size=16, in_chans=3, **model_cfg)
    model.load_state_dict(final)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if "loss" in r]
    assert train_records and all({"step", "epoch", "loss", "lr", "samples_per_sec"} <= r.keys() for r in train_records)
    assert train_records[-1]["step"] == config["derived"]["total_steps"]
    assert train_records[-1]["loss"] < train_records[0]["loss"]


def _train(tmp_path, cfg, run_dir, *extra):
    path = write_config(tmp_path, cfg)
    result = run_cli("train.py", "--config", str(path), "--run-dir", str(run_dir), *extra)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.mark.slow
@pytest.mark.parametrize("stop_at", [3, 4, 6])  # mid-epoch, at an epoch boundary, mid-epoch 2
def test_resumed_run_equals_uninterrupted_run(tmp_path, stop_at):
    cfg = tiny_config(**{"epochs": 2, "mixup.mixup_alpha": 0.4, "model.drop_rate": 0.1, "checkpoint.at_end": True})
    _train(tmp_path, cfg, tmp_path / "straight")
    stopped = tmp_path / "stopped"
    _train(tmp_path, {**cfg, "max_steps": stop_at}, stopped)
    assert (stopped / "checkpoints" / f"step-{stop_at:08d}.pt").exists()
    result = _train(tmp_path, cfg, stopped, "--resume", "auto", "--set", "max_steps=null")
    assert "resumed from" in result.stdout and f"at step {stop_at}" in result.stdout
    a, b = load_file(tmp_path / "straight/model.safetensors"), load_file(stopped / "model.safetensors")
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.slow
def test_resume_auto_drops_a_cut_last_metrics_line_and_logs_each_step_once(tmp_path):
    """A run killed while writing metrics.jsonl resumes: the cut line goes (with a warning),
    and the file ends as an uninterrupted run's does: each step once, every line JSON."""
    cfg = tiny_config(**{"log.interval": 1, "checkpoint.interval_steps": 2})
    _train(tmp_path, cfg, tmp_path / "straight")
    stopped = tmp_path / "stopped"
    _train(tmp_path, {**cfg, "max_steps": 3}, stopped)
    with open(stopped / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 4, "lo')
    result = _train(tmp_path, cfg, stopped, "--resume", "auto", "--set", "max_steps=null")
    assert "metrics.jsonl: line " in result.stderr and ", the last, was cut short" in result.stderr
    steps = [
        [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (tmp_path / "straight", stopped)
    ]
    assert steps[1] == steps[0] and len(steps[0]) > 3


@pytest.mark.slow
def test_resume_keeps_the_saved_config_and_refuses_a_set_that_changes_the_maths(tmp_path):
    cfg = tiny_config(**{"checkpoint.at_end": True})
    _train(tmp_path, {**cfg, "max_steps": 2}, tmp_path / "run")
    changed = write_config(tmp_path, tiny_config(**{"optimizer.lr": 5e-3, "checkpoint.at_end": True}), "changed.yaml")
    # another --config is reported and not used: the run goes on with what it started with
    kept = run_cli("train.py", "--config", str(changed), "--run-dir", str(tmp_path / "run"), "--resume", "auto", "--set", "max_steps=3")
    assert kept.returncode == 0, kept.stderr[-2000:]
    note = next(line for line in kept.stdout.splitlines() if "differs from the saved config in" in line)
    assert "optimizer.lr (0.001 -> 0.005)" in note and "the saved values are kept" in note
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["optimizer"]["lr"] == 0.001
    # a --set that changes the maths is refused unless asked for
    run = ["train.py", "--run-dir", str(tmp_path / "run"), "--resume", "auto", "--set", "max_steps=4", "--set", "optimizer.lr=5e-3"]
    result = run_cli(*run)
    assert result.returncode == 2
    assert "optimizer.lr (0.001 -> 0.005)" in result.stderr and "--resume-ignore-config" in result.stderr
    ok = run_cli(*run, "--resume-ignore-config")
    assert ok.returncode == 0, ok.stderr[-2000:]


@pytest.mark.slow
def test_checkpoint_older_than_a_new_config_key_resumes_while_the_key_keeps_its_default(tmp_path):
    """A key added to the schema after a checkpoint was written (absent from its saved
    config) is no config change while the run leaves it at its default."""
    cfg = tiny_config(**{"checkpoint.at_end": True})
    _train(tmp_path, {**cfg, "max_steps": 2}, tmp_path / "run")
    checkpoint = tmp_path / "run" / "checkpoints" / "step-00000002.pt"
    payload = torch.load(checkpoint, weights_only=True)
    del payload["config"]["task"], payload["config"]["model"]["init_from"]  # as written before the keys existed
    torch.save(payload, checkpoint)
    shutil.copytree(tmp_path / "run", tmp_path / "other")
    ok = run_cli(
        "train.py",
        "--config",
        str(write_config(tmp_path, cfg)),
        "--run-dir",
        str(tmp_path / "run"),
        "--resume",
        "auto",
        "--set",
        "max_steps=null",
    )
    assert ok.returncode == 0 and "resumed from" in ok.stdout, ok.stderr[-2000:]
    result = run_cli("train.py", "--run-dir", str(tmp_path / "other"), "--resume", "auto", "--set", f"model.init_from={tmp_path / 'run'}")
    assert result.returncode == 2 and "model.init_from (None -> " in result.stderr, result.stderr


@pytest.mark.slow
def test_custom_hook_by_path_runs_at_its_events(tmp_path):
    hook_file = tmp_path / "my_hook.py"
    hook_file.write_text(
        "from largebatch.engine.hook import Hook\n"
        "class Recorder(Hook):\n"
        "    def __init__(self, tag):\n"
        "        super().__init__()\n"
        "        self.tag, self.lines = tag, []\n"
        "    def after_backward(self, state):\n"
        "        self.lines.append(f'micro {state.micro_step}')\n"
        "    def after_step(self, state):\n"
        "        self.lines.append(f'step {state.step}')\n"
        "    def after_run(self, state):\n"
        "        (state.run.run_dir / f'{self.tag}.txt').write_text(chr(10).join(self.lines))\n"
    )
    cfg = tiny_config(hooks=[{"type": f"{hook_file}:Recorder", "tag": "seen"}])
    _train(tmp_path, cfg, tmp_path / "run")
    lines = (tmp_path / "run/seen.txt").read_text().splitlines()
    # 128 samples / 32 per step = 4 steps of 4 micro-batches each.
    expected = []
    for step in range(4):
        expected += [f"micro {step * 4 + m + 1}" for m in range(4)] + [f"step {step + 1}"]
    assert lines == expected


@pytest.mark.dist
@pytest.mark.slow
def test_torchrun_on_two_nodes_of_two_matches_one_node_of_four(tmp_path, four_rank_reference):
    """Two torchrun agents as two nodes (``--nnodes=2 --node-rank=0/1``, the first node's
    address as ``--master-addr``; both on this machine, sharing the run directory): the
    workers get the ranks and local ranks of two nodes, and end with the weights of
    ``torchrun --nproc_per_node=4``."""
    import subprocess

    config = str(write_config(tmp_path, four_rank_config()))
    run_dir = tmp_path / "run"
    port = free_port()
    agents = []
    for node in (0, 1):
        cmd = [TORCHRUN, "--nnodes=2", "--nproc-per-node=2", f"--node-rank={node}", "--master-addr=127.0.0.1", f"--master-port={port}"]
        cmd += [str(REPO / "train.py"), "--config", config, "--run-dir", str(run_dir), "--set", hooks_override(PLACEMENT, RANK_WEIGHTS)]
        agents.append(subprocess.Popen(cmd, cwd=REPO, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [agent.communicate(timeout=400) for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], [out[0][-2000:] + out[1][-3000:] for out in outputs]
    records = placements(run_dir, 4)
    assert [(r["rank"], r["group_rank"], r["local_rank"], r["world_size"]) for r in records] == [
        (0, "0", 0, 4),
        (1, "0", 1, 4),
        (2, "1", 0, 4),
        (3, "1", 1, 4),
    ]
    for rank in (1, 2, 3):
        assert_same_weights(run_dir / "rank0.safetensors", run_dir / f"rank{rank}.safetensors")
    assert_same_weights(four_rank_reference / "model.safetensors", run_dir / "model.safetensors")
