"""Which trials a study needs: the same scrambled Sobol points in every cell, then TPE's
points, deterministic for the storage's contents; the choice by fewest held-out steps per
target, re-runs once a cell is tuned, and what happens to failures."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from largebatch.study import ledger, plan
from largebatch.study.spec import load_study
from largebatch.study.storage import create_or_load
from tests.study.helpers import write_study


@pytest.fixture
def spec(tmp_path):
    return load_study(
        write_study(
            tmp_path / "s", search={"lr": {"low": 0.001, "high": 0.1, "scale": "sqrt"}, "one_minus_momentum": {"low": 0.01, "high": 0.3}}
        )
    )


def test_the_points_are_optunas_scrambled_sobol_sequence_and_stratified(spec):
    from scipy.stats import qmc

    points = plan.unit_points(spec)
    expected = qmc.Sobol(2, scramble=True, seed=spec.sampler_seed).random(4)[:3]
    assert np.allclose([[p["lr"], p["one_minus_momentum"]] for p in points], expected)
    eight = plan.unit_points(dataclasses.replace(spec, trials=8, quasi_random=8))
    for name in ("lr", "one_minus_momentum"):  # 8 points of a Sobol net: one in each eighth of every axis
        assert sorted(int(p[name] * 8) for p in eight) == list(range(8))
    assert eight[:3] == points  # more trials extend the sequence


def memory_study():
    import optuna

    return create_or_load(optuna.storages.InMemoryStorage(), "s")


def outcome(steps=None, final=0.5, key="top1>=0.7"):
    """A finished trial's outcome: crossing ``key`` at ``steps`` (None: not reached), or at
    each target's steps with ``steps`` a dict by key."""
    by_key = steps if isinstance(steps, dict) else {key: steps}
    crossings = {
        k: {split: None if v is None else {"steps": v, "lo": int(v) - 1, "hi": int(v) + 1} for split in ("eval", "test")}
        for k, v in by_key.items()
    }
    return {"crossings": crossings, "final_eval": final, "total_steps": 100, "stopped": "target"}


def finish(study, wanted, results):
    """Queue ``wanted``, claim each and complete it with ``results[key]`` (an outcome dict, or an
    ('error'|'killed', text) failure)."""
    for item in wanted:
        ledger.enqueue(study, item.params, item.attrs)
    while (trial := ledger.claim(study)) is not None:
        import optuna

        t = optuna.trial.Trial(study, trial._trial_id)
        for name, value in trial.system_attrs["fixed_params"].items():
            t.suggest_float(name, value, value + 1)
        result = results(ledger.attrs(trial)["key"])
        if isinstance(result, tuple):
            ledger.fail(study, trial._trial_id, *result)
        else:
            ledger.complete(study, trial._trial_id, 0.0, result)


def decide(spec, study, **policy):
    trials = study.get_trials(deepcopy=False)
    return plan.decide(spec, trials, ledger.skipped(study), policy.get("retry", False), policy.get("skip", False), plan.unit_points(spec))


def test_every_cell_is_tuned_at_the_same_points_then_its_choice_is_rerun_with_each_seed(spec):
    study = memory_study()
    wanted, skips, blocked = decide(spec, study)
    assert len(wanted) == 12 and not skips and not blocked
    assert [w.attrs["key"] for w in wanted[:4]] == ["lamb/b16/q0/s0", "lamb/b16/q1/s0", "lamb/b16/q2/s0", "lamb/b32/q0/s0"]
    assert sorted(w.attrs["order"] for w in wanted)[:4] == ["1-0000-0000", "1-0000-0001", "1-0000-0002", "1-0000-0003"]  # slot by slot
    q0 = {w.attrs["batch"]: w.params["lr"] for w in wanted if w.attrs.get("slot") == 0 and w.attrs["optimizer"] == "lamb"}
    assert q0[32] == pytest.approx(q0[16] * 2**0.5, rel=1e-5)  # the same point, the range scaled by sqrt(2)

    steps = {"q0": 40.0, "q1": None, "q2": 30.0}  # q2 reaches the target first
    finish(study, wanted, lambda key: outcome(steps[key.split("/")[2]], final=0.6))
    again, _, _ = decide(spec, study)
    assert len(again) == 8 and all(w.attrs["phase"] == ledger.SEED for w in again)
    assert sorted(w.attrs["key"] for w in again if w.attrs["optimizer"] == "lamb") == [
        f"lamb/b{b}/q2/s{s}" for b in (16, 32) for s in (1, 2)
    ]  # a re-run's key names the point it repeats and its seed
    params = {t.user_attrs["key"]: t.params for t in study.get_trials()}
    assert all(w.params == params[w.attrs["key"].rsplit("/", 1)[0] + "/s0"] for w in again)
    assert all(w.attrs["order"].startswith("0-") for w in again)  # re-runs go first
    finish(study, again, lambda key: outcome(25.0))
    assert decide(spec, study)[0] == []  # done


