"""Named recipes compared over seeds (a study's ``arms``): the section's checks, the rank
test against its known answers and SciPy's exact Mann-Whitney test, a crossing's samples
and seconds, and a tiny arms study run for real (one trial killed and resumed), its report
against the trials' own records and written again from the storage alone."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from largebatch.errors import UserError
from largebatch.study import statistics as study_statistics
from largebatch.study.spec import load_study
from largebatch.study.target import first_crossing
from tests.conftest import REPO
from tests.study.helpers import kill_worker_at_held_trial, study_cli, tiny_base, write_study

ONLY_ARMS = {key: None for key in ("optimizers", "batches", "search", "micro_batch_size", "noise_scale", "trials", "sampler_seed")}
TARGETS = [{"metric": "top1", "value": 0.6}, {"metric": "top1", "value": 0.7}]
ARMS = {"b16": {"set": ["global_batch_size=16"]}, "b64": {"set": ["global_batch_size=64", "optimizer.lr=0.02"]}}
SET = ["optimizer.type=lamb", "optimizer.lr=0.01", "micro_batch_size=8"]


def arms_study(folder, **changes):
    return write_study(folder, **{**ONLY_ARMS, "target": None, "targets": TARGETS, "set": SET, "arms": ARMS, **changes})


def test_a_study_of_arms_only_keeps_its_targets_and_evaluation_and_has_no_cells(tmp_path):
    spec = load_study(arms_study(tmp_path, arms={**ARMS, "b64": {**ARMS["b64"], "seeds": [4, 5, 6]}}))
    assert (spec.optimizers, spec.batches, spec.cells()) == ((), (), [])
    assert [t.key for t in spec.targets] == ["top1>=0.6", "top1>=0.7"] and spec.evaluation["fine"] == 1.1
    assert [(a.label, a.overrides, a.seeds) for a in spec.arms] == [
        ("b16", ("global_batch_size=16",), (1, 2)),  # the study's seeds
        ("b64", ("global_batch_size=64", "optimizer.lr=0.02"), (4, 5, 6)),  # its own
    ]
    with pytest.raises(UserError, match="give target = dict"):
        load_study(arms_study(tmp_path, targets=None))  # arms are measured against targets


@pytest.mark.parametrize(("key", "value"), [("noise_scale", {"at_eval_loss": 1.0}), ("trials", 3), ("pilot", {}), ("tune_seed", 7)])
def test_a_key_that_only_shapes_the_cells_is_refused_in_a_study_of_arms_only(tmp_path, key, value):
    with pytest.raises(UserError, match=f"{key}: has no effect in a study of arms only"):
        load_study(arms_study(tmp_path, **{key: value}))


@pytest.mark.parametrize(
    ("arms", "message"),
    [
        ({"b16": {"set": ["global_batch_size=16"]}}, "arms: must name at least two recipes"),
        ({**ARMS, "b32": {"set": ["global_batch_size"]}}, "arms.b32.set: each override is 'key.path=value'"),
        ({**ARMS, "b32": {"seeds": [1, 1]}}, "arms.b32.seeds: must be a list of distinct integer seeds"),
        ({**ARMS, "b32": {"sets": []}}, "arms.b32.sets: unknown key"),
        ({**ARMS, "b 32": {}}, "an arm's label is a plain name"),
    ],
)
def test_a_bad_arms_section_is_named(tmp_path, arms, message):
    with pytest.raises(UserError, match=message):
        load_study(arms_study(tmp_path, arms=arms))


def test_tune_seed_stays_a_cells_key_when_the_study_has_cells(tmp_path):
    """``tune_seed`` belongs to the cells: refused without them (above), accepted with them."""
    spec = load_study(write_study(tmp_path, arms=ARMS, tune_seed=7))
    assert spec.tune_seed == 7 and spec.optimizers and len(spec.arms) == 2


def test_the_rank_test_has_its_known_answers_and_never_separates_what_its_seeds_cannot():
    rank = study_statistics.rank_sum_test
    assert rank([10.0, 11.0, 12.0], [10.0, 11.0, 12.0]) == 1.0  # identical arms
    assert rank([5.0, 5.0, 5.0], [5.0, 5.0, 5.0]) == 1.0  # every value tied
    assert rank([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(0.1) == study_statistics.smallest_p(3, 3)  # 2 / C(6, 3)
    assert rank([1.0, 2.0, 3.0, 4.0, 5.0], [6.0, 7.0, 8.0, 9.0, 10.0]) == pytest.approx(2 / 252)
    assert rank([1.0, 2.0, math.inf], [3.0, 4.0, 5.0]) == pytest.approx(rank([1.0, 2.0, 9.0], [3.0, 4.0, 5.0]))  # not reached: last
    assert study_statistics.seeds_to_resolve(0.05) == 4  # 2 / C(8, 4) = 0.029; 3 seeds give at best 0.1


def test_the_rank_test_matches_scipys_exact_mann_whitney_test():
    import numpy as np
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(3)
    for a, b in ((3, 3), (4, 5), (5, 5), (2, 6)):
        for _ in range(5):
            x, y = rng.normal(0, 1, a), rng.normal(0.8, 1, b)
            expected = mannwhitneyu(x, y, alternative="two-sided", method="exact").pvalue
            assert study_statistics.rank_sum_test(list(x), list(y)) == pytest.approx(expected)


def test_pairs_of_arms_are_separated_only_when_the_test_resolves_them():
    same = study_statistics.seed_comparisons({"a": [100.0, 110.0, 120.0], "b": [100.0, 110.0, 120.0]}, samples=200)
    assert [(c.separated, c.ratio, c.seeds_needed) for c in same] == [(False, 1.0, None)]
    three = study_statistics.seed_comparisons({"a": [100.0, 105.0, 110.0], "b": [200.0, 210.0, 220.0]}, samples=200)[0]
    assert (three.p, three.smallest_p, three.separated) == (pytest.approx(0.1), pytest.approx(0.1), False)  # disjoint, unresolvable
    assert three.ratio == pytest.approx(2.0) and 1 not in three.interval and three.seeds_needed == 4
    five = study_statistics.seed_comparisons({"a": [100.0, 101, 102, 103, 104], "b": [200.0, 201, 202, 203, 204]}, samples=200)[0]
    assert five.separated and five.p == pytest.approx(2 / 252) and five.seeds_needed is None
    accuracy = study_statistics.seed_comparisons({"a": [0.8, 0.81, 0.82, 0.83], "b": [0.9, 0.91, 0.92, 0.93]}, False, samples=200)[0]
    assert accuracy.separated and accuracy.ratio == pytest.approx(0.915 / 0.815)  # higher is better: b's median over a's


def test_a_crossings_samples_and_seconds_are_read_between_the_steps_recorded_around_it():
    from largebatch.study.runner import _with_cost
    from largebatch.study.target import Crossing

    progress = [[0, 0, 0.0], [10, 160, 2.0], [11, 176, 3.0], [20, 480, 9.0]]
    assert _with_cost(Crossing(10.5, 10, 11), progress) == {"steps": 10.5, "lo": 10, "hi": 11, "samples": 168.0, "seconds": 2.5}
    assert _with_cost(Crossing(15.5, 11, 20), progress)["samples"] == pytest.approx(176 + 0.5 * 304)  # a batch that grew
    assert _with_cost(Crossing(4.0, 0, 10), progress)["seconds"] == pytest.approx(0.8)  # from the start of training
    assert _with_cost(Crossing(4.0, 0, 10), [[0, 0, 0.0]]) == {"steps": 4.0, "lo": 0, "hi": 10}  # nothing recorded: steps alone


def _trials(folder):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_study(folder / "study.yaml")
    return optuna.load_study(study_name=spec.name, storage=f"sqlite:///{folder / 'study.db'}").get_trials()


@pytest.fixture(scope="module")
def armed(tmp_path_factory):
    """Two arms (batch 16 and 64), two seeds each; the first batch-64 trial held after its
    second step, its worker killed, the study resumed. Every batch-64 evaluation is made a
    second slower, time that must not count as training."""
    folder = tmp_path_factory.mktemp("armed")
    marker = folder / "hold"
    base = tiny_base()
    support = f"{REPO}/tests/support/study_trials.py"
    base["hooks"] = [
        {"type": f"{support}:HoldWhileMarked", "marker": str(marker), "batch": 64},
        {"type": f"{support}:SlowEvaluation", "batch": 64, "seconds": 1.0},
    ]
    write_study(folder, base=base, **{**ONLY_ARMS, "target": None, "targets": TARGETS, "set": SET, "arms": ARMS})
    marker.touch()
    held = kill_worker_at_held_trial(folder)
    marker.unlink()
    resumed = study_cli("run", "study.yaml", cwd=folder)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    return folder, held.parent.name


@pytest.mark.slow
def test_an_arms_study_reports_each_arm_from_its_trials_own_records_and_resumes_a_killed_trial(armed):
    folder, held = armed
    trials = _trials(folder)
    killed = [t for t in trials if t.state.name == "FAIL"]
    assert [t.user_attrs["run_dir"] for t in killed] == [f"trials/{held}"] and killed[0].user_attrs["failure"] == "killed"
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert sorted(t.user_attrs["key"].split("/")[1] + "/" + t.user_attrs["key"].split("/")[3] for t in complete) == [
        "b16/s1",
        "b16/s2",
        "b64/s1",
        "b64/s2",
    ]
    assert killed[0].user_attrs["key"] in {t.user_attrs["key"] for t in complete}  # the killed key ran again
    report = json.loads((folder / "report.json").read_text())["arms"]
    rows = {(r["arm"], r["seed"]): r for r in report["trials"]}
    for trial in complete:
        info = trial.user_attrs
        run = folder / info["run_dir"]
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        kept = json.loads((run / "study_trial.json").read_text())
        curve = sorted(({r["step"]: r["eval/top1"] for r in records if "eval/top1" in r} | {s: v for s, v, *_ in kept["refined"]}).items())
        row, batch = rows[(info["arm"], info["seed"])], 16 if info["arm"] == "b16" else 64
        assert row["final"] == [r["eval/top1"] for r in records if "eval/top1" in r][-1]  # no test split: the held-out one
        assert row["totals"]["steps"] == kept["steps_run"] == kept["total_steps"] == 1024 // batch  # to its end, never stopped early
        assert row["totals"]["samples"] == 1024
        for target in TARGETS:
            key = f"top1>={target['value']:g}"
            expected = first_crossing(curve, target["value"], "max")
            figures = row["targets"][key]
            if expected is None:
                assert figures["steps"] is None
                continue
            assert figures["steps"] == pytest.approx(expected.steps) and figures["samples"] == pytest.approx(expected.steps * batch)
            assert 0 < figures["seconds"] <= row["totals"]["seconds"]
        evaluations = sum("eval/top1" in r for r in records)
        wall = info["outcome"]["seconds"]
        if batch == 64:  # a second per evaluation slept there, none of it training
            assert row["totals"]["seconds"] <= wall - 1.0 * evaluations, (row["totals"], wall, evaluations)
    for arm in report["arms"]:
        for key in ("top1>=0.6", "top1>=0.7"):
            mine = [rows[(arm["label"], s)]["targets"][key]["steps"] for s in (1, 2)]
            if None not in mine:
                assert arm["targets"][key]["steps"]["median"] == pytest.approx(statistics.median(mine))
    assert all(c["smallest_p"] == pytest.approx(1 / 3) and not c["separated"] for c in report["comparisons"])  # 2 seeds: 2 / C(4, 2)
    markdown = (folder / "report.md").read_text()
    assert markdown.startswith("# Study") and "## Comparing recipes" in markdown and "![arms.png](arms.png)" in markdown
    assert "## Protocol" not in markdown and (folder / "arms.png").is_file()
    status = study_cli("status", "study.yaml", cwd=folder)
    assert status.returncode == 0 and "arms: 4 of 4 complete, 0 running" in status.stdout, status.stdout


@pytest.mark.slow
def test_the_arms_report_is_written_again_from_the_storage_alone(armed, tmp_path):
    folder, _ = armed
    again = study_cli("report", "study.yaml", "--out", str(tmp_path), cwd=folder)
    assert again.returncode == 0, again.stderr[-3000:]
    for name in ("report.md", "report.json"):
        assert (tmp_path / name).read_text() == (folder / name).read_text()


def test_a_study_with_cells_and_arms_plans_both_and_reports_the_arms_after_the_cells(tmp_path):
    """Nothing trained: the first plan queues the cells' tuning trials and every arm's
    trials; the report and status of the empty storage carry the arms' section."""
    from largebatch.study import arm_trials, plan, report, storage

    spec = load_study(write_study(tmp_path, arms=ARMS))
    url = storage.default_url(spec.folder)
    study = storage.create_or_load(storage.open_storage(url), spec.name)
    wanted = sorted(arm_trials.decide(spec, [], set(), False), key=lambda w: w["order"])  # the order workers claim them in
    assert [w["key"].split("/")[::3] for w in wanted] == [["arm", "s1"], ["arm", "s1"], ["arm", "s2"], ["arm", "s2"]]
    assert [w["arm"] for w in wanted] == ["b16", "b64", "b16", "b64"]  # seeds first: a study stopped early has every arm
    assert plan.decide(spec, [], set(), False, False, plan.unit_points(spec))[0]  # the cells' tuning trials too
    report.write(spec, study, url, tmp_path, bootstrap_samples=10)
    markdown = (tmp_path / "report.md").read_text()
    assert "## Protocol" in markdown and markdown.index("## Protocol") < markdown.index("## Comparing recipes")
    assert [a["done"] for a in json.loads((tmp_path / "report.json").read_text())["arms"]["arms"]] == [0, 0]
    assert "arms: 0 of 4 complete, 0 running" in report.status_text(spec, study, url)


def test_the_batch_log_keeps_each_batch_key_where_its_value_changed_and_is_empty_without_one(tmp_path):
    from largebatch.study.arm_trials import batch_log

    records = [
        {"step": 1, "train/loss": 2.0, "batch/global": 256, "batch/accumulation": 1},
        {"step": 2, "batch/global": 256, "batch/accumulation": 1},
        {"step": 3, "batch/global": 512, "batch/accumulation": 2},
        {"step": 4, "eval/top1": 0.5},
        {"step": 5, "batch/global": 512, "batch/accumulation": 2},
        {"step": 6, "batch/global": 1024, "batch/accumulation": 4},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert batch_log(tmp_path) == {
        "batch/global": [[1, 256], [3, 512], [6, 1024]],
        "batch/accumulation": [[1, 1], [3, 2], [6, 4]],
    }
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 2.0}) + "\n")
    assert batch_log(tmp_path) == {}
    assert batch_log(tmp_path / "no-run") == {}
