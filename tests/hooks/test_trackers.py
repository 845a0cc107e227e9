"""The ``mlflow`` and ``wandb`` hooks against the real packages: a local MLflow tracking
server (SQLite backend, local artifact folder) read back through ``MlflowClient``, and
W&B's offline run files read back record by record. Nothing reaches the network.

The reference is the run's own ``metrics.jsonl`` and ``config.yaml``: the tracker must
hold every numeric value of the one at its step and every key of the other."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import os
import pathlib
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from largebatch import preemption
from largebatch.checkpoint import flatten
from largebatch.config.typed import typed
from largebatch.errors import UserError
from largebatch.launch import TrainArgs, train
from tests.conftest import SIGNAL_HOOKS, tiny_config, write_config
from tests.support.config_hooks import config_hooks

mlflow = pytest.importorskip("mlflow")
wandb = pytest.importorskip("wandb")

STOP_AT = 5  # the interrupted run stops mid-epoch 2, past its last logged step


def run(tmp_path: pathlib.Path, run_dir: pathlib.Path, *hooks, resume: str | None = None, sets=(), **overrides):
    cfg = tiny_config(
        **{
            "epochs": 2,
            "log.interval": 2,
            "eval.interval_epochs": 1,
            "checkpoint.at_end": True,
            "hooks": list(hooks),
            **overrides,
        }
    )
    path = write_config(tmp_path, cfg, name=f"{run_dir.name}-{resume or 'new'}.yaml")
    preemption.clear()
    return train(TrainArgs(config=str(path), overrides=list(sets), run_dir=str(run_dir), resume=resume))


def logged_series(run_dir: pathlib.Path) -> dict[str, list[tuple[int, float]]]:
    """Every finite number of metrics.jsonl, per key, as (step, value) in file order."""
    series: dict[str, list[tuple[int, float]]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                series.setdefault(key, []).append((record["step"], float(value)))
    return series


def assert_same_points(got: list[tuple[int, float]], expected: list[tuple[int, float]], key: str) -> None:
    got, expected = sorted(got), sorted(expected)
    assert [step for step, _ in got] == [step for step, _ in expected], key
    assert [value for _, value in got] == pytest.approx([value for _, value in expected], rel=1e-12), key


def saved_config(run_dir: pathlib.Path) -> dict:
    return flatten(yaml.safe_load((run_dir / "config.yaml").read_text()))


def test_a_missing_tracker_package_is_a_config_error_naming_the_extra(monkeypatch):
    for name, extra in (("mlflow", "mlflow"), ("wandb", "wandb")):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
        with pytest.raises(UserError, match=rf"pip install 'largebatch\[{extra}\]'"):
            config_hooks(typed(tiny_config(hooks=[name])))
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UserError, match="plots=False"):
        config_hooks(typed(tiny_config(hooks=["wandb"])))
    config_hooks(typed(tiny_config(hooks=[{"type": "wandb", "plots": False}])))  # no plots: matplotlib not needed


# --------------------------------------------------------------------------- MLflow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_mlflow_server(root: pathlib.Path) -> tuple[subprocess.Popen, str]:
    """``mlflow server`` on a free loopback port, SQLite backend, artifacts in a local
    folder, answering; returns the process and its URI."""
    port = free_port()
    mlflow_cli = pathlib.Path(sys.executable).with_name("mlflow")
    with open(root / "server.log", "w") as log:
        proc = subprocess.Popen(
            [str(mlflow_cli), "server", "--backend-store-uri", f"sqlite:///{root / 'db.sqlite'}"]
            + ["--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MLFLOW_TRACKING_URI": ""},
            start_new_session=True,  # its own process group: the server and its workers end together
        )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as reply:
                if reply.status == 200:
                    return proc, uri
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            stop_mlflow_server(proc)
            raise RuntimeError(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)


def stop_mlflow_server(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    proc, uri = start_mlflow_server(tmp_path_factory.mktemp("mlflow"))
    try:
        yield uri
    finally:
        stop_mlflow_server(proc)


@pytest.mark.slow
def test_mlflow_holds_the_config_every_metric_and_the_outputs_and_a_resume_continues_the_run(tmp_path, mlflow_server, signal_handlers):
    from mlflow import MlflowClient

    hook = {"type": "mlflow", "tracking_uri": mlflow_server, "experiment": "resume-test", "tags": {"study": "t"}}
    run_dir = tmp_path / "run"
    # preempted (submitit's SIGUSR2) during step index 4: it stops after step 5 with a checkpoint
    preempt = {"type": f"{SIGNAL_HOOKS}:SendSignal", "step": STOP_AT - 1, "micro": 1, "signal": "SIGUSR2"}
    assert run(tmp_path, run_dir, hook, preempt, **{"ema.decay": 0.9}).interrupted
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("resume-test")
    (first,) = client.search_runs([experiment.experiment_id])
    assert first.info.status == "KILLED" and first.info.run_name == "run"
    assert not client.list_artifacts(first.info.run_id, "model")  # no final weights from an interrupted run

    state = run(tmp_path, run_dir, hook, resume="auto", **{"ema.decay": 0.9})
    assert state.step == 8  # 2 epochs of 4 steps: the resumed run went on
    (tracked,) = client.search_runs([experiment.experiment_id])  # the same run, not a second one
    assert tracked.info.run_id == first.info.run_id and tracked.info.status == "FINISHED"
    assert tracked.data.tags["study"] == "t" and tracked.data.tags["largebatch.run_dir"] == str(run_dir)

    config = saved_config(run_dir)
    assert set(tracked.data.params) == set(config)
    for key in ("optimizer.lr", "global_batch_size", "derived.accumulation", "model.embed_dim"):
        assert tracked.data.params[key] == str(config[key]), key

    expected = logged_series(run_dir)
    assert {"loss", "lr", "eval/top1", "epoch"} <= set(expected)
    assert set(tracked.data.metrics) == set(expected)
    for key, points in expected.items():
        history = client.get_metric_history(tracked.info.run_id, key)
        assert_same_points([(m.step, m.value) for m in history], points, key)

    artifacts = {a.path for folder in ("run", "plots", "model") for a in client.list_artifacts(tracked.info.run_id, folder)}
    assert {
        "run/config.yaml",
        "run/metrics.jsonl",
        "model/model.safetensors",
        "model/config.json",
        "model/model_ema.safetensors",
    } <= artifacts
    assert any(path.startswith("plots/") and path.endswith(".png") for path in artifacts)
    local = client.download_artifacts(tracked.info.run_id, "model/model.safetensors", str(tmp_path / "down"))
    assert pathlib.Path(local).read_bytes() == (run_dir / "model.safetensors").read_bytes()  # the final weights


@pytest.mark.slow
def test_mlflow_marks_a_failed_run(tmp_path, mlflow_server):
    from mlflow import MlflowClient

    hook = {"type": "mlflow", "tracking_uri": mlflow_server, "experiment": "failing", "artifacts": False}
    boom = tmp_path / "boom.py"
    boom.write_text(
        "from largebatch.engine.hook import Hook\n\n\nclass Boom(Hook):\n"
        "    def after_step(self, state):\n        if state.step == 3:\n            raise RuntimeError('boom at step 3')\n"
    )
    with pytest.raises(Exception, match="boom at step 3"):
        run(tmp_path, tmp_path / "failing", hook, {"type": f"{boom}:Boom"})
    client = MlflowClient(tracking_uri=mlflow_server)
    (tracked,) = client.search_runs([client.get_experiment_by_name("failing").experiment_id])
    assert tracked.info.status == "FAILED"


# --------------------------------------------------------------------------- W&B, offline

BLOCK = 32768  # the LevelDB log format of W&B's .wandb files: 32 KiB blocks of framed chunks


def wandb_records(path: pathlib.Path) -> list:
    """The protobuf records of a ``run-<id>.wandb`` file."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, pos = [], b"", 7  # 7 header bytes: ':W&B', magic, version
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