def test_without_a_trial_at_the_target_the_best_held_out_value_is_chosen(spec):
    study = memory_study()
    finals = {"q0": 0.4, "q1": 0.65, "q2": 0.5}
    finish(study, decide(spec, study)[0], lambda key: outcome(None, final=finals[key.split("/")[2]]))
    cell = plan.cells(spec, study.get_trials())[("lamb", 16)]
    best = plan.best([t for ts in cell.tune.values() for t in ts], spec.target)
    assert best.user_attrs["key"] == "lamb/b16/q1/s0"
    assert plan.cap([t for ts in cell.tune.values() for t in ts], spec.target) is None  # nothing reached: no cut


def test_a_failed_trial_holds_its_cell_back_until_the_user_chooses(spec):
    study = memory_study()
    finish(study, decide(spec, study)[0], lambda key: ("error", "boom") if key == "lamb/b16/q1/s0" else outcome(20.0))
    wanted, skips, blocked = decide(spec, study)
    assert blocked == [("lamb/b16/q1/s0", "boom")] and not skips
    assert not any(w.attrs["key"].startswith("lamb/b16/") for w in wanted)  # the cell waits
    retried = [w for w in decide(spec, study, retry=True)[0] if w.attrs["key"] == "lamb/b16/q1/s0"]
    assert len(retried) == 1 and retried[0].attrs["attempt"] == 2
    _, skips, blocked = decide(spec, study, skip=True)
    assert skips == ["lamb/b16/q1/s0"] and not blocked
    ledger.skip(study, "lamb/b16/q1/s0")
    assert any(w.attrs["key"] == "lamb/b16/q0/s1" for w in decide(spec, study)[0])  # the cell goes on without it
    retry = [w.attrs["key"] for w in decide(spec, study, retry=True)[0] if w.attrs["key"].startswith("lamb/b16/")]
    assert retry == ["lamb/b16/q1/s0"]  # run again, and the re-runs wait for it


def test_a_killed_trial_is_run_again_up_to_max_retries(spec):
    study = memory_study()
    key = "lamb/b16/q0/s0"
    finish(study, decide(spec, study)[0], lambda k: ("killed", "killed: gone") if k == key else outcome(20.0))
    for attempt in (2, 3):  # max_retries is 2
        wanted, _, blocked = decide(spec, study)
        assert [w.attrs["attempt"] for w in wanted if w.attrs["key"] == key] == [attempt] and not blocked
        finish(study, [w for w in wanted if w.attrs["key"] == key], lambda k: ("killed", "killed: gone"))
    assert decide(spec, study)[2] == [(key, "killed: gone")]


def tuned(spec, study, steps, reverse=False):
    """Queue what ``decide`` wants and finish it with ``steps[key]`` held-out steps (``reverse``:
    queue and finish in the opposite order, as other workers' timing would)."""
    wanted = decide(spec, study)[0]
    for item in reversed(wanted) if reverse else wanted:
        ledger.enqueue(study, item.params, item.attrs)
    claimed = []
    while (trial := ledger.claim(study)) is not None:
        claimed.append(trial)
    for trial in reversed(claimed) if reverse else claimed:
        import optuna

        t = optuna.trial.Trial(study, trial._trial_id)
        for name, value in trial.system_attrs["fixed_params"].items():
            t.suggest_float(name, value, value + 1)
        ledger.complete(study, trial._trial_id, 0.0, outcome(steps(ledger.attrs(trial)["key"])))
    return wanted


