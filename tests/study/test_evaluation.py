"""The trial hook on real (tiny, synthetic) runs: evaluations sparse far from the target and
dense near it, the stop at the target, the stop of a beaten trial, the budget, divergence,
and a test split evaluated beside the held-out one."""

from __future__ import annotations

import json
import math
import types

import pytest

from largebatch.launch import TrainArgs, train
from largebatch.study.evaluation import OUTCOME, TargetEvalHook, next_eval_step
from largebatch.study.target import first_crossing
from tests.conftest import hooks_override, tiny_config, write_config
from tests.study.helpers import tiny_base

HOOK = "largebatch.study.evaluation:TargetEvalHook"


def run(tmp_path, *, overrides=(), **hook):
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = write_config(tmp_path, tiny_base())
    hook = {"type": HOOK, "metric": "top1", "targets": 0.7, "coarse": 1.5, "fine": 1.1, "dense_within": 0.2, "first_fraction": 0.05, **hook}
    sets = ["epochs=4", "eval.interval_epochs=0", "optimizer.lr=0.002", hooks_override(hook), *overrides]
    train(TrainArgs(str(config), sets, str(tmp_path / "run"), None, False))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/top1" in r]
    return evals, json.loads((tmp_path / "run" / OUTCOME).read_text())


def test_without_refining_the_grid_is_coarse_far_from_the_target_fine_near_it_and_the_run_stops_there(
    tmp_path, preemption_handlers_restored
):
    evals, outcome = run(tmp_path, targets=0.9, refine=False)
    steps = [r["step"] for r in evals]
    values = [r["eval/top1"] for r in evals]
    assert steps[0] == math.ceil(outcome["total_steps"] * 0.05)
    for (s0, v0), s1 in zip(zip(steps, values, strict=True), steps[1:], strict=False):
        ratio = 1.1 if 0.9 - v0 <= 0.2 else 1.5  # the value at an evaluation decides the next spacing...
        predicted = s1 == next_eval_step(s0, ratio)
        assert predicted or s1 == next_eval_step(s0, 1.1), (s0, v0, s1)  # ...or the line through the last two does
    assert values[-1] >= 0.9 and all(v < 0.9 for v in values[:-1])  # stopped at the first evaluation at the target
    assert outcome["stopped"] == "target" and outcome["steps_run"] == steps[-1] < outcome["total_steps"]
    crossing = first_crossing(zip(steps, values, strict=True), 0.9, "max")
    assert crossing.hi == steps[-1] and crossing.lo == steps[-2]
    assert outcome["cpu_seconds"] > 0 and outcome["refined"] == []


@pytest.mark.slow  # two trainings, one evaluated at every step
def test_refining_evaluates_every_weight_snapshot_kept_between_two_coarse_evaluations(tmp_path, preemption_handlers_restored):
    """Coarse evaluations only in the run's metrics; around the crossing, every weight
    snapshot kept on the fine grid is evaluated, and each of those values is what an
    evaluation at that step of the same run gives (the reference evaluates every step)."""
    target = 0.9
    evals, outcome = run(tmp_path / "refined", targets=target, coarse=2.0, fine=1.1)
    steps = [r["step"] for r in evals]
    assert all(s1 == next_eval_step(s0, 2.0) for s0, s1 in zip(steps, steps[1:], strict=False))  # no dense grid
    assert evals[-1]["eval/top1"] >= target > evals[-2]["eval/top1"] and outcome["stopped"] == "target"
    refined = {row[0]: row[1] for row in outcome["refined"]}
    kept, step = [], next_eval_step(steps[-2], 1.1)
    while step < steps[-1]:
        kept.append(step)
        step = next_eval_step(step, 1.1)
    assert sorted(refined) == kept  # the fine grid between the two coarse evaluations, every step of it

    every, _ = run(
        tmp_path / "every",
        targets=2.0,
        refine=False,
        coarse=1.01,
        fine=1.01,
        first_fraction=0.01,
        overrides=["max_steps=" + str(steps[-1])],
    )
    truth = {r["step"]: r["eval/top1"] for r in every}
    assert all(value == pytest.approx(truth[step], abs=1e-6) for step, value in refined.items())
    curve = sorted([(r["step"], r["eval/top1"]) for r in evals] + list(refined.items()))
    crossing = first_crossing(curve, target, "max")
    assert truth[crossing.lo] < target <= truth[crossing.hi] and crossing.hi <= next_eval_step(crossing.lo, 1.1)


class ScriptedCurve(TargetEvalHook):
    """The hook with its evaluation of a kept snapshot replaced by a curve given in advance
    (the selection of snapshots is what is tested, not the model)."""

    def __init__(self, curve, **kwargs):
        super().__init__(metric="top1", **kwargs)
        self.curve = curve

    def _evaluate_kept(self, state, step):
        self.refined[step] = [self.curve[step], None, None]
        return self.refined[step]


