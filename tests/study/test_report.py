"""The report of a study with two targets, from a storage whose trials cross each target
at steps drawn from known curves S = S_min (1 + B_crit / B): each target's fit recovers its
own curve, the summary lists both, and it says whether the B_crit intervals separate them."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from largebatch.study import ledger, report
from largebatch.study.spec import load_study
from largebatch.study.target import first_crossing
from tests.conftest import REPO
from tests.study.helpers import write_study
from tests.study.test_plan import decide, finish, memory_study

LOW, HIGH = "top1>=0.6", "top1>=0.7"
BATCHES = [16, 32, 64, 128]
# (S_min, B_crit) per optimizer and target: LAMB's critical batch grows 4x from the lower
# target to the higher, AdamW's stays where it is.
TRUTH = {("lamb", LOW): (100.0, 50.0), ("lamb", HIGH): (150.0, 200.0), ("adamw", LOW): (80.0, 60.0), ("adamw", HIGH): (120.0, 60.0)}
SEED = {1: math.exp(-0.05), 2: 1.0, 3: math.exp(0.05)}  # symmetric in log steps: the fit through each batch's mean is exact


def steps(optimizer: str, batch: int, target: str) -> float:
    s_min, b_crit = TRUTH[(optimizer, target)]
    return s_min * (1 + b_crit / batch)


def crossings(key: str) -> dict[str, float | None]:
    """Each target's crossing for a trial key: point q0 is the fastest to the lower target,
    q1 to the higher; the seeds of each target's choice cross it at the curve times SEED."""
    optimizer, cell, point, seed = key.split("/")
    batch, s = int(cell[1:]), int(seed[1:])
    low, high = steps(optimizer, batch, LOW), steps(optimizer, batch, HIGH)
    if s == 0:  # tuning, on the held-out split
        return {"q0": {LOW: 0.9 * low, HIGH: 1.5 * high}, "q1": {LOW: low, HIGH: 0.9 * high}, "q2": {LOW: 1.2 * low, HIGH: None}}[point]
    if point == "q0":
        return {LOW: low * SEED[s], HIGH: 2 * high}
    return {LOW: 1.1 * low * SEED[s], HIGH: high * SEED[s]}


def outcome(key: str) -> dict:
    """A trial's record: evaluations that reach each target value exactly at its crossing,
    then run on to three times the steps to the higher target."""
    at = crossings(key)
    optimizer, cell = key.split("/")[:2]
    total = 3 * steps(optimizer, int(cell[1:]), HIGH)
    points = [(1.0, 0.1), (at[LOW], 0.6), *([(at[HIGH], 0.7)] if at[HIGH] is not None else []), (total, 0.72 if at[HIGH] else 0.65)]
    curve = [[step, value, value, 1.0] for step, value in points]  # step, held-out, test, held-out loss
    recorded = {}
    for name, value in ((LOW, 0.6), (HIGH, 0.7)):
        crossing = first_crossing(((p[0], p[1]) for p in curve), value, "max")
        recorded[name] = {split: None if crossing is None else crossing.record() for split in ("eval", "test")}
    return {
        "curve": curve,
        "crossings": recorded,
        "final_eval": curve[-1][1],
        "total_steps": total,
        "steps_run": total,
        "stopped": "target",
    }


@pytest.fixture(scope="module")
def two_targets(tmp_path_factory):
    pytest.importorskip("optuna")
    folder = tmp_path_factory.mktemp("two")
    targets = [{"metric": "top1", "value": 0.7}, {"metric": "top1", "value": 0.6}]
    spec = load_study(write_study(folder, target=None, targets=targets, batches=BATCHES, seeds=[1, 2, 3]))
    study = memory_study()
    for _ in range(2):  # the tuning trials, then each target's choice with every seed
        finish(study, decide(spec, study)[0], outcome)
    assert decide(spec, study)[0] == []
    paths = report.write(spec, study, "sqlite:///elsewhere.db", folder, bootstrap_samples=200)
    return spec, study, folder, paths


def test_each_targets_fit_recovers_its_own_curve_from_its_own_choices_reruns(two_targets):
    spec, study, folder, _ = two_targets
    data = json.loads((folder / "report.json").read_text())
    assert "target" not in data and "cells" not in data  # every figure is per target
    assert [b["target"]["value"] for b in data["targets"]] == [0.6, 0.7]
    for block, (key, point) in zip(data["targets"], ((LOW, 0), (HIGH, 1)), strict=True):
        assert {(c["optimizer"], c["batch"]) for c in block["cells"]} == set(spec.cells())
        for cell in block["cells"]:
            chosen = {t.number: ledger.attrs(t) for t in study.get_trials()}[cell["best"]["number"]]
            assert chosen["slot"] == point and [r["seed"] for r in cell["reruns"]] == [1, 2, 3]  # this target's choice, re-run
            assert cell["steps_median"] == pytest.approx(steps(cell["optimizer"], cell["batch"], key))
        for o in block["optimizers"]:
            s_min, b_crit = TRUTH[(o["optimizer"], key)]
            assert o["fit"]["s_min"] == pytest.approx(s_min, rel=0.02) and o["fit"]["b_crit"] == pytest.approx(b_crit, rel=0.02)
            assert o["interval_95"]["b_crit"][0] <= b_crit <= o["interval_95"]["b_crit"][1]


