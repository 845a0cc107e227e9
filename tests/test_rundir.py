"""``RunDir``: the one place that names a run directory's files."""

from __future__ import annotations

import os
import pathlib

from largebatch.rundir import RunDir


def test_the_files_of_a_run_directory(tmp_path):
    run = RunDir(tmp_path / "run")
    assert (run.config.name, run.metrics.name, run.hub_config.name) == ("config.yaml", "metrics.jsonl", "config.json")
    assert run.weights() == tmp_path / "run/model.safetensors" and run.weights("ema") == tmp_path / "run/model_ema.safetensors"
    assert run.checkpoint(12) == tmp_path / "run/checkpoints/step-00000012.pt"
    assert run.checkpoint(12, sharded=True) == tmp_path / "run/checkpoints/step-00000012"
    assert run.latest == tmp_path / "run/checkpoints/latest" and run.plot("loss") == tmp_path / "run/loss.png"
    assert not run.finished and run.extra_weights() == []
    run.path.mkdir()
    run.weights().write_bytes(b"")
    run.weights("ema").write_bytes(b"")
    assert run.finished and run.extra_weights() == [run.weights("ema")]


def test_a_run_directory_is_path_like_and_compares_by_path(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    assert run / "notes.txt" == tmp_path / "run/notes.txt"
    assert os.fspath(run) == str(tmp_path / "run") == str(run) and run.name == "run"
    assert pathlib.Path(run) == run.path and RunDir(run.path) == run and RunDir(run) == run
