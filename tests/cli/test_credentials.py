"""Credentials in every form the redaction rule covers (``largebatch/config/redact.py``), given
to a real training run and a real study: the run's hook gets them as given, and no file
written under the run directory or the study's folder (checkpoints, the trackers' stores
and the SQLite study storage read as raw bytes) and no console or ``error:`` line holds any
of them."""

from __future__ import annotations

import json
import pathlib
import sys
from importlib.util import find_spec

import pytest

from largebatch.train_command import train_main
from tests.conftest import REPO
from tests.study.helpers import study_cli, tiny_base, write_study

pytestmark = pytest.mark.usefixtures("preemption_handlers_restored")

# (form, a hook's arguments holding it, the secret that must not be seen)
HOOK_FORMS = [
    ("URI user-info", {"url": "https://alice:zq-userinfo@hooks.example.com/x"}, "zq-userinfo"),
    ("URI query password", {"db": "sqlite:///x.db?user=alice&password=zq-query"}, "zq-query"),
    ("postgres query password", {"pg": "postgresql://h/db?password=zq-pgpassword&sslmode=require"}, "zq-pgpassword"),
    ("postgres query sslpassword", {"pg_ssl": "postgresql://h/db?sslmode=require&sslpassword=zq-sslpassword"}, "zq-sslpassword"),
    ("URI fragment access_token", {"callback": "https://h.example.com/cb#access_token=zq-fragment&state=1"}, "zq-fragment"),
    ("a dict under credentials", {"credentials": {"user": "alice", "pass": "zq-credentials"}}, "zq-credentials"),
    ("a dict under creds", {"creds": {"key": "zq-creds"}}, "zq-creds"),
    ("camelCase acronym HFToken", {"HFToken": "zq-hftoken"}, "zq-hftoken"),
    ("camelCase acronym AWSSecretKey", {"AWSSecretKey": "zq-awssecret"}, "zq-awssecret"),
    ("camelCase acronym xAPIKey", {"xAPIKey": "zq-xapikey"}, "zq-xapikey"),
    ("run together dbpassword", {"dbpassword": "zq-dbpassword"}, "zq-dbpassword"),
    ("run together mytoken", {"mytoken": "zq-mytoken"}, "zq-mytoken"),
    ("with a digit password2", {"password2": "zq-password2"}, "zq-password2"),
    ("Authorization", {"Authorization": "Bearer zq-authorization"}, "zq-authorization"),
    ("bearer", {"bearer": "zq-bearer"}, "zq-bearer"),
    ("pwd", {"pwd": "zq-pwd"}, "zq-pwd"),
    ("passphrase", {"passphrase": "zq-passphrase"}, "zq-passphrase"),
    ("session cookie", {"sessionCookie": "zq-cookie"}, "zq-cookie"),
    (
        "AccountKey= in a connection string",
        {"conn": "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=zq-accountkey==;EndpointSuffix=core.windows.net"},
        "zq-accountkey",
    ),
    ("NAME_TOKEN= in a list", {"env": ["HF_TOKEN=zq-envtoken", "OMP_NUM_THREADS=1"]}, "zq-envtoken"),
    ("Authorization: Bearer in a list", {"headers": ["Accept: */*", "Authorization: Bearer zq-header"]}, "zq-header"),
    ("bearer TOKEN in a text", {"note": "sent as bearer zq-bearertext"}, "zq-bearertext"),
]
# forms that are not a hook's arguments: how they are given is in the test
COMMAND_FORMS = [
    ("--se (an abbreviation of --set) into W&B's command line", "zq-se-abbrev"),
    ("a resume's '--set changed' line", "zq-resume-changed"),
    ("MLflow's ?token= in its unreachable-server error line", "zq-mlflow-token"),
]
STUDY_FORMS = [
    ("the study file's storage URL, as stored", "zq-study-storage"),
    ("a trial's --set overrides, as stored", "zq-trial-override"),
    ("study status --storage URL", "zq-status-url"),
    ("study report --storage URL (report.md, report.json)", "zq-report-url"),
    ("a --storage URL that cannot be opened, in its error line", "zq-storage-error"),
]

