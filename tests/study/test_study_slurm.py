"""Study workers as a Slurm job array (``slurm/study-array.sbatch``) on a REAL one-node
cluster started here: two array tasks share one journal-file storage and finish a small
study together with no trial run twice; a worker killed with ``kill -9`` mid-trial leaves
the study consistent, and a re-run finishes it."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.conftest import PYTHON, REPO, clean_env, wait_until
from tests.study.helpers import process_gone, tiny_base, write_study

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SMALL = {"optimizers": {"lamb": {}}, "trials": 3, "seeds": [1, 2]}  # 2 batches x (3 + 2) = 10 trials


def journal(folder):
    return f"journal:{folder / 'study.journal'}"


def submit(slurm, folder, tasks):
    """``sbatch --array=0-(tasks-1)`` of the study in ``folder``; the array's job id."""
    cmd = ["sbatch", "--parsable", f"--array=0-{tasks - 1}", "--cpus-per-task=1", f"--output={folder}/task-%A_%a.log"]
    cmd += [str(REPO / "slurm/study-array.sbatch"), str(folder / "study.yaml"), "--storage", journal(folder)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60, env=slurm.env(clean_env(PYTHON=PYTHON)))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def finished(slurm, job):
    return slurm.run("squeue", "-h", "-j", job).stdout.strip() == ""


def logs(folder):
    return "\n".join(p.read_text() for p in sorted(folder.glob("task-*.log")))


def trials(folder):
    import optuna

    from largebatch.study.storage import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=folder.name, storage=open_storage(journal(folder))).get_trials()


def assert_consistent(folder):
    """Every key of the study complete exactly once, re-runs of each cell's choice; every
    run directory is a recorded trial's, so no trial trained twice."""
    done = [t for t in trials(folder) if t.state.name == "COMPLETE"]
    keys = [t.user_attrs["key"] for t in done]
    assert len(keys) == len(set(keys)) == 10, sorted(keys)
    tuned = {k for k in keys if k.endswith("/s0")}
    assert tuned == {f"lamb/b{b}/q{q}/s0" for b in (16, 32) for q in range(3)}
    for batch in (16, 32):
        reruns = {k.rsplit("/", 1)[0] for k in keys if k.startswith(f"lamb/b{batch}/") and not k.endswith("/s0")}
        assert len(reruns) == 1 and {f"{next(iter(reruns))}/s{s}" for s in (1, 2)} <= set(keys)
    recorded = {t.user_attrs["run_dir"] for t in trials(folder) if "run_dir" in t.user_attrs}
    assert {f"trials/{p.name}" for p in (folder / "trials").iterdir()} == recorded
    assert (folder / "report.json").is_file()
    return done


def test_two_array_tasks_finish_one_study_together_and_no_trial_runs_twice(slurm, tmp_path):
    folder = tmp_path / "together"
    write_study(folder, **SMALL)
    job = submit(slurm, folder, 2)
    wait_until(lambda: finished(slurm, job), 900, f"array job {job} to end")
    done = assert_consistent(folder)
    assert not [t for t in trials(folder) if t.state.name in ("FAIL", "RUNNING", "WAITING")], logs(folder)[-3000:]
    assert len({t.user_attrs["worker"]["pid"] for t in done}) == 2  # both tasks trained trials
    assert logs(folder).count("array task") == 2


def test_a_worker_killed_mid_trial_leaves_the_study_consistent_and_a_rerun_finishes_it(slurm, tmp_path):
    folder, marker = tmp_path / "killed", tmp_path / "hold"
    base = tiny_base()
    base["hooks"] = [{"type": f"{REPO}/tests/support/study_trials.py:HoldWhileMarked", "marker": str(marker), "batch": 32}]
    write_study(folder, base=base, **SMALL)
    marker.touch()  # every trial at batch 32 holds after its second step while the marker exists
    job = submit(slurm, folder, 2)
    held = wait_until(lambda: next(iter(folder.glob("trials/*/held")), None), 600, "a trial at batch 32 to train")
    training = int(held.read_text())
    running = [t for t in trials(folder) if t.user_attrs.get("run_dir") == f"trials/{held.parent.name}"]
    assert len(running) == 1 and running[0].state.name == "RUNNING"
    worker = int(running[0].user_attrs["worker"]["pid"])
    os.kill(worker, signal.SIGKILL)
    wait_until(lambda: process_gone(training), 60, f"the trial's process {training} to end with its worker {worker}")
    marker.unlink()
    wait_until(lambda: finished(slurm, job), 900, f"array job {job} to end")

    again = submit(slurm, folder, 1)  # a re-run: whatever the surviving task left, this one finishes
    wait_until(lambda: finished(slurm, again), 600, f"job {again} to end")
    assert_consistent(folder)
    failed = [t for t in trials(folder) if t.state.name == "FAIL"]
    assert [t.user_attrs["run_dir"] for t in failed] == [f"trials/{held.parent.name}"]
    assert failed[0].user_attrs["failure"] == "killed" and f"pid {worker}" in failed[0].user_attrs["error"]
    assert not [t for t in trials(folder) if t.state.name in ("RUNNING", "WAITING")]
