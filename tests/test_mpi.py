"""Launching with a REAL Open MPI ``mpirun -n 2``: ranks come from ``OMPI_COMM_WORLD_*``
and end with identical weights, equal to the torchrun run of the same config."""

import subprocess

import pytest

from tests.conftest import (
    PYTHON,
    RANK_WEIGHTS,
    REPO,
    assert_same_weights,
    clean_env,
    free_port,
    hooks_override,
    resume_config,
    write_config,
)
from tests.support.slurm_cluster import ensure_installed

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def test_mpirun_two_ranks_end_with_identical_weights(tmp_path, two_rank_reference):
    reason = ensure_installed(("openmpi-bin",), ("mpirun",))
    if reason:
        pytest.skip(f"no Open MPI: {reason}")
    config = str(write_config(tmp_path, resume_config()))
    run_dir = tmp_path / "run"
    cmd = ["mpirun", "-n", "2", "--allow-run-as-root", "--bind-to", "none", PYTHON, str(REPO / "train.py"), "--config", config]
    cmd += ["--run-dir", str(run_dir), "--set", hooks_override(RANK_WEIGHTS)]
    env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "world size 2" in result.stdout
    assert_same_weights(run_dir / "rank0.safetensors", run_dir / "rank1.safetensors")
    assert_same_weights(two_rank_reference / "model.safetensors", run_dir / "model.safetensors")
