"""``largebatch train`` on a run directory, through the real command line: a resume starts
from the run's saved ``config.yaml`` (its ``--set`` values kept, new ones applied on top and
printed), a finished run does nothing and says how to go on, and every command the tool
suggests in a message runs as printed.

The reference is an uninterrupted run: a run stopped by ``max_steps`` and continued with
the suggested command ends with its bytes and its metrics, record for record."""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import subprocess

import pytest
import yaml

from largebatch.config import resolve_config
from tests.conftest import PYTHON, REPO, SIGNAL_HOOKS, assert_same_weights, clean_env, resume_config, run_cli, write_config

pytestmark = pytest.mark.slow  # each case is a few training runs in fresh processes

BACKTICKED = re.compile(r"`([^`]+)`")


def train(*args: str) -> subprocess.CompletedProcess:
    return run_cli("train", *args)


def suggested(text: str) -> list[str]:
    """The commands a message suggests: its backticked spans that start with a program."""
    return [c for c in BACKTICKED.findall(text) if c.split()[0] in ("largebatch", "python", "apt-get")]


def execute(command: str) -> subprocess.CompletedProcess:
    """A suggested command, run from the repository root as a user would paste it."""
    words = shlex.split(command)
    if words[0] == "largebatch":
        words = [PYTHON, "-m", "largebatch", *words[1:]]
    elif words[0] == "python":
        words = [PYTHON, *words[1:]]
    return subprocess.run(words, cwd=REPO, capture_output=True, text=True, timeout=600, env=clean_env())


