"""Where a run starts (``largebatch/start.py``): one plan from the command line, with the
run directory, the config, what ``--set`` changed, the credentials given back and the
checkpoint; a new run never writes over another run's files; and a refused command
leaves no run directory behind."""

from __future__ import annotations

import pytest
import torch

from largebatch import start
from largebatch.config import dump_yaml, resolve_config
from largebatch.config.redact import redact
from largebatch.errors import UserError
from largebatch.launch import TrainArgs, train
from largebatch.start import plan_start
from tests.conftest import tiny_config, write_config

HOOK = {"type": "hooks/notify.py:Notify", "url": "https://alice:tok@hooks.example.com/x"}


def saved_run(tmp_path, cfg: dict):
    """A run directory as a run leaves it: its redacted config.yaml and a checkpoint."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    torch.save({"format": 1, "model": {}, "step": 7}, run_dir / "checkpoints/step-00000007.pt")
    (run_dir / "config.yaml").write_text(dump_yaml(redact(resolve_config(write_config(tmp_path, cfg, name="first.yaml")).to_dict())))
    return run_dir


def test_a_resume_is_planned_once_from_the_saved_config_the_config_given_and_the_set_values(tmp_path, monkeypatch):
    run_dir = saved_run(tmp_path, tiny_config(hooks=[HOOK]))
    given = write_config(tmp_path, tiny_config(hooks=[HOOK], **{"optimizer.lr": 0.5}), name="mine.yaml")
    resolved = []
    for name in ("resolve_config", "resolve_saved_config"):
        real = getattr(start, name)
        monkeypatch.setattr(start, name, lambda *a, real=real, **k: resolved.append(a[0]) or real(*a, **k))

    plan = plan_start(TrainArgs(config=str(given), overrides=["max_steps=9"], run_dir=str(run_dir), resume="auto"), is_main=True)
    assert resolved == [run_dir / "config.yaml", given]  # each file once
    assert plan.run_dir.path == run_dir and plan.resumed_from.path == run_dir and plan.saved_config == run_dir / "config.yaml"
    assert plan.checkpoint == run_dir / "checkpoints/step-00000007.pt" and plan.payload["step"] == 7
    assert plan.config.max_steps == 9 and plan.config.optimizer.lr == 1e-3  # the saved values, --set on top
    assert plan.config.to_dict()["hooks"] == [HOOK]  # the credential given back from --config
    assert plan.changed == ("max_steps (None -> 9)",) and plan.ignored == ("optimizer.lr (0.001 -> 0.5)",)
    assert plan.restored == ("hooks[0].url",) and plan.config_file == given
    (resuming, differs) = plan.messages()
    assert resuming.endswith("--set changed max_steps (None -> 9); the redacted hooks[0].url taken from --config " + str(given))
    assert "alice" not in resuming + differs and "optimizer.lr (0.001 -> 0.5)" in differs


def test_a_new_run_plans_from_its_config_alone(tmp_path):
    config = write_config(tmp_path, tiny_config())
    plan = plan_start(TrainArgs(config=str(config), run_dir=str(tmp_path / "new")), is_main=True)
    assert (plan.checkpoint, plan.saved_config, plan.config_file, plan.messages()) == (None, None, config, [])
    assert not (tmp_path / "new").exists()  # made once the run has been accepted


@pytest.mark.parametrize("files", [["config.yaml", "metrics.jsonl", "model.safetensors"], ["metrics.jsonl"], ["checkpoints/"]])
def test_a_new_run_refuses_a_folder_that_holds_a_runs_files(tmp_path, files):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in files:
        (run_dir / name).mkdir() if name.endswith("/") else (run_dir / name).write_text("an earlier run's\n")
    before = {p.name: p.is_dir() or p.read_text() for p in run_dir.iterdir()}
    config = write_config(tmp_path, tiny_config(**{"max_steps": 1}))
    with pytest.raises(UserError) as error:
        train(TrainArgs(config=str(config), run_dir=str(run_dir)))
    assert str(error.value).startswith(f"{run_dir}: --run-dir already holds a run's files ({', '.join(n.rstrip('/') for n in files)})")
    assert "another --run-dir" in str(error.value)
    assert {p.name: p.is_dir() or p.read_text() for p in run_dir.iterdir()} == before
    assert train(TrainArgs(config=str(config), run_dir=str(tmp_path / "other"))).step == 1  # the other folder it names


def test_a_folder_without_a_runs_files_takes_a_new_run(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine\n")
    assert train(TrainArgs(config=str(write_config(tmp_path, tiny_config(max_steps=1))), run_dir=str(run_dir))).step == 1
    assert (run_dir / "notes.txt").read_text() == "mine\n" and (run_dir / "config.yaml").is_file()


@pytest.mark.parametrize(
    "mistake",
    [
        {"resume": "no-such-checkpoint.pt"},  # refused while planning
        {"overrides": ["model.init_from=nowhere"]},  # refused while building the model, after the process group
    ],
    ids=["missing-checkpoint", "missing-init-from"],
)
def test_a_refused_command_leaves_no_run_directory(tmp_path, monkeypatch, mistake):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, tiny_config())
    with pytest.raises(UserError):
        train(TrainArgs(config=str(config), run_dir=str(tmp_path / "runs/new"), **mistake))
    assert not (tmp_path / "runs").exists()
