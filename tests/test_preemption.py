"""Preemption and crashes: signals stop at a step boundary and resume exactly; every rank
stops at the same step; a lost rank under torchrun restarts from the last checkpoint;
a crash in the middle of a checkpoint write, and unreadable checkpoints, fall back to the
newest complete one; non-finite weights are never saved."""

import json
import os
import signal
import subprocess

import pytest

from largebatch import checkpoint as ckpt
from largebatch.preemption import EXIT_REQUEUE
from tests.conftest import (
    PYTHON,
    RANK_WEIGHTS,
    REPO,
    SIGNAL_HOOKS,
    TORCHRUN,
    assert_held_or_not_by_the_paused_save,
    assert_same_weights,
    clean_env,
    free_port,
    hooks_override,
    resume_config,
    run_cli,
    wait_for_pause,
    write_config,
)


@pytest.fixture(scope="module")
def one_rank_reference(tmp_path_factory):
    """An uninterrupted single-process run of ``resume_config()``."""
    root = tmp_path_factory.mktemp("one-rank-reference")
    result = run_cli("train.py", "--config", str(write_config(root, resume_config())), "--run-dir", str(root / "run"))
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "run"


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGUSR1", "SIGUSR2", "SIGTERM"])
def test_signal_mid_accumulation_window_stops_at_the_step_boundary_and_resumes_exactly(tmp_path, one_rank_reference, sig):
    config = str(write_config(tmp_path, resume_config()))
    run_dir = tmp_path / "run"
    # The signal arrives during micro-step 1 (of 4) of step index 2: that step completes.
    signal_hook = {"type": f"{SIGNAL_HOOKS}:SendSignal", "step": 2, "micro": 1, "signal": sig}
    stopped = run_cli("train.py", "--config", config, "--run-dir", str(run_dir), "--set", hooks_override(signal_hook))
    assert stopped.returncode == EXIT_REQUEUE, stopped.stdout[-2000:] + stopped.stderr[-3000:]
    assert (run_dir / "signal-sent-rank0").read_text() == "2 1"
    record = json.loads((run_dir / "stop-rank0.json").read_text())
    assert record == {
        "step": 3,
        "micro_step": 12,
        "reason": f"preempted by {sig}",
        "interrupted": True,
        "newest_checkpoint": "step-00000003.pt",
    }
    assert [p.name for p in ckpt.list_checkpoints(run_dir)] == ["step-00000003.pt"]
    assert not (run_dir / "model.safetensors").exists()  # final weights only when done
    assert f"received {sig}" in stopped.stderr and "exiting with status 75" in stopped.stdout

    resumed = run_cli("train.py", "--config", config, "--run-dir", str(run_dir), "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at step 3" in resumed.stdout
    assert_same_weights(one_rank_reference / "model.safetensors", run_dir / "model.safetensors")


@pytest.mark.dist
@pytest.mark.slow
def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    """Two ranks started by hand (torchrun's variables); only rank 1 gets SIGTERM, during
    step index 1. The all-reduced flag is read a step later: both stop after step index 2."""
    config = str(write_config(tmp_path, resume_config()))
    run_dir = tmp_path / "run"
    signal_hook = {"type": f"{SIGNAL_HOOKS}:SendSignal", "step": 1, "micro": 0, "signal": "SIGTERM", "rank": 1}
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = clean_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        cmd = [PYTHON, str(REPO / "train.py"), "--config", config, "--run-dir", str(run_dir), "--set", hooks_override(signal_hook)]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [EXIT_REQUEUE, EXIT_REQUEUE], outputs
    assert not (run_dir / "signal-sent-rank0").exists() and (run_dir / "signal-sent-rank1").exists()
    records = [json.loads((run_dir / f"stop-rank{r}.json").read_text()) for r in range(2)]
    assert records[0]["step"] == records[1]["step"] == 3
    assert records[0]["reason"] == "preempted (another rank received a signal)"
    assert records[1]["reason"] == "preempted by SIGTERM"
    assert [p.name for p in ckpt.list_checkpoints(run_dir)] == ["step-00000003.pt"]


@pytest.mark.dist
@pytest.mark.slow
def test_a_preempted_fsdp_run_ends_once_its_background_checkpoint_is_complete(tmp_path, fsdp_two_rank_reference):
    """Two fsdp ranks started by hand (torchrun's variables) with ``checkpoint.async_save``;
    SIGUSR1 to both during step index 1, read a step later: the checkpoint of step 3 is written in the
    background and held for 3 s after the slices (before ``meta.pt`` and the rename): the
    run must end, and exit with 75, only once it is complete; the resumed run ends with
    the uninterrupted run's weights."""
    cfg = resume_config(**{"dist.strategy": "fsdp", "checkpoint.async_save": True, "checkpoint.interval_steps": 2})
    config = str(write_config(tmp_path, cfg))
    run_dir = tmp_path / "run"
    signal_hook = {"type": f"{SIGNAL_HOOKS}:SendSignal", "step": 1, "micro": 1, "signal": "SIGUSR1"}
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = clean_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        env.update(PAUSE_AT_STEP="3", PAUSE_SECONDS="3")
        cmd = [PYTHON, str(REPO / "tests/support/pausing_save.py"), "--config", config, "--run-dir", str(run_dir)]
        cmd += ["--set", hooks_override(signal_hook)]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [EXIT_REQUEUE, EXIT_REQUEUE], outputs
    assert (run_dir / "checkpoints/save-paused").exists()  # the write was held
    for rank in range(2):
        record = json.loads((run_dir / f"stop-rank{rank}.json").read_text())
        assert record["step"] == 3 and record["newest_checkpoint"] == "step-00000003", record
    assert [p.name for p in ckpt.list_checkpoints(run_dir)] == ["step-00000002", "step-00000003"]

    cmd = [TORCHRUN, "--standalone", "--nproc_per_node=2", str(REPO / "train.py"), "--config", config, "--run-dir", str(run_dir)]
    resumed = subprocess.run([*cmd, "--resume", "auto"], cwd=REPO, capture_output=True, text=True, timeout=300, env=clean_env())
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "at step 3" in resumed.stdout
    assert_same_weights(fsdp_two_rank_reference / "model.safetensors", run_dir / "model.safetensors")


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_killed_rank_under_torchrun_restarts_from_the_last_checkpoint(tmp_path, request, strategy):
    """``kill -9`` of rank 1 after step 3; checkpoints every 2 steps (a sharded folder
    under fsdp); no --run-dir: the restarted workers must find the same run directory and
    resume from step 2, and end with the weights of an uninterrupted run."""
    reference = request.getfixturevalue("two_rank_reference" if strategy == "ddp" else "fsdp_two_rank_reference")
    # A short collective timeout: a restarted worker that cannot connect fails in a minute, not 30.
    cfg = resume_config(**{"checkpoint.interval_steps": 2, "dist.timeout_minutes": 1.0, "dist.strategy": strategy})
    config = str(write_config(tmp_path, cfg))
    kill = {"type": f"{SIGNAL_HOOKS}:KillRank", "step": 3, "rank": 1}
    cmd = [TORCHRUN, "--standalone", "--nproc_per_node=2", "--max-restarts=1", str(REPO / "train.py"), "--config", config]
    # each rank's own weights exist only unsharded
    cmd += ["--resume", "auto", "--set", hooks_override(kill, *([RANK_WEIGHTS] if strategy == "ddp" else []))]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=400, env=clean_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dirs = list((tmp_path / "runs").iterdir())
    assert len(run_dirs) == 1, run_dirs  # the restart used the same run directory
    run_dir = run_dirs[0]
    assert (run_dir / "killed-rank1-step3").exists()
    saved = "step-00000002.pt" if strategy == "ddp" else "step-00000002"
    assert f"{run_dir.name}/checkpoints/{saved} at step 2/8" in result.stdout  # "resumed from runs/.../step-..."
    if strategy == "ddp":
        assert_same_weights(run_dir / "rank0.safetensors", run_dir / "rank1.safetensors")
    assert_same_weights(reference / "model.safetensors", run_dir / "model.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_kill_during_a_checkpoint_write_leaves_the_previous_one_and_resume_uses_it(tmp_path, one_rank_reference, async_save):
    config = str(write_config(tmp_path, resume_config(**{"checkpoint.interval_steps": 2, "checkpoint.async_save": async_save})))
    run_dir = tmp_path / "run"
    cmd = [PYTHON, str(REPO / "tests/support/pausing_save.py"), "--config", config, "--run-dir", str(run_dir)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=clean_env(PAUSE_AT_STEP="4"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_pause(proc, run_dir / "checkpoints/save-paused")
    assert_held_or_not_by_the_paused_save(proc, run_dir, async_save)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    partial = run_dir / "checkpoints/.step-00000004.pt.tmp"
    assert partial.stat().st_size > 0  # killed mid-write: half a checkpoint under a temporary name
    assert [p.name for p in ckpt.list_checkpoints(run_dir)] == ["step-00000002.pt"]
    assert (run_dir / "checkpoints/latest").read_text() == "step-00000002.pt"

    resumed = run_cli("train.py", "--config", config, "--run-dir", str(run_dir), "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at step 2" in resumed.stdout
    assert not partial.exists()  # the next save removed it
    assert_same_weights(one_rank_reference / "model.safetensors", run_dir / "model.safetensors")
