"""The table of runs read from a study's trials: the shipped Fashion-MNIST storage as the
reference (its stored crossings and the choices its re-runs were made for)."""

from __future__ import annotations

import copy
import dataclasses
import math
import shutil

import pytest

from largebatch.study import analysis, ledger, plan, statistics
from largebatch.study.spec import load_study
from largebatch.study.target import crossing_of
from tests.conftest import REPO

SHIPPED = REPO / "studies" / "fashion-mnist"


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    folder = tmp_path_factory.mktemp("study")
    shutil.copy(SHIPPED / "study.db", folder / "study.db")
    spec = load_study(SHIPPED / "study.py")
    study = optuna.load_study(study_name=spec.name, storage=f"sqlite:///{folder / 'study.db'}")
    return spec, study.get_trials(deepcopy=False)


def test_the_table_holds_every_finished_trial_with_the_crossings_it_recorded(shipped):
    spec, trials = shipped
    table = {r.number: r for r in analysis.runs(spec, trials)}
    assert len(table) == 198
    for trial in trials:
        run, outcome = table[trial.number], ledger.attrs(trial)["outcome"]
        heldout, test = crossing_of(trial, spec.target), crossing_of(trial, spec.target, "test")
        assert run.heldout_steps == (None if heldout is None else pytest.approx(heldout.steps))
        if run.rerun:
            assert run.steps == (None if test is None else pytest.approx(test.steps))
        if run.steps is None:  # censored where it stopped, or at its whole budget
            assert run.budget == outcome["steps_run"] or outcome["stopped"] == "diverged"


def test_each_cells_choice_is_the_one_its_reruns_were_made_for(shipped):
    spec, trials = shipped
    cells, found = analysis.collect(spec, trials, set(), samples=0)
    for (label, batch), cell in plan.cells(spec, trials).items():
        chosen = plan.best([t for ts in cell.tune.values() for t in ts], spec.target)
        result = next(c for c in cells if (c.optimizer, c.batch) == (label, batch))
        assert result.best["number"] == chosen.number
        assert len(result.stats.reruns) == 3 and {r.point for r in result.stats.reruns} == {ledger.attrs(chosen)["slot"]}
    assert found.resolution.samples == 10_000  # the test split of Fashion-MNIST


def test_b_simple_comes_with_the_held_out_loss_it_was_read_at(shipped):
    """The loss B_simple was read at is the recorded evaluation's, at or below the study's
    fixed loss, and the report states their range (the first study: 0.535 to 0.647)."""
    spec, trials = shipped
    table = analysis.runs(spec, trials)
    runs = [r for r in table if r.b_simple is not None]
    assert len(runs) >= 30
    fixed = spec.noise_scale["at_eval_loss"]
    for run in runs:
        outcome = ledger.attrs(next(t for t in trials if t.number == run.number))["outcome"]
        step = outcome["noise_at_loss"]["step"]
        assert run.b_simple_loss == next(p[3] for p in outcome["curve"] if p[0] == step)
        assert run.b_simple_loss <= fixed
    losses = [r.b_simple_loss for r in runs]
    assert min(losses) < 0.55 < fixed - 0.01 < max(losses)  # read well below 0.65 in some runs
    lamb = next(o for o in statistics.findings(table, spec.target.value, samples=0).optimizers if o.optimizer == "lamb")
    read = [r.b_simple_loss for r in runs if r.optimizer == "lamb" and r.rerun]
    assert lamb.b_simple_losses == (min(read), max(read)) == (pytest.approx(0.535, abs=5e-4), pytest.approx(0.641, abs=5e-4))


@pytest.mark.parametrize("step", [math.inf, math.nan, "300", [300], None])
def test_a_storage_whose_b_simple_step_is_not_a_number_reads_no_loss_and_raises_nothing(shipped, step):
    """The step B_simple was read at comes from the storage, which may come from someone
    else: a value that is no step of the curve gives no loss (the estimate itself stays)."""
    spec, trials = shipped
    trial = copy.deepcopy(next(t for t in trials if (ledger.attrs(t)["outcome"].get("noise_at_loss") or {}).get("step")))
    trial.user_attrs["outcome"]["noise_at_loss"]["step"] = step
    (run,) = [r for r in analysis.runs(spec, [trial]) if r.number == trial.number]
    assert run.b_simple is not None and run.b_simple_loss is None


def test_another_target_is_read_from_the_same_trials(shipped):
    """A higher target on the same metric: no run reaches it earlier than the shipped one,
    and runs that reached 0.78 but not 0.80 are censored where they stopped."""
    spec, trials = shipped
    low = {r.number: r for r in analysis.runs(spec, trials)}
    high = analysis.runs(spec, trials, dataclasses.replace(spec.target, value=0.80))
    assert sum(r.steps is not None for r in high) < sum(r.steps is not None for r in low.values())
    for run in high:
        before = low[run.number]
        assert run.steps is None or (before.steps is not None and run.steps >= before.steps)
        assert run.budget == before.budget
    assert isinstance(statistics.findings(high, 0.80, samples=0), statistics.Findings)
    with pytest.raises(ValueError, match="top1"):
        analysis.runs(spec, trials, dataclasses.replace(spec.target, metric="top5"))
