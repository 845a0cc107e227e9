"""Launching under a REAL Slurm cluster, started here: one node, and two nodes (two slurmd
daemons on this machine). ``srun`` ranks agree with torchrun at the same world size (on
two nodes under ``ddp`` and ``hsdp``, sharded within a node), rank discovery sees the
nodes, and an ``sbatch`` job preempted with ``scancel --signal=USR1`` checkpoints,
requeues itself, resumes and ends with the weights of an uninterrupted run."""

import json
import os
import pathlib
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import (
    PLACEMENT,
    PYTHON,
    RANK_WEIGHTS,
    REPO,
    SIGNAL_HOOKS,
    TORCHRUN,
    assert_same_weights,
    clean_env,
    four_rank_config,
    hooks_override,
    placements,
    resume_config,
    torchrun_reference,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TWO_NODE_RUN = four_rank_config()


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
    # the resumed run keeps its saved config: max_steps=null lifts the stop
    for extra in (["--set", "max_steps=3"], ["--resume", "auto", "--set", "max_steps=null"]):
        result = subprocess.run(srun + extra, cwd=REPO, capture_output=True, text=True, timeout=300, env=slurm.env(clean_env()))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "world size 2" in result.stdout and "at step 3" in result.stdout
    assert (run_dir / "checkpoints" / "step-00000003" / "meta.pt").is_file()
    assert_same_weights(reference / "model.safetensors", run_dir / "model.safetensors")


def preempted_sbatch_job(
    slurm, tmp_path, cfg: dict, *sbatch_options: str, hooks: tuple = (), steps: int = 8
) -> tuple[pathlib.Path, str, int]:
    """Submit ``slurm/cpu-test.sbatch`` with ``cfg``, preempt it with ``scancel --signal=USR1``
    after two steps, release it once requeued, and wait for it to end; checked to have
    checkpointed, requeued itself, resumed where it stopped and completed (a run of
    ``steps`` steps). Returns the run directory, the job's log and the step it was preempted at."""
    config = str(write_config(tmp_path, cfg))
    run_dir = tmp_path / "run"
    log = tmp_path / "job.log"
    slow = {"type": f"{SIGNAL_HOOKS}:SlowSteps", "seconds": 1.0}  # time to signal it mid-run
    env = slurm.env(clean_env(PYTHON=PYTHON, RUN_DIR=str(run_dir)))
    submit = ["sbatch", "--parsable", f"--output={log}", *sbatch_options, str(REPO / "slurm/cpu-test.sbatch"), config]
    submit += ["--set", hooks_override(*hooks, slow)]
    submitted = subprocess.run(submit, cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]

    metrics = run_dir / "metrics.jsonl"
    wait_until(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2, 180, f"job {job} to train two steps")
    signalled = slurm.run("scancel", "--signal=USR1", job)
    assert signalled.returncode == 0, signalled.stderr
    # Rank 0 checkpoints and runs `scontrol requeue`; Slurm holds a requeued job ~120 s
    # before it may start again, so release it as an operator would, once the first
    # incarnation's steps are gone from the nodes and a whole second has passed: slurmd
    # refuses a launch whose credential bears the second in which it revoked the job's
    # credential ("Job credential revoked", "already killed, do not launch batch job"),
    # and the job then fails without running.
    wait_until(lambda: slurm.job_field(job, "Restarts") == "1", 120, f"job {job} to be requeued")
    wait_until(lambda: slurm.job_field(job, "JobState") in ("PENDING", "RUNNING", "COMPLETED"), 60, "the requeued job to settle")
    if slurm.job_field(job, "JobState") == "PENDING":
        wait_until(slurm.nodes_idle, 60, f"the nodes to be idle after job {job} was requeued")
        time.sleep(2)
        slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")
    wait_until(lambda: slurm.job_field(job, "JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 240, f"job {job} to end")
    text = log.read_text()
    assert slurm.job_field(job, "JobState") == "COMPLETED", text[-3000:] + "\n" + slurm.diagnosis(job)
    assert "restart 0" in text and "restart 1" in text
    assert "preempted by SIGUSR1" in text and f"requeued Slurm job {job}" in text
    checkpointed = [line for line in text.splitlines() if "checkpoint written" in line]
    step = int(checkpointed[0].split(" at step ")[1].split(";")[0])
    assert 2 <= step < steps and "resumed from" in text and f"at step {step}/{steps}, epoch" in text  # resumed where it stopped
    assert os.path.exists(run_dir / "config.yaml")
    return run_dir, text, step


def test_sbatch_job_preempted_with_usr1_requeues_and_resumes_exactly(slurm, tmp_path, two_rank_reference):
    run_dir, _, _ = preempted_sbatch_job(slurm, tmp_path, resume_config(), hooks=(RANK_WEIGHTS,))
    assert_same_weights(run_dir / "rank0.safetensors", run_dir / "rank1.safetensors")
    assert_same_weights(two_rank_reference / "model.safetensors", run_dir / "model.safetensors")


# --------------------------------------------------------------------------- two nodes


def assert_two_nodes_of_two(records: list[dict]) -> None:
    """Ranks 0-1 on the first node, 2-3 on the second (srun's block distribution); the
    rendezvous address is the first node of the job's node list, and it resolves."""
    assert [r["rank"] for r in records] == [0, 1, 2, 3] and {r["world_size"] for r in records} == {4}
    assert [(r["node_id"], r["node_name"], r["local_rank"]) for r in records] == [
        ("0", "lbn1", 0),
        ("0", "lbn1", 1),
        ("1", "lbn2", 0),
        ("1", "lbn2", 1),
    ]
    assert {r["package"] for r in records} == {str(REPO / "largebatch" / "__init__.py")}  # this checkout, through PYTHONPATH
    assert {(r["launcher"], r["nodelist"], r["master_addr"], r["master_ip"]) for r in records} == {
        ("slurm", "lbn[1-2]", "lbn1", "127.0.0.1")
    }


def srun_two_nodes(slurm, tmp_path, cfg: dict, *hooks: str) -> pathlib.Path:
    config = str(write_config(tmp_path, cfg))
    run_dir = tmp_path / "run"
    cmd = ["srun", "-N2", "--ntasks-per-node=2", "--kill-on-bad-exit=1", PYTHON, str(REPO / "train.py"), "--config", config]
    cmd += ["--run-dir", str(run_dir), "--set", hooks_override(PLACEMENT, *hooks)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=slurm.env(clean_env()))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "world size 4" in result.stdout
    assert_two_nodes_of_two(placements(run_dir, 4))
    return run_dir


HSDP = {"strategy": "hsdp", "shard_size": 2}  # sharded within a node, replicated across the two


@pytest.fixture(scope="session")
def hsdp_on_two_nodes(slurm_two_nodes, tmp_path_factory) -> pathlib.Path:
    """An uninterrupted ``srun -N2 --ntasks-per-node=2`` run of ``TWO_NODE_RUN`` under hsdp."""
    return srun_two_nodes(slurm_two_nodes, tmp_path_factory.mktemp("hsdp-two-nodes"), {**TWO_NODE_RUN, "dist": HSDP})


# 2 ranks x micro-batch 8, 256 samples: from 16 to 32 at sample 64 (4 steps at 16, 6 at 32),
# by a ramp, or by the branch criterion (forks of 32 samples at 16 and 32 after step 4,
# a tolerance that grows the batch)
GROWING = {
    "ramp": {"type": "ramp", "start_batch_size": 16, "ramp_samples": 64},
    "branch": {
        "type": "adaptive",
        "criterion": "branch",
        "start_batch_size": 16,
        "check_every_samples": 64,
        "branch_samples": 32,
        "branch_tolerance": 0.9,
    },
}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("schedule", list(GROWING))
def test_sbatch_job_with_a_growing_batch_preempted_resumes_in_its_stage_exactly(slurm, tmp_path, schedule, strategy):
    """Preempted in the first stage, the requeued job goes on at the samples it had seen, in
    the same stage (a ramp never restarts), grows where the uninterrupted run grew, and ends
    with its bytes."""
    cfg = resume_config(batch_schedule=GROWING[schedule], dist={"strategy": strategy})
    (tmp_path / "reference").mkdir()
    reference = torchrun_reference(tmp_path / "reference", cfg, 2)
    batches = [r["batch/global"] for r in map(json.loads, (reference / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert batches == [16] * 4 + [32] * 6, batches
    # the log counts an adaptive run's steps as if it never grew: 16 at most
    run_dir, _, step = preempted_sbatch_job(slurm, tmp_path, cfg, steps=10 if schedule == "ramp" else 16)
    resumed = [r["batch/global"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert resumed[-(10 - step) :] == batches[step:]
    assert_same_weights(reference / "model.safetensors", run_dir / "model.safetensors")


def test_srun_on_two_nodes_matches_torchrun_at_world_size_four(slurm_two_nodes, tmp_path, four_rank_reference):
    run_dir = srun_two_nodes(slurm_two_nodes, tmp_path, TWO_NODE_RUN, RANK_WEIGHTS)
    for rank in (1, 2, 3):
        assert_same_weights(run_dir / "rank0.safetensors", run_dir / f"rank{rank}.safetensors")
    assert_same_weights(four_rank_reference / "model.safetensors", run_dir / "model.safetensors")


def test_hsdp_on_two_nodes_shards_within_a_node_and_matches_torchrun_ddp(hsdp_on_two_nodes, four_rank_reference):
    assert [r["shard_group"] for r in placements(hsdp_on_two_nodes, 4)] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    hsdp, ddp = load_file(hsdp_on_two_nodes / "model.safetensors"), load_file(four_rank_reference / "model.safetensors")
    assert hsdp.keys() == ddp.keys()
    for key in ddp:  # the same up to the order of floating-point reductions
        torch.testing.assert_close(hsdp[key], ddp[key], rtol=1e-6, atol=1e-6, msg=key)


def test_sbatch_on_two_nodes_preempted_with_usr1_resumes_exactly(slurm_two_nodes, tmp_path, hsdp_on_two_nodes):
    """``sbatch --nodes=2`` (two ranks a node) under hsdp with ``checkpoint.async_save``:
    each rank's slices are written in the background across both nodes, the job requeues
    itself once the checkpoint is complete, and the resumed run ends with the
    uninterrupted run's weights, bit for bit. (Under ddp, four ranks resume within
    rounding only: DDP's first step in a process reduces its gradients in other buckets
    than later steps, and gloo's sum of four ranks rounds by a value's place in its bucket.)"""
    cfg = {**TWO_NODE_RUN, "dist": HSDP, "checkpoint": {**TWO_NODE_RUN["checkpoint"], "async_save": True}}
    run_dir, text, step = preempted_sbatch_job(slurm_two_nodes, tmp_path, cfg, "--nodes=2", hooks=(PLACEMENT,))
    assert "nodes lbn[1-2]" in text
    assert_two_nodes_of_two(placements(run_dir, 4))
    assert len(list((run_dir / "checkpoints" / f"step-{step:08d}").glob("*.distcp"))) == 4  # every rank's slices
    assert_same_weights(hsdp_on_two_nodes / "model.safetensors", run_dir / "model.safetensors")