@pytest.mark.slow
def test_wandb_offline_files_hold_the_config_every_metric_and_the_outputs_and_a_resume_keeps_the_id(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    hook = {"type": "wandb", "project": "largebatch-test", "mode": "offline", "tags": ["t"]}
    run_dir = tmp_path / "run"
    run(tmp_path, run_dir, hook, max_steps=STOP_AT)
    run(tmp_path, run_dir, hook, resume="auto", sets=["max_steps=null"])  # a resume keeps the saved max_steps unless told
    out = capfd.readouterr()
    assert not [line for line in (out.out + out.err).splitlines() if line.startswith("wandb:")]  # no banner: log.verbose is off

    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2  # one per process, both with the same run id: `wandb sync` joins them
    ids = {path.name for path in files}
    assert len(ids) == 1
    records = [record for path in files for record in wandb_records(path)]
    kinds = [r.WhichOneof("record_type") for r in records]

    run_record = [r.run for r, k in zip(records, kinds) if k == "run"][-1]  # the resumed process's
    config = {item.key: json.loads(item.value_json) for item in run_record.config.update if item.key != "_wandb"}
    assert flatten(config) == saved_config(run_dir)
    assert run_record.project == "largebatch-test" and list(run_record.tags) == ["t"]

    got: dict[str, list[tuple[int, float]]] = {}
    for record, kind in zip(records, kinds):
        if kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            for key, value in row.items():
                if not key.startswith("_") and key != "step":
                    got.setdefault(key, []).append((row["step"], value))
    expected = logged_series(run_dir)
    assert set(got) == set(expected)
    for key, points in expected.items():
        assert_same_points(got[key], points, key)

    artifacts = {r.artifact.name: r.artifact for r, k in zip(records, kinds) if k == "artifact"}
    run_id = files[0].stem.removeprefix("run-")
    model = artifacts[f"{run_id}-model"]  # the resumed run's: the final weights
    contents = {c.path: c.digest for c in model.manifest.contents}
    assert model.type == "model" and set(contents) == {"model.safetensors", "config.json"}
    final = base64.b64encode(hashlib.md5((run_dir / "model.safetensors").read_bytes()).digest()).decode()
    assert contents["model.safetensors"] == final  # W&B's digest: base64 of the MD5
    outputs = {c.path for c in artifacts[f"{run_id}-run"].manifest.contents}
    assert {"config.yaml", "metrics.jsonl"} <= outputs and any(p.startswith("plots/") for p in outputs)


@pytest.mark.slow
def test_mlflow_starts_a_new_run_when_the_saved_one_is_unknown_to_the_server(tmp_path, mlflow_server, capsys):
    from types import SimpleNamespace

    from mlflow import MlflowClient

    from largebatch.hooks.trackers import MlflowHook
    from largebatch.rundir import RunDir

    hook = MlflowHook(tracking_uri=mlflow_server, experiment="elsewhere", artifacts=False)
    hook.load_state_dict({"run_id": "0" * 32})  # a checkpoint written against another server
    run = SimpleNamespace(
        is_main=True,
        run_dir=RunDir(tmp_path / "run"),
        config=SimpleNamespace(to_dict=lambda: {"seed": 0}, log=SimpleNamespace(verbose=False)),
        derived=SimpleNamespace(to_dict=lambda: {"world_size": 1}),
    )
    state = SimpleNamespace(run=run)
    hook.before_run(state)
    assert "cannot continue" in capsys.readouterr().out
    run = MlflowClient(tracking_uri=mlflow_server).get_run(hook.run_id)
    assert hook.run_id != "0" * 32 and run.data.params == {"seed": "0", "derived.world_size": "1"}


@pytest.mark.slow
def test_mlflow_without_a_uri_writes_inside_the_run_directory_and_says_nothing(tmp_path, monkeypatch, capfd):
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)  # where a user runs from: nothing may appear here
    run_dir = tmp_path / "run"
    run(tmp_path, run_dir, {"type": "mlflow", "plots": False})
    assert list(work.iterdir()) == []
    assert (run_dir / "mlflow.db").is_file() and (run_dir / "mlartifacts").is_dir()
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    (tracked,) = client.search_runs([client.get_experiment_by_name("largebatch").experiment_id])
    assert set(tracked.data.metrics) == set(logged_series(run_dir))
    assert "model/model.safetensors" in {a.path for a in client.list_artifacts(tracked.info.run_id, "model")}
    out = capfd.readouterr()
    assert " INFO " not in out.out + out.err  # MLflow's and alembic's INFO lines: only with log.verbose


