"""A tiny study for tests: a 1-block ViT on 16 px synthetic images (a trial trains in about
a second), two optimizers, two batch sizes, three tuning trials per cell, two seeds."""

from __future__ import annotations

import copy
import pathlib
import subprocess

import yaml

from tests.conftest import PYTHON, clean_env, tiny_config

# adamw's learning-rate range is too low on purpose: its best trial is the one at the top
# of the range (Sobol point 0 of sampler_seed 6 sits at 0.97 of it), an edge the report marks.
TINY_STUDY = {
    "base_config": "base.yaml",
    "optimizers": {"lamb": {}, "adamw": {"search": {"lr": {"low": 1e-4, "high": 1e-3}}}},
    "batches": [16, 32],
    "micro_batch_size": 8,
    "search": {"lr": {"low": 0.003, "high": 0.03, "scale": "sqrt"}, "epochs": {"low": 2, "high": 3}},
    "target": {"metric": "top1", "value": 0.7},
    "sampler_seed": 6,
    "trials": 3,
    "seeds": [1, 2],
    "evaluation": {"coarse": 1.4, "fine": 1.1, "dense_within": 0.3, "first_fraction": 0.1},
    "noise_scale": {"at_eval_loss": 1.3, "min_ratio": 2},
    "workers": {"heartbeat_seconds": 0.5, "stale_seconds": 30, "poll_seconds": 0.2},
}


def study_cli(*args, cwd, timeout=600) -> subprocess.CompletedProcess:
    """``python -m largebatch study ARGS`` in ``cwd``, its output captured."""
    return subprocess.run(
        [PYTHON, "-m", "largebatch", "study", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=clean_env()
    )


def tiny_base() -> dict:
    return tiny_config(
        **{
            "epochs": 2,
            "data.num_classes": 4,
            "data.train_samples": 512,
            "data.eval_samples": 256,
            "data.signal": 2.0,
            "log.interval": 4,
            "lr_schedule.warmup_steps": 1,
        }
    )


def write_study(folder: pathlib.Path, name: str = "study.yaml", base: dict | None = None, **changes) -> pathlib.Path:
    """``folder/base.yaml`` and ``folder/<name>``: the tiny study with ``changes`` (top-level
    keys; a value of None removes the key)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "base.yaml").write_text(yaml.safe_dump(base or tiny_base(), sort_keys=False))
    study = copy.deepcopy(TINY_STUDY)
    for key, value in changes.items():
        if value is None:
            study.pop(key, None)
        else:
            study[key] = value
    path = folder / name
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def process_gone(pid: int) -> bool:
    """Whether no process has id ``pid`` (any more)."""
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def kill_worker_at_held_trial(folder: pathlib.Path) -> pathlib.Path:
    """Run ``study run`` in ``folder`` until a trial is held (``HoldWhileMarked`` in
    tests/support/study_trials.py), kill its worker with SIGKILL and wait for the trial's
    process to end with it (no training left behind); the trial's ``held`` file."""
    import os
    import signal

    from tests.conftest import wait_until

    worker = subprocess.Popen(
        [PYTHON, "-m", "largebatch", "study", "run", "study.yaml"], cwd=folder, env=clean_env(), stdout=subprocess.DEVNULL
    )
    trials = folder / "trials"
    held = wait_until(lambda: next(iter(trials.glob("*/held")), None) if trials.is_dir() else None, 600, "a trial to train")
    training = int(held.read_text())
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    wait_until(lambda: process_gone(training), 60, f"the trial's process {training} to end with its worker")
    return held
