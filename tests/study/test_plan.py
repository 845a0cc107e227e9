"""Which trials a study needs: the same scrambled Sobol points in every cell, the choice by
fewest held-out steps, re-runs once a cell is tuned, and what happens to failures."""

from __future__ import annotations

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
    eight = plan.unit_points(type(spec)(**{**spec.__dict__, "trials": 8}))
    for name in ("lr", "one_minus_momentum"):  # 8 points of a Sobol net: one in each eighth of every axis
        assert sorted(int(p[name] * 8) for p in eight) == list(range(8))
    assert eight[:3] == points  # more trials extend the sequence


def memory_study():
    import optuna

    return create_or_load(optuna.storages.InMemoryStorage(), "s")


def outcome(steps=None, final=0.5):
    crossing = None if steps is None else {"steps": steps, "lo": int(steps) - 1, "hi": int(steps) + 1}
    return {"eval_crossing": crossing, "test_crossing": crossing, "final_eval": final, "total_steps": 100, "stopped": "target"}


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
            ledger.complete(study, trial._trial_id, (result["eval_crossing"] or {"steps": float("inf")})["steps"], result)


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
    best = plan.best([t for ts in cell.tune.values() for t in ts], "max")
    assert best.user_attrs["key"] == "lamb/b16/q1/s0"
    assert plan.cap([t for ts in cell.tune.values() for t in ts], "max") is None  # nothing reached: no cut


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
