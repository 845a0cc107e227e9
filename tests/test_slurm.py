"""Launching under a REAL Slurm cluster (one node, started here): ``srun -n2`` ranks agree
with torchrun, and an ``sbatch`` job preempted with ``scancel --signal=USR1`` checkpoints,
requeues itself, resumes and ends with the weights of an uninterrupted run."""

import os
import subprocess

import pytest

from tests.conftest import (
    PYTHON,
    RANK_WEIGHTS,
    REPO,
    SIGNAL_HOOKS,
    TORCHRUN,
    assert_same_weights,
    clean_env,
    hooks_override,
    resume_config,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_srun_two_tasks_match_torchrun(slurm, tmp_path, two_rank_reference):
    config = str(write_config(tmp_path, resume_config()))
    run_dir = tmp_path / "run"
    cmd = ["srun", "-n2", "-N1", "--kill-on-bad-exit=1", PYTHON, str(REPO / "train.py"), "--config", config, "--run-dir", str(run_dir)]
    cmd += ["--set", hooks_override(RANK_WEIGHTS)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=slurm.env(clean_env()))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "world size 2" in result.stdout
    assert_same_weights(run_dir / "rank0.safetensors", run_dir / "rank1.safetensors")
    assert_same_weights(two_rank_reference / "model.safetensors", run_dir / "model.safetensors")


def test_srun_fsdp_run_stopped_and_resumed_matches_torchrun(slurm, tmp_path):
    """dist.strategy fsdp under srun: sharded (DCP) checkpoint at step 3, resumed by a
    second srun, ends with the weights of an uninterrupted torchrun fsdp run."""
    cfg = resume_config(**{"dist.strategy": "fsdp", "checkpoint.at_end": True})
    config = str(write_config(tmp_path, cfg))
    reference = tmp_path / "reference"
    cmd = [TORCHRUN, "--standalone", "--nproc_per_node=2", str(REPO / "train.py"), "--config", config, "--run-dir", str(reference)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=clean_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = tmp_path / "run"
    srun = ["srun", "-n2", "-N1", "--kill-on-bad-exit=1", PYTHON, str(REPO / "train.py"), "--config", config, "--run-dir", str(run_dir)]
    for extra in (["--set", "max_steps=3"], ["--resume", "auto", "--set", "max_steps=null"]):
        result = subprocess.run(srun + extra, cwd=REPO, capture_output=True, text=True, timeout=300, env=slurm.env(clean_env()))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "world size 2" in result.stdout and "at step 3" in result.stdout
    assert (run_dir / "checkpoints" / "step-00000003" / "meta.pt").is_file()
    assert_same_weights(reference / "model.safetensors", run_dir / "model.safetensors")


def test_sbatch_job_preempted_with_usr1_requeues_and_resumes_exactly(slurm, tmp_path, two_rank_reference):
    config = str(write_config(tmp_path, resume_config()))
    run_dir = tmp_path / "run"
    log = tmp_path / "job.log"
    slow = {"type": f"{SIGNAL_HOOKS}:SlowSteps", "seconds": 1.0}  # time to signal it mid-run
    env = slurm.env(clean_env(PYTHON=PYTHON, RUN_DIR=str(run_dir)))
    submit = ["sbatch", "--parsable", f"--output={log}", str(REPO / "slurm/cpu-test.sbatch"), config]
    submit += ["--set", hooks_override(RANK_WEIGHTS, slow)]
    submitted = subprocess.run(submit, cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]

    metrics = run_dir / "metrics.jsonl"
    wait_until(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2, 180, f"job {job} to train two steps")
    signalled = slurm.run("scancel", "--signal=USR1", job)
    assert signalled.returncode == 0, signalled.stderr
    # Rank 0 checkpoints and runs `scontrol requeue`; Slurm holds a requeued job ~120 s
    # before it may start again, so release it as an operator would.
    wait_until(lambda: slurm.job_field(job, "Restarts") == "1", 120, f"job {job} to be requeued")
    wait_until(lambda: slurm.job_field(job, "JobState") in ("PENDING", "RUNNING", "COMPLETED"), 60, "the requeued job to settle")
    if slurm.job_field(job, "JobState") == "PENDING":
        slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")
    wait_until(lambda: slurm.job_field(job, "JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 240, f"job {job} to end")
    text = log.read_text()
    assert slurm.job_field(job, "JobState") == "COMPLETED", text[-4000:]
    assert "restart 0" in text and "restart 1" in text
    assert "preempted by SIGUSR1" in text and f"requeued Slurm job {job}" in text
    checkpointed = [line for line in text.splitlines() if "checkpoint written" in line]
    step = int(checkpointed[0].split(" at step ")[1].split(";")[0])
    assert 2 <= step < 8 and "resumed from" in text and f"at step {step}/8, epoch" in text  # resumed where it stopped
    assert_same_weights(run_dir / "rank0.safetensors", run_dir / "rank1.safetensors")
    assert_same_weights(two_rank_reference / "model.safetensors", run_dir / "model.safetensors")
    assert os.path.exists(run_dir / "config.yaml")
