"""Whole studies through the command line: a tiny study's report, a study killed mid-trial
and resumed against one never stopped, and failures left to the user (bad input before
any trial: tests/cli/test_bad_input_catalogue.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from largebatch.study.spec import load_study
from tests.conftest import REPO, clean_env
from tests.study.helpers import kill_worker_at_held_trial, study_cli, tiny_base, write_study


def trials(folder):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_study(folder / "study.yaml")
    return optuna.load_study(study_name=spec.name, storage=f"sqlite:///{folder / 'study.db'}").get_trials()


def completed(folder):
    """{key: (params, value)} of the complete trials."""
    return {t.user_attrs["key"]: (t.params, round(t.value, 6)) for t in trials(folder) if t.state.name == "COMPLETE"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    write_study(folder)
    result = study_cli("run", "study.yaml", "--jobs", "2", cwd=folder)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return folder, result


def test_a_tiny_study_reports_its_cells_seeds_fit_and_edge_marks(tiny):
    folder, result = tiny
    spec = load_study(folder / "study.yaml")
    report = json.loads((folder / "report.json").read_text())
    assert [(c["optimizer"], c["batch"]) for c in report["cells"]] == spec.cells()
    for cell in report["cells"]:
        assert cell["tuned"] == 3 and [r["seed"] for r in cell["reruns"]] == [1, 2]
        steps = [r["steps"] for r in cell["reruns"]]
        assert cell["steps_median"] == pytest.approx(sorted(steps)[0] / 2 + sorted(steps)[1] / 2)
        assert (cell["steps_low"], cell["steps_high"]) == (min(steps), max(steps))
        opt = spec.optimizer(cell["optimizer"])
        chosen = cell["best"]["params"]
        outside = [  # in the outer 10% of a range, or a whole number (the epochs) at its shortest or longest
            p.name
            for p in opt.space
            if not 0.1 <= p.position(chosen[p.name], cell["batch"], 16) <= 0.9
            or (p.integer and chosen[p.name] in {math.ceil(p.bounds(cell["batch"], 16)[0]), math.floor(p.bounds(cell["batch"], 16)[1])})
        ]
        assert [e["param"] for e in cell["best"]["edges"]] == outside
    assert any(c["best"]["edges"] for c in report["cells"])  # adamw's range is too low on purpose
    fitted = [o for o in report["optimizers"] if o["fit"]]
    assert fitted and all(o["interval_95"]["b_crit"][0] <= o["fit"]["b_crit"] <= o["interval_95"]["b_crit"][1] for o in fitted)
    assert report["resolution"]["worst"] > 0 and report["reported_split"] == "heldout"
    assert report["threads_per_trial"] == max(1, len(os.sched_getaffinity(0)) // 2)  # cores / --jobs, recorded
    markdown = (folder / "report.md").read_text()
    for text in (
        "## Protocol",
        "**Resolution**",
        "## Critical batch",
        "B_crit",
        "## Leave one batch out",
        "## What the statistics separate",
        "widen to",
        "†",
    ):
        assert text in markdown
    for png in ("steps_vs_batch.png", "steps_vs_samples.png", "noise_scale.png"):
        assert (folder / png).stat().st_size > 10_000
    keys = [t.user_attrs["key"] for t in trials(folder)]
    assert len(keys) == 4 * (3 + 2) == len(set(keys))  # every trial once
    assert all((folder / t.user_attrs["run_dir"] / "metrics.jsonl").is_file() for t in trials(folder))


def test_the_report_is_written_again_from_the_storage_alone(tiny, tmp_path):
    folder, _ = tiny
    again = study_cli("report", "study.yaml", "--out", str(tmp_path), cwd=folder)
    assert again.returncode == 0, again.stderr
    for name in ("report.md", "report.json"):
        assert (tmp_path / name).read_text() == (folder / name).read_text()


def test_status_lists_every_cell(tiny):
    folder, _ = tiny
    status = study_cli("status", "study.yaml", cwd=folder)
    assert status.returncode == 0 and "20 trials complete, 0 running, 0 waiting, 0 failed, 0 killed" in status.stdout
    assert "lamb/b16" in status.stdout and "3/3" in status.stdout and "2/2" in status.stdout


@pytest.mark.slow
def test_a_study_killed_mid_trial_and_resumed_ends_with_the_trials_of_one_never_stopped(tmp_path):
    reference, stopped, marker = tmp_path / "reference", tmp_path / "stopped", tmp_path / "hold"
    base = tiny_base()
    base["hooks"] = [{"type": f"{REPO}/tests/support/study_trials.py:HoldWhileMarked", "marker": str(marker), "batch": 32}]
    two = [{"metric": "top1", "value": 0.6}, {"metric": "top1", "value": 0.7}]
    for folder in (reference, stopped):  # 2 Sobol points, then 2 of TPE's, in each cell; two targets
        write_study(folder, base=base, trials=4, quasi_random=2, target=None, targets=two)
    done = study_cli("run", "study.yaml", cwd=reference)
    assert done.returncode == 0, done.stderr[-3000:]

    marker.touch()  # the first trial at batch 32 holds after its second step
    held = kill_worker_at_held_trial(stopped)
    killed = [t for t in trials(stopped) if t.state.name == "RUNNING"]
    assert len(killed) == 1 and killed[0].user_attrs["run_dir"] == f"trials/{held.parent.name}"
    assert sum(t.state.name == "COMPLETE" for t in trials(stopped)) >= 1

    marker.unlink()
    resumed = study_cli("run", "study.yaml", cwd=stopped)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert completed(stopped) == completed(reference)  # the same keys, points and results
    assert sum("unit" in t.user_attrs for t in trials(stopped) if t.state.name == "COMPLETE") == 8  # TPE's, the same too
    outcome = next(t for t in trials(stopped) if t.state.name == "COMPLETE").user_attrs["outcome"]
    assert set(outcome["crossings"]) == {"top1>=0.6", "top1>=0.7"} and outcome["threads"] >= 1
    failed = [t for t in trials(stopped) if t.state.name == "FAIL"]
    assert [t.number for t in failed] == [killed[0].number] and failed[0].user_attrs["failure"] == "killed"
    assert "is gone" in failed[0].user_attrs["error"]
    key = killed[0].user_attrs["key"]
    (again,) = [t.number for t in trials(stopped) if t.user_attrs["key"] == key and t.state.name == "COMPLETE"]
    status = study_cli("status", "study.yaml", cwd=stopped)
    assert f"0 waiting, 0 failed, 1 killed: trial {killed[0].number} {key} re-run as #{again}" in status.stdout, status.stdout


@pytest.mark.slow
def test_a_failed_trial_is_recorded_and_waits_for_the_users_choice(tmp_path):
    marker = tmp_path / "fail"
    marker.touch()
    base = tiny_base()
    base["hooks"] = [{"type": f"{REPO}/tests/support/study_trials.py:FailWhileMarked", "marker": str(marker), "batch": 32}]
    folder = tmp_path / "study"
    write_study(folder, base=base, optimizers={"lamb": {}}, trials=2, seeds=[1])
    first = study_cli("run", "study.yaml", cwd=folder)
    assert first.returncode == 1 and "2 trial(s) failed and hold their cells back" in first.stderr
    assert "failed: lamb/b32/q0/s0:" in first.stderr and "failing on purpose" in first.stderr
    status = study_cli("status", "study.yaml", cwd=folder).stdout
    assert "failing on purpose" in status and "--retry-failed" in status
    errors = [t.user_attrs["error"] for t in trials(folder) if t.state.name == "FAIL"]
    assert len(errors) == 2 and all("failing on purpose" in e for e in errors)

    skipped = study_cli("run", "study.yaml", "--skip-failed", cwd=folder)
    assert skipped.returncode == 0, skipped.stderr[-2000:]
    cells = {c["batch"]: c for c in json.loads((folder / "report.json").read_text())["cells"]}
    assert cells[16]["reruns"] and not cells[32]["reruns"] and all(f["skipped"] for f in cells[32]["failed"])

    marker.unlink()
    retried = study_cli("run", "study.yaml", "--retry-failed", cwd=folder)
    assert retried.returncode == 0, retried.stderr[-2000:]
    cells = {c["batch"]: c for c in json.loads((folder / "report.json").read_text())["cells"]}
    assert cells[32]["tuned"] == 2 and len(cells[32]["reruns"]) == 1 and not cells[32]["failed"]
    assert sum(t.state.name == "FAIL" for t in trials(folder)) == 2  # the failures stay on record


def test_the_study_command_keeps_largebatch_help_light():
    code = "import sys, largebatch.cli; largebatch.cli.build_parser(); print(sorted(m for m in ('optuna', 'torch', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), cwd=REPO).stdout
    assert out.strip() == "[]"
