"""``RunDir``: the one place that names a run directory's files; and a run directory is
data: resuming, exporting, plotting or fine-tuning from one never runs code found in it."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil

import pytest

from largebatch.errors import UserError
from largebatch.launch import TrainArgs, train
from largebatch.rundir import RunDir
from tests.conftest import tiny_config, write_config


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


# ----------------------------------------------------------------------------- a run directory is data
# A run directory shared by someone else, with a Python file planted in it: named as its
# config.yaml's ``_base_``, and under the name of a hook file its config names by a
# relative path. Nothing that reads the run directory may run either (the marker file
# stays absent); each command works on the plain data or refuses with one line.

HOOK = "from largebatch.engine.hook import Hook\n\n\nclass Counter(Hook):\n    pass\n"
STEP = "checkpoints/step-00000002.pt"


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """``(config, run)``: a finished two-step run with its checkpoint, whose config names a
    hook file by a path relative to the config's folder (``exp/myhooks/mark.py``)."""
    root = tmp_path_factory.mktemp("original")
    (root / "exp/myhooks").mkdir(parents=True)
    (root / "exp/myhooks/mark.py").write_text(HOOK)
    cfg = tiny_config(hooks=[{"type": "myhooks/mark.py:Counter"}], **{"checkpoint.at_end": True, "max_steps": 2})
    config = write_config(root / "exp", cfg)
    (root / "work").mkdir()
    with contextlib.chdir(root / "work"):
        train(TrainArgs(config=str(config), run_dir=str(root / "run")))
    return config, root / "run"


def planted(original, tmp_path: pathlib.Path, *, base: bool) -> pathlib.Path:
    """A copy of the run with code planted in it that touches ``tmp_path/it-ran``."""
    copy = tmp_path / "B"
    shutil.copytree(original[1], copy)
    code = f"import pathlib\n\npathlib.Path({str(tmp_path / 'it-ran')!r}).touch()\n"
    (copy / "notes.py").write_text(code)
    (copy / "myhooks").mkdir()
    (copy / "myhooks/mark.py").write_text(code + HOOK)
    if base:
        (copy / "config.yaml").write_text("_base_: notes.py\n" + (copy / "config.yaml").read_text())
    return copy


def resume_args(config: pathlib.Path | None, copy: pathlib.Path, how: str, *extra: str) -> TrainArgs:
    where = {"run_dir": str(copy), "resume": "auto"} if how == "auto" else {"resume": str(copy / STEP)}
    return TrainArgs(config=str(config) if config else None, overrides=["max_steps=3", *extra], **where)


@pytest.mark.parametrize("how", ["auto", "path"])
@pytest.mark.parametrize("with_config", [True, False], ids=["with-config", "without-config"])
def test_a_resume_never_follows_a_base_planted_in_the_run_directory(original, tmp_path, monkeypatch, how, with_config):
    copy = planted(original, tmp_path, base=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as error:
        train(resume_args(original[0] if with_config else None, copy, how))
    assert "_base_ 'notes.py'" in str(error.value) and "--trust-checkpoint" in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "it-ran").exists()
    assert not (copy / "checkpoints/step-00000003.pt").exists()


@pytest.mark.parametrize("how", ["auto", "path"])
def test_a_resume_looks_for_hook_files_beside_the_config_given_never_in_the_run_directory(original, tmp_path, monkeypatch, how):
    copy = planted(original, tmp_path, base=False)
    monkeypatch.chdir(tmp_path)
    state = train(resume_args(original[0], copy, how))  # the hook file beside --config
    assert state.step == 3 and (copy / "checkpoints/step-00000003.pt").is_file()
    assert not (tmp_path / "it-ran").exists()


@pytest.mark.parametrize("how", ["auto", "path"])
def test_a_resume_without_config_looks_for_hook_files_in_the_working_directory_only(original, tmp_path, monkeypatch, how):
    copy = planted(original, tmp_path, base=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"hooks\[0\]: hook file 'myhooks/mark.py' not found in the working directory .*--config"):
        train(resume_args(None, copy, how))
    assert not (tmp_path / "it-ran").exists()
    shutil.copytree(original[0].parent / "myhooks", tmp_path / "myhooks")  # the user's own, where the command runs
    assert train(resume_args(None, copy, how)).step == 3
    assert not (tmp_path / "it-ran").exists()


def test_trust_checkpoint_trusts_the_run_directory(original, tmp_path, monkeypatch):
    copy = planted(original, tmp_path, base=True)
    monkeypatch.chdir(tmp_path)
    resumed = train(TrainArgs(config=None, overrides=["max_steps=3"], run_dir=str(copy), resume="auto", trust_checkpoint=True))
    assert resumed.step == 3
    assert (tmp_path / "it-ran").exists()  # what the flag says: the run directory's files are followed and run


def test_export_plot_and_init_from_read_a_run_directory_as_data(original, tmp_path, monkeypatch):
    from largebatch.export import export_run
    from largebatch.run_curves import plot_run

    copy = planted(original, tmp_path, base=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"config.yaml: names _base_ 'notes.py'") as error:
        export_run(copy, tmp_path / "export")
    assert "\n" not in str(error.value) and not (tmp_path / "export").exists()
    assert {p.name for p in plot_run(copy, tmp_path / "plots")} >= {"loss.png", "lr.png"}
    config = write_config(tmp_path, tiny_config(**{"model.init_from": str(copy), "max_steps": 1}), name="finetune.yaml")
    assert train(TrainArgs(config=str(config), run_dir=str(tmp_path / "finetuned"))).step == 1
    assert not (tmp_path / "it-ran").exists()
    (copy / "config.yaml").write_text((original[1] / "config.yaml").read_text())  # the plain data: exported as it is
    assert (export_run(copy, tmp_path / "export") / "model.safetensors").read_bytes() == (copy / "model.safetensors").read_bytes()
    assert not (tmp_path / "it-ran").exists()