def test_the_summary_lists_both_targets_and_claims_growth_only_where_the_intervals_separate(two_targets):
    spec, _, folder, _ = two_targets
    data = json.loads((folder / "report.json").read_text())
    summary = {o["optimizer"]: o for o in data["critical_batch_by_target"]}
    for label in ("lamb", "adamw"):
        rows = summary[label]["by_target"]
        assert [r["target"] for r in rows] == [LOW, HIGH]
        for row in rows:
            assert row["b_crit"] == pytest.approx(TRUTH[(label, row["target"])][1], rel=0.02)
            assert row["b20"] == pytest.approx(0.2 * row["b_crit"])
    (lamb,), (adamw,) = summary["lamb"]["b_crit_between_targets"], summary["adamw"]["b_crit_between_targets"]
    assert lamb["intervals_overlap"] is False and lamb["b_crit_ratio"] == pytest.approx(4.0, rel=0.04)
    assert adamw["intervals_overlap"] is True and adamw["b_crit_ratio"] == pytest.approx(1.0, rel=0.04)

    text = (folder / "report.md").read_text()
    assert text.startswith(f"# Study `{spec.name}`: steps to top1 >= 0.6 and 0.7\n")
    assert text.index("## Critical batch by target") < text.index("## Protocol") < text.index("## Target top1 >= 0.6")
    assert text.index("## Target top1 >= 0.6") < text.index("### Steps to top1 >= 0.6") < text.index("## Target top1 >= 0.7")
    for heading in ("### Critical batch", "### Leave one batch out", "### What the statistics separate", "### Each cell's choice"):
        assert text.count(heading + "\n") == 2, heading
    table = [line for line in text.splitlines() if line.startswith(("| lamb | top1", "| adamw | top1"))]
    assert [line.split(" | ")[1] for line in table] == ["top1 >= 0.6", "top1 >= 0.7"] * 2
    assert "- lamb, top1 >= 0.6 to 0.7: B_crit" in text and "the intervals do not overlap: B_crit grows 4" in text
    assert "- adamw, top1 >= 0.6 to 0.7: B_crit" in text and "the intervals overlap, so these trials do not separate" in text
    assert sorted(p.name for p in folder.glob("*.png")) == ["noise_scale.png", "steps_vs_batch.png", "steps_vs_samples.png"]


def test_status_shows_each_targets_reruns_and_steps(two_targets):
    spec, study, _, _ = two_targets
    text = report.status_text(spec, study, "memory")
    line = next(line for line in text.splitlines() if line.startswith("lamb/b16 "))
    low, high = steps("lamb", 16, LOW), steps("lamb", 16, HIGH)
    assert f"{LOW}: 3/3, {low:.0f} [{low * SEED[1]:.0f}, {low * SEED[3]:.0f}]" in line
    assert f"{HIGH}: 3/3, {high:.0f} [{high * SEED[1]:.0f}, {high * SEED[3]:.0f}]" in line


def test_the_protocol_says_how_each_cells_points_were_drawn_and_evaluated(two_targets):
    spec, _, folder, _ = two_targets
    text = (folder / "report.md").read_text()
    assert spec.quasi_random == spec.trials
    assert f"{spec.trials} trials, all at the first {spec.trials} points of a scrambled Sobol sequence" in text
    assert spec.evaluation["refine"] and "threads_per_trial" not in json.loads((folder / "report.json").read_text())
    # a storage without a recorded thread count comes from the version whose refining bisected
    assert f"the weights kept every {spec.evaluation['fine']}x steps between the two evaluations are evaluated by bisection" in text
    for name, every in (("fashion-mnist-16k", True), ("fashion-mnist", False)):  # the shipped studies: one of each
        shipped = (REPO / "studies" / name / "report.md").read_text()
        assert ("every copy of the weights kept every 1.04x steps between the two evaluations is evaluated" in shipped) is every
        assert ("evaluated by bisection" in shipped) is not every
    mixed = dataclasses.replace(spec, trials=16, quasi_random=8)
    assert report._sampling(mixed).startswith(
        "the first 8 at the first points of a scrambled Sobol sequence (Optuna's QMCSampler, seed "
    ) and "the other 8 proposed one at a time by Optuna's multivariate TPE" in report._sampling(mixed)
