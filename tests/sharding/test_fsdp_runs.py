"""Whole runs under ``dist.strategy='fsdp'`` (FSDP2) against DDP: torchrun, 2 ranks, gloo, CPU."""

from __future__ import annotations

import json
import math
import os
import pathlib
import signal
import subprocess
import sys

import pytest
import timm
import torch
from safetensors.torch import load_file

from tests.conftest import REPO, assert_held_or_not_by_the_paused_save, clean_env, tiny_config, wait_for_pause, write_config

HOOKS = [{"type": "grad_norm"}, {"type": "trust_ratio"}, {"type": "noise_scale", "beta": 0.5}]  # the non-finite check runs every step


def torchrun(tmp_path, cfg: dict, run_dir, *extra: str, ranks: int = 2) -> subprocess.CompletedProcess:
    path = write_config(tmp_path, cfg, name=f"{run_dir.name}.yaml")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", str(REPO / "train.py")]
    cmd += ["--config", str(path), "--run-dir", str(run_dir), *extra]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=clean_env())


def lamb_config(**overrides) -> dict:
    """Two epochs of 4 steps, LAMB with accumulation 2 at world size 2, clipping at 1.0."""
    return tiny_config(**{"epochs": 2, "optimizer": {"type": "lamb", "lr": 0.01, "weight_decay": 0.05}, "clip_grad_norm": 1.0, **overrides})


def records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.dist
@pytest.mark.slow
def test_fsdp_run_equals_ddp_run_with_lamb_accumulation_and_clipping(tmp_path):
    # clipping at 0.5 acts: the global norm across shards decides
    cfg = lamb_config(**{"clip_grad_norm": 0.5, "model.depth": 2, "hooks": HOOKS})
    runs = {}
    for strategy in ("ddp", "fsdp"):
        run_dir = tmp_path / strategy
        result = torchrun(tmp_path, {**cfg, "dist": {"strategy": strategy}}, run_dir)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        runs[strategy] = run_dir
    ddp, fsdp = (load_file(runs[s] / "model.safetensors") for s in ("ddp", "fsdp"))
    assert ddp.keys() == fsdp.keys()
    for key in ddp:
        torch.testing.assert_close(fsdp[key], ddp[key], rtol=1e-6, atol=1e-6, msg=key)
    train = {s: [r for r in records(runs[s]) if "loss" in r] for s in runs}
    assert len(train["ddp"]) == len(train["fsdp"]) == 8
    for a, b in zip(train["ddp"], train["fsdp"]):
        assert a["step"] == b["step"]
        for key in ("loss", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-5), (a["step"], key)
        # the noise scale's small batch differs (DDP: each rank's micro-batch; FSDP: the
        # ranks' mean micro-batch gradient), so the single-step estimates differ too
        assert all(math.isfinite(b[k]) for k in ("noise_scale/grad_sq", "noise_scale/trace_sigma"))
        # the trust-ratio hook reads the sharded optimizer's global norms
        ratios = [k for k in a if k.startswith("trust_ratio/") and isinstance(a[k], float)]
        assert ratios and all(b[k] == pytest.approx(a[k], rel=1e-5) for k in ratios), ratios
    assert any(r["grad_norm"] > 0.5 for r in train["ddp"]), "clipping must have acted"
    config = (runs["fsdp"] / "config.yaml").read_text()
    assert "strategy: fsdp" in config and "shard_size: 2" in config
    # the gathered weights are a plain state dict that timm's model loads
    model_cfg = {k: v for k, v in cfg["model"].items() if k != "name"}
    model = timm.create_model(cfg["model"]["name"], num_classes=4, img_size=16, in_chans=3, **model_cfg)
    model.load_state_dict(fsdp)


