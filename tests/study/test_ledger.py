"""Trials whose worker died are found and ended as killed; finished trials keep their outcome."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from largebatch.study import ledger
from largebatch.study.storage import create_or_load, default_url, open_storage


def running_study(tmp_path, count=1):
    study = create_or_load(open_storage(default_url(tmp_path)), "s")
    for i in range(count):
        ledger.enqueue(study, {}, {"key": f"k{i}", "order": str(i)})
    return study, [ledger.claim(study) for _ in range(count)]


def test_keys_name_the_cell_the_point_and_the_seed():
    assert ledger.trial_key("lamb", 256, 3, 0) == "lamb/b256/q3/s0"
    assert ledger.trial_key("sgd", 8192, 5, 2) == "sgd/b8192/q5/s2"


def test_a_trial_whose_worker_process_is_gone_is_ended_as_killed(tmp_path):
    study, (trial,) = running_study(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout
    study._storage.set_trial_user_attr(trial._trial_id, "worker", {"host": socket.gethostname(), "pid": int(dead)})
    assert ledger.fail_stale(study, stale_seconds=3600) == [trial.number]
    ended = study.get_trials()[0]
    assert ended.state.name == "FAIL" and ended.user_attrs["failure"] == "killed" and "is gone" in ended.user_attrs["error"]


def test_a_trial_without_a_recent_heartbeat_is_ended_and_a_live_one_is_not(tmp_path):
    study, (old, fresh) = running_study(tmp_path, count=2)
    for trial in (old, fresh):
        study._storage.set_trial_user_attr(trial._trial_id, "worker", {"host": "elsewhere", "pid": 1})
    study._storage.set_trial_user_attr(old._trial_id, "heartbeat", time.time() - 120)
    assert ledger.fail_stale(study, stale_seconds=60) == [old.number]
    states = [t.state.name for t in study.get_trials()]
    assert states == ["FAIL", "RUNNING"]
    own = study.get_trials()[1]  # this process's own trials are never taken for dead
    assert own.user_attrs["worker"]["pid"] == 1 and os.getpid() != 1


def test_a_trial_ended_by_its_worker_cannot_be_failed_by_another(tmp_path):
    study, (trial,) = running_study(tmp_path)
    ledger.complete(study, trial._trial_id, 12.5, {"stopped": "target"})
    assert ledger.fail(study, trial._trial_id, "killed", "late") is False
    done = study.get_trials()[0]
    assert done.state.name == "COMPLETE" and done.value == 12.5 and done.user_attrs["outcome"] == {"stopped": "target"}


def test_endings_tell_killed_trials_from_failed_ones_and_name_each_re_run(tmp_path):
    study, (killed, failed, waits) = running_study(tmp_path, count=3)
    ledger.fail(study, killed._trial_id, "killed", "killed: its worker is gone")
    ledger.fail(study, failed._trial_id, "error", "exit status 1: error: ...")
    ledger.fail(study, waits._trial_id, "killed", "killed: no heartbeat for 90 s")
    ledger.enqueue(study, {}, {"key": "k0", "order": "3"})  # k0 queued again, k2 not yet
    assert ledger.endings(study.get_trials()) == "1 failed, 2 killed: trial 0 k0 re-run as #3; trial 2 k2 not re-run"
    assert ledger.endings(study.get_trials(), shown=1) == "1 failed, 2 killed: trial 0 k0 re-run as #3; 1 more"