@pytest.mark.slow
def test_mlflow_on_a_file_store_maps_metric_names_that_would_collide(tmp_path, monkeypatch):
    # lr and lr/no_decay: a file and a folder of the same name in a file store; there they
    # are stored as lr and lr.no_decay, every point of metrics.jsonl kept.
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    uri = (tmp_path / "mlruns").as_uri()
    run_dir = tmp_path / "run"
    run(tmp_path, run_dir, {"type": "mlflow", "tracking_uri": uri, "plots": False})
    assert (run_dir / "model.safetensors").is_file()
    client = MlflowClient(tracking_uri=uri)
    (tracked,) = client.search_runs([client.get_experiment_by_name("largebatch").experiment_id])
    expected = logged_series(run_dir)
    assert {"lr/no_decay", "grad_norm/decay"} & set(expected)
    assert set(tracked.data.metrics) == {key.replace("/", ".") for key in expected}
    for key, points in expected.items():
        history = client.get_metric_history(tracked.info.run_id, key.replace("/", "."))
        assert_same_points([(m.step, m.value) for m in history], points, key)


STOP_PROCESS = """
import os
import signal

from largebatch.engine.hook import Hook


class StopProcess(Hook):
    def __init__(self, pid: int, step: int):
        super().__init__()
        self.pid, self.step = pid, step

    def after_step(self, state):  # before the trackers (they run last)
        if state.step == self.step:
            os.killpg(self.pid, signal.SIGKILL)  # the server and its workers
"""