@pytest.fixture
def sequential(tmp_path):
    return load_study(write_study(tmp_path / "q", trials=5, quasi_random=3))


def held_out_steps(key):
    """Held-out steps to the target by Sobol point; TPE's points reach it at 35."""
    return {"q0": 40.0, "q1": None, "q2": 30.0}.get(key.split("/")[2], 35.0)


def test_after_the_sobol_points_tpe_proposes_one_point_at_a_time_the_same_for_the_same_finished_trials(sequential):
    """Two storages holding the same finished trials, finished in opposite orders, propose
    the same next point in every cell; it names its unit-cube point, and a re-queued
    (killed) key gets it again."""
    first, second = memory_study(), memory_study()
    assert len(tuned(sequential, first, held_out_steps)) == 12  # 3 Sobol points x 4 cells
    tuned(sequential, second, held_out_steps, reverse=True)
    proposed = [decide(sequential, study)[0] for study in (first, second)]
    assert [w.attrs["key"] for w in proposed[0]] == [f"{o}/b{b}/q3/s0" for o in ("lamb", "adamw") for b in (16, 32)]  # one per cell
    assert [(w.params, w.attrs["unit"]) for w in proposed[0]] == [(w.params, w.attrs["unit"]) for w in proposed[1]]
    sobol = plan.unit_points(sequential)
    assert all(0 <= u < 1 for w in proposed[0] for u in w.attrs["unit"].values()) and proposed[0][0].attrs["unit"] not in sobol

    finish(first, proposed[0], lambda key: ("killed", "killed: gone") if key == "lamb/b16/q3/s0" else outcome(35.0))
    again = [w for w in decide(sequential, first)[0] if w.attrs["key"].startswith("lamb/b16/")]
    assert [(w.attrs["key"], w.attrs["attempt"], w.params) for w in again] == [("lamb/b16/q3/s0", 2, proposed[0][0].params)]
    later = {w.attrs["key"]: w for w in decide(sequential, first)[0]}
    assert "lamb/b32/q4/s0" in later and later["lamb/b32/q4/s0"].attrs["unit"] != proposed[0][1].attrs["unit"]  # slot 4 after slot 3


def test_the_sequential_point_follows_the_finished_trials_results(sequential):
    """The same points with other results give another proposal: TPE reads the ranking."""
    study, other = memory_study(), memory_study()
    tuned(sequential, study, held_out_steps)
    tuned(sequential, other, lambda key: {"q0": 30.0, "q1": 40.0, "q2": None}[key.split("/")[2]])
    assert decide(sequential, study)[0][0].attrs["unit"] != decide(sequential, other)[0][0].attrs["unit"]


def test_each_target_has_its_own_choice_and_the_choices_share_their_reruns(tmp_path):
    spec = load_study(write_study(tmp_path, target=None, targets=[{"metric": "top1", "value": 0.7}, {"metric": "top1", "value": 0.6}]))
    assert [t.key for t in spec.targets] == ["top1>=0.6", "top1>=0.7"] and spec.target.key == "top1>=0.7"
    study = memory_study()
    steps = {"q0": {"top1>=0.6": 10.0, "top1>=0.7": 50.0}, "q1": {"top1>=0.6": 20.0, "top1>=0.7": 30.0}, "q2": {"top1>=0.6": None}}
    slow = {"top1>=0.6": 25.0, "top1>=0.7": None}  # at batch 32 one point is first to both targets
    finish(study, decide(spec, study)[0], lambda key: outcome(steps[key.split("/")[2]] if "b16" in key or "q1" in key else slow))
    reruns = sorted(w.attrs["key"] for w in decide(spec, study)[0] if w.attrs["optimizer"] == "lamb")
    assert reruns == [f"lamb/b16/q{q}/s{s}" for q in (0, 1) for s in (1, 2)] + [f"lamb/b32/q1/s{s}" for s in (1, 2)]