CREDS_HOOK = '''
import json

from largebatch.engine.hook import Hook


class Creds(Hook):
    """Takes any argument; writes what it got to ``out`` (outside the run directory) and
    shows its connection string as a text metric."""

    def __init__(self, out: str = "", **given):
        super().__init__()
        self.out, self.given = out, given

    def before_run(self, state):
        if self.out and state.run.is_main:
            with open(self.out, "w") as handle:
                json.dump(self.given, handle)

    def after_step(self, state):
        state.current.metrics["creds/note"] = "connecting with " + self.given.get("conn", "")
'''


def hook_arguments() -> dict:
    return {name: value for _, fragment, _ in HOOK_FORMS for name, value in fragment.items()}


def leaks(places: dict[str, bytes], forms: list[tuple[str, str]]) -> dict[str, list[str]]:
    """{form: [places holding its secret]} for each form whose secret is seen somewhere."""
    found = {form: [where for where, data in places.items() if secret.encode() in data] for form, secret in forms}
    return {form: where for form, where in found.items() if where}


def files_under(folder: pathlib.Path, skip: tuple[pathlib.Path, ...] = ()) -> dict[str, bytes]:
    """Every file under ``folder`` (but ``skip``), as raw bytes, by its path there."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p not in skip}


def invoke(argv: list[str]) -> int:
    try:
        return train_main(argv)
    except SystemExit as exc:  # argparse
        return exc.code if isinstance(exc.code, int) else 1


@pytest.mark.slow
def test_no_credential_form_reaches_a_file_a_tracker_or_the_console_of_a_run(tmp_path, monkeypatch, capfd):
    """The demo config for a few steps, a hook holding every form (given on the command line
    as ``--se hooks=...``), checkpoints, metrics.csv, TensorBoard and, where installed,
    MLflow's and W&B's offline stores; then resumed with a changed hook; then an MLflow
    server that cannot be reached, with a token in its URI."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    (tmp_path / "creds_hook.py").write_text(CREDS_HOOK)
    received = tmp_path / "received.json"
    given = {**hook_arguments(), "api_key": "zq-se-abbrev"}
    hooks = [{"type": f"{tmp_path / 'creds_hook.py'}:Creds", "out": str(received), **given}, "csv"]
    hooks += [{"type": "tensorboard"}] if find_spec("tensorboard") else []
    hooks += [{"type": "mlflow", "plots": False, "tags": {"HFToken": "zq-hftoken"}}] if find_spec("mlflow") else []
    hooks += [{"type": "wandb", "mode": "offline", "plots": False}] if find_spec("wandb") else []
    run_dir = tmp_path / "run"
    argv = ["train.py", "--config", str(REPO / "configs/demo/vit-tiny-synthetic.py"), "--run-dir", str(run_dir)]
    argv += ["--s", "max_steps=2", "--set", "checkpoint.at_end=true", "--set", "log.console=true", "--se", "hooks=" + json.dumps(hooks)]
    monkeypatch.setattr(sys, "argv", argv)  # W&B records the command line
    assert invoke(argv[1:]) == 0
    assert json.loads(received.read_text()) == given  # the hook got the real values
    assert list((run_dir / "checkpoints").glob("step-*.pt"))

    # a requeue with a hook argument changed: the resume line shows the change, redacted
    changed = [{**hooks[0], "note": hooks[0]["note"] + " again", "HFToken": "zq-resume-changed"}, *hooks[1:]]
    argv_resumed = [*argv, "--resume", "auto", "--set", "max_steps=3", "--se", "hooks=" + json.dumps(changed)]
    monkeypatch.setattr(sys, "argv", argv_resumed)
    assert invoke(argv_resumed[1:]) == 0
    console = capfd.readouterr()

    # a tracker that cannot start: its error line
    unreachable = [{"type": "mlflow", "tracking_uri": "http://127.0.0.1:9/?token=zq-mlflow-token"}] if find_spec("mlflow") else []
    other = tmp_path / "unreachable"
    argv_failing = [*argv[:4], str(other), "--set", "max_steps=1", "--set", "hooks=" + json.dumps(unreachable)]
    status = invoke(argv_failing[1:])
    failing = capfd.readouterr()
    assert status == (2 if unreachable else 0)

    places = {"console": (console.out + console.err + failing.out + failing.err).encode()}
    places |= files_under(run_dir) | (files_under(other) if other.is_dir() else {})
    forms = [(form, secret) for form, _, secret in HOOK_FORMS] + COMMAND_FORMS
    assert leaks(places, forms) == {}
    assert "--set changed" in console.out and "max_steps (2 -> 3)" in console.out
    if unreachable:
        assert "the mlflow hook cannot start" in failing.err and "?token=<redacted>" in failing.err, failing.err
    if find_spec("wandb"):
        recorded = [data for where, data in places.items() if where.endswith(".wandb")]  # the offline run's record
        assert recorded and all(b"--se" in data and b"<redacted>" in data for data in recorded)  # the command line, redacted