@pytest.mark.slow
def test_a_tracker_that_fails_mid_run_detaches_with_one_warning_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    proc, uri = start_mlflow_server(tmp_path)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the user's setting: no minutes of retries here
    (tmp_path / "stop.py").write_text(STOP_PROCESS)
    stop = {"type": f"{tmp_path / 'stop.py'}:StopProcess", "pid": proc.pid, "step": 3}  # the server dies after step 3
    try:
        state = run(tmp_path, tmp_path / "run", {"type": "mlflow", "tracking_uri": uri, "plots": False}, stop, **{"log.interval": 1})
    finally:
        stop_mlflow_server(proc)
    assert state.step == 8 and not state.interrupted  # two epochs of 4 steps: the run went on
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning: the mlflow hook failed")]
    assert len(warnings) == 1 and "at step 3" in warnings[0] and "metrics.jsonl keeps every value" in warnings[0]
    assert [step for step, _ in logged_series(tmp_path / "run")["loss"]] == list(range(1, 9))
    assert (tmp_path / "run" / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_tracking_uri_with_credentials_is_used_as_given_and_shown_redacted(tmp_path, mlflow_server, capfd):
    """``http://user:password@host`` as ``tracking_uri``: the hook talks to the server through
    it; the MLflow run's parameters and tags, its config.yaml artifact, the run directory and
    the console hold the URI with its user-info redacted."""
    from mlflow import MlflowClient

    secret = "s3cr3t-pw"
    hook = {"type": "mlflow", "tracking_uri": mlflow_server.replace("http://", f"http://alice:{secret}@"), "experiment": "creds"}
    run_dir = tmp_path / "run"
    state = run(tmp_path, run_dir, {**hook, "plots": False})
    assert state.step == 8
    client = MlflowClient(tracking_uri=mlflow_server)
    (tracked,) = client.search_runs([client.get_experiment_by_name("creds").experiment_id])
    assert tracked.info.status == "FINISHED"  # it reached the server and finished there
    redacted = mlflow_server.replace("http://", "http://<redacted>@")
    assert f"'tracking_uri': '{redacted}'" in tracked.data.params["hooks"]
    assert secret not in json.dumps([tracked.data.params, tracked.data.tags])
    config = pathlib.Path(client.download_artifacts(tracked.info.run_id, "run/config.yaml", str(tmp_path / "down")))
    assert f"tracking_uri: {redacted}" in config.read_text()
    assert not [p for p in run_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    out = capfd.readouterr()
    assert secret not in out.out + out.err
