"""``RunDir``: the one place that names a run directory's files."""

from __future__ import annotations

import os
import pathlib

import pytest

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


def test_the_metrics_reader_drops_a_cut_last_line_and_names_any_other_bad_one(tmp_path, capsys):
    from largebatch.errors import UserError
    from largebatch.rundir import read_metric_lines, read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    assert read_metrics(path) == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]
    assert read_metric_lines(path)[1] == ('{"step": 2, "loss": 1.5}', {"step": 2, "loss": 1.5})
    assert f"warning: {path}: line 4, the last, was cut short" in capsys.readouterr().err
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 3, "lo\n{"step": 2, "loss": 1.5}\n')
    with pytest.raises(UserError, match=r"metrics.jsonl: line 2 is not JSON .*remove the line"):
        read_metrics(path)
    for bad in ("[1, 2]", "1e400", "null", '{"loss": 1.0}', '{"step": true}', '{"step": 1.5}'):
        path.write_text(f"{bad}\n")
        with pytest.raises(UserError, match=r"line 1 is not a metrics record"):
            read_metrics(path)