@pytest.mark.slow
def test_no_credential_form_reaches_a_studys_storage_report_or_output(tmp_path):
    """A study whose storage URL (in the study file) has a password and whose base config's
    hook holds every form: the SQLite storage (the study file and each trial's overrides as
    stored), the trials' run directories and the report hold none of them, nor do the
    commands' output and error lines when the storage URL is given with --storage."""
    folder = tmp_path / "study"
    folder.mkdir()
    (tmp_path / "creds_hook.py").write_text(CREDS_HOOK)
    base = tiny_base()
    base["hooks"] = [{"type": f"{tmp_path / 'creds_hook.py'}:Creds", **hook_arguments(), "api_key": "zq-trial-override"}]
    storage = f"sqlite:///{folder / 'study.db'}"
    write_study(
        folder,
        base=base,
        optimizers={"lamb": {}},
        batches=[16],
        trials=1,
        seeds=[1],
        storage=f"{storage}?user=alice&password=zq-study-storage",
    )
    ran = study_cli("run", "study.yaml", "--max-trials", "1", cwd=folder)
    assert ran.returncode in (0, 1), ran.stderr[-3000:]
    status = study_cli("status", "study.yaml", "--storage", f"{storage}?password=zq-status-url", cwd=folder)
    report = study_cli("report", "study.yaml", "--storage", f"{storage}?password=zq-report-url", "--out", "again", cwd=folder)
    unopened = study_cli("status", "study.yaml", "--storage", "postgresql://127.0.0.1:9/db?password=zq-storage-error", cwd=folder)
    assert (status.returncode, report.returncode, unopened.returncode) == (0, 0, 2), status.stderr + report.stderr

    outputs = "".join(r.stdout + r.stderr for r in (ran, status, report, unopened))
    places = {"output": outputs.encode()} | files_under(folder, skip=(folder / "study.yaml", folder / "base.yaml"))
    forms = [(form, secret) for form, _, secret in HOOK_FORMS] + STUDY_FORMS
    assert leaks(places, forms) == {}
    import optuna

    stored = optuna.load_study(study_name="study", storage=storage)
    (trial,) = [t for t in stored.get_trials() if "overrides" in t.user_attrs]  # the one trial run
    assert any("<redacted>" in s for s in trial.user_attrs["overrides"])  # stored, redacted
    assert "password=<redacted>" in stored.user_attrs["study_file"]
    assert "?password=<redacted>" in status.stdout and "?password=<redacted>" in (folder / "again" / "report.md").read_text()
    assert "error:" in unopened.stderr and "?password=<redacted>" in unopened.stderr, unopened.stderr


def test_the_forms_are_tested_each_with_its_own_secret():
    secrets = [s for _, _, s in HOOK_FORMS] + [s for _, s in COMMAND_FORMS + STUDY_FORMS]
    assert len(secrets) >= 24 and len(set(secrets)) == len(secrets)
    assert all(s in json.dumps(fragment) for _, fragment, s in HOOK_FORMS)
