"""Storages: the claim of a waiting trial is atomic across processes (SQLite, journal
file), and a storage that cannot be opened is one sentence."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from largebatch.errors import UserError
from largebatch.study import ledger
from largebatch.study.storage import create_or_load, default_url, load_existing, open_storage
from tests.conftest import REPO, clean_env

CLAIMER = """
import json, sys, time
from largebatch.study import ledger
from largebatch.study.storage import create_or_load, open_storage
study = create_or_load(open_storage(sys.argv[1]), "race")
while time.time() < float(sys.argv[3]):  # start together
    time.sleep(0.005)
claimed = []
while (trial := ledger.claim(study)) is not None:
    claimed.append(trial.number)
print(json.dumps(claimed))
"""


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_workers_in_several_processes_never_claim_one_trial_twice(tmp_path, kind):
    import time

    url = default_url(tmp_path) if kind == "sqlite" else f"journal:{tmp_path / 'study.log'}"
    study = create_or_load(open_storage(url), "race")
    for i in range(40):
        ledger.enqueue(study, {"x": float(i)}, {"key": f"k{i}", "order": f"{i:04d}"})
    start = time.time() + 3.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, url, "race", str(start)], stdout=subprocess.PIPE, text=True, env=clean_env(), cwd=REPO
        )
        for _ in range(4)
    ]
    claims = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    every = [n for claimed in claims for n in claimed]
    assert sorted(every) == list(range(40)), claims  # each trial claimed exactly once
    assert sum(1 for claimed in claims if claimed) >= 2  # the workers really raced


def test_a_key_queued_twice_runs_once(tmp_path):
    study = create_or_load(open_storage(default_url(tmp_path)), "twice")
    for _ in range(2):
        ledger.enqueue(study, {"x": 1.0}, {"key": "lamb/b16/q0/s0", "order": "0"})
    first = ledger.claim(study)
    assert first.number == 0 and ledger.claim(study) is None
    dropped = study.get_trials(deepcopy=False)[1]
    assert dropped.state.name == "PRUNED" and dropped.user_attrs["duplicate_of"] == 0


def test_claims_follow_the_queue_order(tmp_path):
    study = create_or_load(open_storage(default_url(tmp_path)), "order")
    for key, order in (("tune", "1-0000"), ("seed", "0-0000"), ("later", "1-0001")):
        ledger.enqueue(study, {}, {"key": key, "order": order})
    assert [ledger.attrs(ledger.claim(study))["key"] for _ in range(3)] == ["seed", "tune", "later"]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://nobody@127.0.0.1:9/none", "cannot be opened"),
        ("sqlite:////no/such/folder/study.db", "the folder of SQLite file '/no/such/folder/study.db' does not exist"),
        ("journal:/no/such/folder/study.log", "the folder of journal file '/no/such/folder/study.log' does not exist"),
        ("notaurl", "cannot be opened"),
    ],
)
def test_a_storage_that_cannot_be_opened_is_one_sentence(url, expected):
    with pytest.raises(UserError) as error:
        open_storage(url)
    assert expected in str(error.value) and str(error.value).startswith("storage: ") and "\n" not in str(error.value)


def test_status_and_report_need_an_existing_study(tmp_path):
    storage = open_storage(default_url(tmp_path))
    with pytest.raises(UserError, match="has no study 'absent' .it holds no study.; run `largebatch study run` first"):
        load_existing(storage, "absent", "sqlite:///x")


def test_the_report_names_a_storage_url_without_its_credentials(tmp_path):
    import optuna

    from largebatch.study import report
    from largebatch.study.spec import load_study
    from tests.study.helpers import write_study

    spec = load_study(write_study(tmp_path))
    study = optuna.create_study(study_name=spec.name, storage=f"sqlite:///{tmp_path / 'other.db'}")
    assert (
        report.build(spec, study, "postgresql://alice:pw@db.example.com/studies")["storage"]
        == "postgresql://<redacted>@db.example.com/studies"
    )