def single(tmp_path, cfg: dict, run_dir, *extra: str) -> subprocess.CompletedProcess:
    path = write_config(tmp_path, cfg, name=f"{run_dir.name}-single.yaml")
    cmd = [sys.executable, str(REPO / "train.py"), "--config", str(path), "--run-dir", str(run_dir), *extra]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=clean_env())


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.mark.dist
@pytest.mark.slow
def test_sharded_checkpoints_resume_exactly_and_at_another_world_size(tmp_path):
    # no dropout or mixup: their per-rank streams change with the world size, and so would
    # the 2 -> 1 and 1 -> 2 runs (exact resume with them: test_resume_matrix, test_slurm)
    cfg = lamb_config(**{"dist": {"strategy": "fsdp"}, "checkpoint": {"interval_epochs": 0, "at_end": True, "keep": 2}})
    straight = tmp_path / "straight"
    ok(torchrun(tmp_path, cfg, straight))
    reference = load_file(straight / "model.safetensors")

    # same world size: stopped mid-epoch, resumed, byte-identical weights
    stopped = tmp_path / "stopped"
    ok(torchrun(tmp_path, {**cfg, "max_steps": 3}, stopped))
    folder = stopped / "checkpoints" / "step-00000003"
    assert (folder / "meta.pt").is_file() and (folder / ".metadata").is_file()
    assert len(list(folder.glob("*.distcp"))) == 2  # one file of slices per rank
    assert not list((stopped / "checkpoints").glob(".*.tmp"))
    result = ok(torchrun(tmp_path, cfg, stopped, "--resume", "auto", "--set", "max_steps=null"))
    assert "resumed from" in result.stdout and "at step 3" in result.stdout
    resumed = load_file(stopped / "model.safetensors")
    for key in reference:
        assert torch.equal(resumed[key], reference[key]), key

    # 2 -> 1: the same checkpoint resumed by one process (accumulation 4 instead of 2)
    shrunk = tmp_path / "shrunk"
    ok(torchrun(tmp_path, {**cfg, "max_steps": 3}, shrunk))
    result = ok(single(tmp_path, cfg, shrunk, "--resume", "auto", "--set", "max_steps=null"))
    assert "at step 3" in result.stdout
    one = load_file(shrunk / "model.safetensors")
    # 1 -> 2: a one-process run's checkpoint resumed by two ranks
    grown = tmp_path / "grown"
    ok(single(tmp_path, {**cfg, "max_steps": 3}, grown))
    assert (grown / "checkpoints" / "step-00000003" / "meta.pt").is_file()
    ok(torchrun(tmp_path, cfg, grown, "--resume", "auto", "--set", "max_steps=null"))
    two = load_file(grown / "model.safetensors")
    for key in reference:  # exact up to the order of floating-point reductions
        torch.testing.assert_close(one[key], reference[key], rtol=1e-5, atol=1e-6, msg=key)
        torch.testing.assert_close(two[key], reference[key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_run_stopped_on_either_side_of_a_batch_change_resumes_exactly(tmp_path, strategy):
    # 2 ranks x micro-batch 8: a ramp 16 -> 32 at sample 64, 4 steps at 16 then 6 at 32
    ramp = {"type": "ramp", "start_batch_size": 16, "ramp_samples": 64}
    cfg = lamb_config(**{"dist": {"strategy": strategy}, "batch_schedule": ramp, "checkpoint": {"interval_epochs": 0, "at_end": True}})
    straight = tmp_path / "straight"
    result = ok(torchrun(tmp_path, cfg, straight))
    assert "10/10" in result.stdout or "step 10" in result.stdout
    assert [r["batch/global"] for r in records(straight) if "loss" in r] == [16] * 4 + [32] * 6
    reference = (straight / "model.safetensors").read_bytes()
    for stop in (4, 5):  # the last step at 16, the first at 32
        run_dir = tmp_path / f"stopped-{stop}"
        ok(torchrun(tmp_path, {**cfg, "max_steps": stop}, run_dir))
        (run_dir / "model.safetensors").unlink()
        result = ok(torchrun(tmp_path, cfg, run_dir, "--resume", "auto", "--set", "max_steps=null"))
        assert f"at step {stop}" in result.stdout
        assert (run_dir / "model.safetensors").read_bytes() == reference, stop


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun's workers may leave its process group)."""
    children: dict[int, list[int]] = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


LARS_FSDP = tiny_config(
    **{"epochs": 2, "dist": {"strategy": "fsdp"}, "optimizer": {"type": "lars", "lr": 0.5}, "checkpoint.interval_steps": 2}
)


@pytest.fixture(scope="module")
def lars_fsdp_straight(tmp_path_factory) -> pathlib.Path:
    """An uninterrupted run of ``LARS_FSDP``."""
    root = tmp_path_factory.mktemp("lars-fsdp")
    ok(torchrun(root, LARS_FSDP, root / "straight"))
    return root / "straight"


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_kill_during_a_sharded_checkpoint_leaves_the_previous_one_and_resume_uses_it(tmp_path, lars_fsdp_straight, async_save):
    from largebatch import checkpoint as ckpt

    cfg = {**LARS_FSDP, "checkpoint": {**LARS_FSDP["checkpoint"], "async_save": async_save}}
    straight = lars_fsdp_straight
    run_dir = tmp_path / "run"
    path = write_config(tmp_path, cfg, name="paused.yaml")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [str(REPO / "tests/support/pausing_save.py"), "--config", str(path), "--run-dir", str(run_dir)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=clean_env(PAUSE_AT_STEP="4"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_pause(proc, run_dir / "checkpoints/save-paused")
    assert_held_or_not_by_the_paused_save(proc, run_dir, async_save)
    for pid in [*descendants(proc.pid), proc.pid]:  # both ranks and torchrun, mid-save
        os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    partial = run_dir / "checkpoints/.step-00000004.tmp"
    assert len(list(partial.glob("*.distcp"))) == 2 and not (partial / "meta.pt").exists()  # slices written, never named
    assert [p.name for p in ckpt.list_checkpoints(run_dir)] == ["step-00000002"]
    assert (run_dir / "checkpoints/latest").read_text() == "step-00000002"

    result = ok(torchrun(tmp_path, cfg, run_dir, "--resume", "auto"))
    assert "at step 2" in result.stdout
    assert not partial.exists()  # the next save removed it
    a, b = load_file(straight / "model.safetensors"), load_file(run_dir / "model.safetensors")
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.dist
@pytest.mark.slow
def test_hsdp_run_on_four_ranks_equals_ddp(tmp_path):
    """2 replicas x 2 shards: the norms are reduced within each shard group, the
    gradients across all four ranks; the hooks read the same global norms as DDP's."""
    cfg = lamb_config(**{"global_batch_size": 64, "clip_grad_norm": 0.5, "hooks": HOOKS})
    runs = {}
    for name, dist in (("ddp", {"strategy": "ddp"}), ("hsdp", {"strategy": "hsdp", "shard_size": 2})):
        runs[name] = tmp_path / name
        ok(torchrun(tmp_path, {**cfg, "dist": dist}, runs[name], ranks=4))
    ddp, hsdp = (load_file(runs[s] / "model.safetensors") for s in ("ddp", "hsdp"))
    for key in ddp:
        torch.testing.assert_close(hsdp[key], ddp[key], rtol=1e-6, atol=1e-6, msg=key)
    a, b = ([r for r in records(runs[s]) if "loss" in r] for s in ("ddp", "hsdp"))
    assert len(a) == len(b) == 4
    for x, y in zip(a, b):
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-5)
        ratios = [k for k in x if k.startswith("trust_ratio/") and isinstance(x[k], float)]
        assert ratios and all(y[k] == pytest.approx(x[k], rel=1e-5) for k in ratios)
        assert all(math.isfinite(y[k]) for k in ("noise_scale/grad_sq", "noise_scale/trace_sigma"))
    assert "replicas: 2" in (runs["hsdp"] / "config.yaml").read_text()