def records(run_dir: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def kinds(run_dir: pathlib.Path) -> list[tuple[int, str]]:
    """(step, train|eval) of each metrics record, in file order."""
    return [(r["step"], "eval" if "eval/loss" in r else "train") for r in records(run_dir)]


def config_of(tmp_path: pathlib.Path) -> pathlib.Path:
    # two epochs of 4 steps, an evaluation after each, a checkpoint at the end
    cfg = resume_config(**{"eval.interval_epochs": 1, "checkpoint.at_end": True})
    return write_config(tmp_path, cfg)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> pathlib.Path:
    """``max_steps=6`` in one go: the reference for a run stopped at 3 and continued."""
    work = tmp_path_factory.mktemp("uninterrupted")
    result = train("--config", str(config_of(work)), "--run-dir", str(work / "run"), "--set", "max_steps=6")
    assert result.returncode == 0, result.stderr
    return work / "run"


def test_a_resume_keeps_the_set_values_and_the_suggested_command_continues_to_the_uninterrupted_bytes(tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    assert train("--config", str(config_of(tmp_path)), "--run-dir", str(run_dir), "--set", "max_steps=3").returncode == 0
    saved = {
        p.name: p.read_bytes() for p in [run_dir / "config.yaml", run_dir / "metrics.jsonl", *sorted((run_dir / "checkpoints").iterdir())]
    }

    # no --config, no --set: the saved max_steps=3 holds, so the run is finished and says so
    again = train("--run-dir", str(run_dir), "--resume", "auto")
    assert again.returncode == 0, again.stderr
    assert f"{run_dir} already finished at step 3" in again.stdout
    after = {
        p.name: p.read_bytes() for p in [run_dir / "config.yaml", run_dir / "metrics.jsonl", *sorted((run_dir / "checkpoints").iterdir())]
    }
    assert after == saved  # nothing trained, evaluated or rewritten

    (command,) = suggested(again.stdout)
    assert command == f"largebatch train --run-dir {run_dir} --resume auto --set max_steps=6"
    went_on = execute(command)
    assert went_on.returncode == 0, went_on.stderr
    assert "--set changed max_steps (3 -> 6)" in went_on.stdout
    assert resolve_config(run_dir / "config.yaml").max_steps == 6  # the saved config follows
    assert_same_weights(run_dir / "model.safetensors", uninterrupted / "model.safetensors")
    # the first run's end-of-run evaluation at step 3 stays; then the uninterrupted run's
    # records, one per evaluation, none repeated
    expected = kinds(uninterrupted)
    expected.insert(expected.index((3, "train")) + 1, (3, "eval"))
    assert kinds(run_dir) == expected
    assert [r["loss"] for r in records(run_dir) if "loss" in r] == [r["loss"] for r in records(uninterrupted) if "loss" in r]


def test_a_resumed_finished_run_with_a_smaller_max_steps_does_nothing(tmp_path):
    run_dir = tmp_path / "run"
    assert train("--config", str(config_of(tmp_path)), "--run-dir", str(run_dir)).returncode == 0
    before = kinds(run_dir)
    assert before.count((8, "eval")) == 1
    result = train("--run-dir", str(run_dir), "--resume", "auto", "--set", "max_steps=4")
    assert result.returncode == 0, result.stderr
    assert "already finished at step 8" in result.stdout and "step 8/4" not in result.stdout
    assert kinds(run_dir) == before


def test_the_longer_schedule_suggested_for_a_run_that_trained_all_its_epochs_runs(tmp_path):
    run_dir = tmp_path / "run"
    assert train("--config", str(config_of(tmp_path)), "--run-dir", str(run_dir)).returncode == 0
    again = train("--run-dir", str(run_dir), "--resume", "auto")
    assert "it trained all 2 epochs" in again.stdout
    (command,) = suggested(again.stdout)
    assert command.endswith("--set epochs=4 --resume-ignore-config")
    result = execute(command)
    assert result.returncode == 0, result.stderr
    assert "--set changed epochs (2 -> 4)" in result.stdout
    assert kinds(run_dir)[-1] == (16, "eval")


def test_a_config_given_on_resume_is_reported_where_it_differs_and_the_saved_values_kept(tmp_path):
    run_dir = tmp_path / "run"
    stop = {"type": f"{SIGNAL_HOOKS}:SendSignal", "step": 2, "micro": 1, "signal": "SIGUSR2"}
    config = config_of(tmp_path)
    assert train("--config", str(config), "--run-dir", str(run_dir), "--set", "hooks=" + json.dumps([stop])).returncode == 75
    other = yaml.safe_load(config.read_text())
    other["optimizer"]["lr"] = 0.5
    other_path = write_config(tmp_path, other, name="other.yaml")
    result = train("--config", str(other_path), "--run-dir", str(run_dir), "--resume", "auto")
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if f"--config {other_path} differs from the saved config" in line]
    assert "optimizer.lr (0.001 -> 0.5)" in line and "the saved values are kept" in line
    assert resolve_config(run_dir / "config.yaml").optimizer.lr == 0.001


def test_a_runs_config_yaml_loads_back_as_a_config(tmp_path):
    run_dir = tmp_path / "run"
    assert train("--config", str(config_of(tmp_path)), "--run-dir", str(run_dir), "--set", "max_steps=2").returncode == 0
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert "derived" in saved
    assert resolve_config(run_dir / "config.yaml").to_dict() == {k: v for k, v in saved.items() if k != "derived"}
    shown = run_cli("config", "show", str(run_dir / "config.yaml"))
    assert shown.returncode == 0, shown.stderr
    assert yaml.safe_load(shown.stdout)["derived"]["total_steps"] == saved["derived"]["total_steps"]


def test_resume_without_a_run_or_config_is_one_error_line(tmp_path):
    result = train("--run-dir", str(tmp_path / "none"), "--resume", "auto")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "no run to resume" in result.stderr and "--config CONFIG" in result.stderr


def test_every_command_a_message_suggests_runs(tmp_path):
    """Each situation whose message suggests a command: the command, pasted, succeeds and
    fixes what the message was about."""
    run_dir = tmp_path / "run"
    stop = {"type": f"{SIGNAL_HOOKS}:SendSignal", "step": 2, "micro": 1, "signal": "SIGUSR2"}
    config = config_of(tmp_path)
    assert train("--config", str(config), "--run-dir", str(run_dir), "--set", "hooks=" + json.dumps([stop])).returncode == 75

    # export of an unfinished run suggests resuming it
    export = run_cli("export", str(run_dir), "--out", str(tmp_path / "out"))
    assert export.returncode == 2
    (command,) = suggested(export.stderr)
    resumed = execute(command)
    assert resumed.returncode == 0, resumed.stderr
    assert run_cli("export", str(run_dir), "--out", str(tmp_path / "out")).returncode == 0

    # a new run in a folder that holds one suggests continuing that run
    fresh = train("--config", str(config), "--run-dir", str(run_dir))
    assert fresh.returncode == 2
    (command,) = suggested(fresh.stderr)
    continued = execute(command)
    assert continued.returncode == 0 and "already finished at step 8" in continued.stdout

    # a TFRecord shard without its index file suggests building it
    shards = tmp_path / "shards"
    made = run_cli(
        "data", "convert", "fashion-mnist", "--out", str(shards), "--limit", "16", "--train-shards", "1", "--validation-shards", "1"
    )
    assert made.returncode == 0, made.stderr
    (shards / "train-00000-of-00001.idx").unlink()
    verify = run_cli("data", "verify", str(shards))
    assert verify.returncode != 0
    commands = suggested(verify.stdout + verify.stderr)
    assert commands and all(c.startswith("largebatch data index ") for c in commands)
    for command in commands:
        assert execute(command).returncode == 0
    assert run_cli("data", "verify", str(shards)).returncode == 0

    # Fashion-MNIST missing where convert looks: the preparation script (idempotent: it
    # keeps finished shards in data/fashion-mnist, the demo's folder)
    missing = run_cli("data", "convert", "fashion-mnist", str(tmp_path / "nothing"), "--out", str(tmp_path / "fm"))
    assert missing.returncode == 2
    (command,) = suggested(missing.stderr)
    assert command == "python data/prepare_fmnist.py"
    prepared = execute(command)
    assert prepared.returncode == 0, prepared.stderr
    assert (REPO / "data/fashion-mnist/dataset.json").is_file()


def test_a_preempted_and_resumed_run_logs_each_step_once_with_the_consoles_epoch_numbers(tmp_path):
    config = config_of(tmp_path)
    whole = train("--config", str(config), "--run-dir", str(tmp_path / "whole"), "--set", "log.console=true")
    assert whole.returncode == 0, whole.stderr
    stop = {"type": f"{SIGNAL_HOOKS}:SendSignal", "step": 5, "micro": 2, "signal": "SIGUSR2"}
    run_dir = tmp_path / "run"
    assert train("--config", str(config), "--run-dir", str(run_dir), "--set", "hooks=" + json.dumps([stop])).returncode == 75
    assert train("--run-dir", str(run_dir), "--resume", "auto", "--set", "hooks=[]").returncode == 0
    assert kinds(run_dir) == kinds(tmp_path / "whole")
    assert [r.get("loss") for r in records(run_dir)] == [r.get("loss") for r in records(tmp_path / "whole")]
    # steps 1-4 and the evaluation after them are epoch 1, as the console says; 5-8 epoch 2
    assert [(r["step"], r["epoch"]) for r in records(run_dir)] == [(s, 1) for s in (1, 2, 3, 4, 4)] + [(s, 2) for s in (5, 6, 7, 8, 8)]
    shown = dict(re.findall(r"step (\d+)/8 \| epoch (\d)/2", whole.stdout))
    assert shown == {str(s): str(1 + (s > 4)) for s in range(1, 9)}
