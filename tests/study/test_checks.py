"""Before the first trial: budgets a pilot fit says are too short are named, and a storage
records the study's fingerprint and threads per trial and refuses another count."""

from __future__ import annotations

import re
import shutil

import pytest

from largebatch.errors import UserError
from largebatch.study import checks
from largebatch.study.spec import load_study
from largebatch.study.storage import create_or_load, open_storage
from tests.conftest import REPO
from tests.study.helpers import write_study
from tests.study.test_plan import decide, finish, memory_study, outcome


def test_a_longest_budget_under_twice_the_pilots_prediction_is_named_before_the_first_trial(tmp_path):
    """512 samples: 32 steps an epoch at batch 16, 16 at 32; epochs up to 3 give 96 and 48.
    LAMB's pilot (S_min 20, B_crit 16) predicts 40 and 30 steps: 48 < 2 x 30 at batch 32.
    AdamW has no pilot: its fit comes from its finished tuning trials, 60 steps at 16 and 50
    at 32 (S_min 40, B_crit 8), and both its budgets fall short of twice those."""
    spec = load_study(write_study(tmp_path / "s", pilot={"lamb": {"s_min": 20, "b_crit": 16}}))
    base = checks.prepare(spec)
    assert base.longest == {("lamb", 16): 96, ("lamb", 32): 48, ("adamw", 16): 96, ("adamw", 32): 48}
    lines = checks.budget_warnings(spec, base, [])
    assert lines == [
        "warning: lamb at batch 32: its longest budget is 48 steps, and the study file's pilot (S_min 20, B_crit 16) predicts "
        "30 steps to top1>=0.7, less than 2x; raise optimizers.lamb.search.epochs.high or search.epochs.high, or scale the epoch "
        "range by the pilot (epochs=dict(..., scale='pilot'))"
    ]
    study = memory_study()
    steps = {16: 60.0, 32: 50.0}
    finish(study, decide(spec, study)[0], lambda key: outcome(steps[int(key.split("/")[1][1:])]))
    lines = checks.budget_warnings(spec, base, study.get_trials())
    adamw = [line for line in lines if line.startswith("warning: adamw")]
    assert [line.split(":")[1] for line in adamw] == [" adamw at batch 16", " adamw at batch 32"]
    fitted = re.search(r"a fit to the study's finished trials \(S_min ([\d.]+), B_crit ([\d.]+)\) predicts 60 steps", adamw[0])
    assert fitted and [float(v) for v in fitted.groups()] == [pytest.approx(40, rel=1e-3), pytest.approx(8, rel=1e-3)], adamw[0]


def test_a_storage_records_the_thread_count_and_refuses_another(tmp_path):
    spec = load_study(write_study(tmp_path / "s"))
    study = memory_study()
    checks.bind(spec, study, "memory", 1)
    assert study.user_attrs["threads"] == 1 and study.user_attrs["fingerprint"] == checks.fingerprint(spec)
    checks.bind(spec, study, "memory", 1)  # the same count resumes
    with pytest.raises(UserError) as error:
        checks.bind(spec, study, "memory", 2)
    message = str(error.value)
    assert "run with 1 thread(s) per trial, and this run would use 2" in message and "resume with --threads 1" in message
    assert "\n" not in message


def test_the_shipped_study_keeps_the_fingerprint_its_storage_was_made_with(tmp_path):
    """Keys added since (targets, quasi_random, pilot, threads) leave a study file that does
    not use them with its old fingerprint; its storage, which records no thread count, resumes."""
    shutil.copy(REPO / "studies" / "fashion-mnist" / "study.db", tmp_path / "study.db")
    study = create_or_load(open_storage(f"sqlite:///{tmp_path / 'study.db'}"), "fashion-mnist")
    spec = load_study(REPO / "studies" / "fashion-mnist" / "study.py")
    assert study.user_attrs["fingerprint"] == checks.fingerprint(spec) and "threads" not in study.user_attrs
    checks.bind(spec, study, "copy", 4)
    assert "threads" not in study.user_attrs