def test_the_first_crossing_is_found_on_a_curve_that_dips_between_two_evaluations():
    """Coarse evaluations at 100 (below 0.78) and 140 (above); the snapshots kept in between
    cross at 104, dip below at 108 to 125, and cross again at 130. The first crossing is at
    104; a bisection over the kept steps (which assumes a rising curve) finds 130."""
    kept = [104, 108, 112, 117, 121, 125, 130, 135]
    curve = dict.fromkeys(kept, 0.77) | {104: 0.785, 130: 0.79, 135: 0.8}
    hook = ScriptedCurve(curve, targets=[0.78], coarse=1.4, fine=1.04)
    hook._snapshots = [(step, {}) for step in kept]
    hook.previous["eval"] = (100, 0.75)
    state = types.SimpleNamespace(step=140, eval_metrics={"eval/top1": 0.81}, request_stop=lambda reason: None)
    hook.after_eval(state)
    rows = sorted([(100, 0.75), (140, 0.81), *((step, values[0]) for step, values in hook.refined.items())])
    crossing = first_crossing(rows, 0.78, "max")
    assert (crossing.lo, crossing.hi) == (100, 104) and hook.stopped == "target"


def test_a_trial_that_cannot_beat_the_cells_best_stops_at_its_step(tmp_path, preemption_handlers_restored):
    evals, outcome = run(tmp_path, targets=0.99, dense_within=0.0, stop_after=9.5, refine=False)
    assert evals[-1]["step"] == 10 and evals[-1]["eval/top1"] < 0.99  # evaluated at ceil(9.5), then stopped
    assert outcome["stopped"] == "beaten" and outcome["steps_run"] == 10


def test_with_two_targets_a_trial_runs_to_the_last_and_is_cut_only_when_beaten_for_both(tmp_path, preemption_handlers_restored):
    """Reaching the first target does not stop the run; a step to beat for each target stops
    it once it is past the second's without reaching it, not at the first's."""
    evals, outcome = run(tmp_path / "both", targets=[0.5, 0.9], refine=False)
    values = [r["eval/top1"] for r in evals]
    assert any(v >= 0.5 for v in values[:-1]) and values[-1] >= 0.9 and outcome["stopped"] == "target"
    evals, outcome = run(tmp_path / "cut", targets=[0.3, 0.99], dense_within=0.0, stop_after=[4, 9.5], refine=False)
    assert evals[-1]["step"] == 10 and outcome["stopped"] == "beaten"  # reached 0.3, beaten for 0.99 at ceil(9.5)
    assert evals[0]["step"] <= 4 and evals[-1]["eval/top1"] >= 0.3


def test_an_unreached_target_runs_the_whole_budget(tmp_path, preemption_handlers_restored):
    evals, outcome = run(tmp_path, targets=0.99, dense_within=0.0, overrides=["epochs=1"])
    assert outcome["stopped"] == "budget" and outcome["steps_run"] == outcome["total_steps"] == evals[-1]["step"]


def test_a_loss_target_is_reached_from_above(tmp_path, preemption_handlers_restored):
    evals, outcome = run(tmp_path, metric="loss", targets=1.2, mode="min")
    assert outcome["stopped"] == "target" and evals[-1]["eval/loss"] <= 1.2 < evals[-2]["eval/loss"]


def test_a_diverging_trial_is_recorded_as_diverged(tmp_path, preemption_handlers_restored):
    with pytest.raises(Exception, match="diverging"):
        run(tmp_path, overrides=["optimizer.lr=1e12", "clip_grad_norm=null"])
    outcome = json.loads((tmp_path / "run" / OUTCOME).read_text())
    assert outcome["stopped"] == "diverged" and "non-finite" in outcome["diverged"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    from tests.data.conftest import write_unique_label_shards

    root = tmp_path_factory.mktemp("shards")
    write_unique_label_shards(
        root, {"train": 64, "heldout": 16, "validation": 24}, {"train": 2, "heldout": 1, "validation": 1}, label_offset=0
    )
    return root


def test_a_test_split_is_evaluated_beside_the_held_out_split_until_both_reach_the_target(tmp_path, shards, preemption_handlers_restored):
    cfg = tiny_config(
        **{
            "data.loader": "native",
            "data.root": str(shards),
            "data.eval_split": "heldout",
            "data.num_classes": 64,
            "data.num_workers": 0,
            "data.image_size": 16,
            "epochs": 2,
            "global_batch_size": 16,
            "micro_batch_size": 8,
        }
    )
    config = write_config(tmp_path, cfg)
    hook = {"type": HOOK, "metric": "loss", "targets": 100.0, "mode": "min", "test_split": "validation", "first_fraction": 0.5}
    train(TrainArgs(str(config), [hooks_override(hook)], str(tmp_path / "run"), None, False))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/loss" in r]
    assert len(evals) == 1 and {"test/loss", "test/top1"} <= set(evals[0]) and "test/samples" not in evals[0]
    assert json.loads((tmp_path / "run" / OUTCOME).read_text())["stopped"] == "target"


def test_next_eval_step_is_at_least_one_step_later():
    assert next_eval_step(10, 1.04) == 11 and next_eval_step(100, 1.04) == 104 and next_eval_step(100, 1.4) == 140
