"""The critical batch along training as study trials: a source run with checkpoints, a tiny
study with a ``branches`` section, its branches run by the study's workers, the CBS(t)
table and figure in the report (the measurement itself: tests/study/test_branches.py)."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from largebatch.errors import UserError
from largebatch.study.branches import critical
from largebatch.study.spec import load_study
from tests.conftest import run_cli
from tests.study.helpers import study_cli, tiny_base, write_study

BRANCHES = {"run": "source", "at_samples": [256, 768], "ks": [1, 2, 4], "samples": 256, "seeds": [1, 2], "tolerance": 0.3}
ONLY_BRANCHES = {
    key: None
    for key in ("optimizers", "batches", "search", "target", "micro_batch_size", "noise_scale", "trials", "sampler_seed", "evaluation")
}


def make_source(folder):
    """32 steps at batch 32 (cosine, peak 1e-3, one warmup step), a checkpoint every 8, B_simple logged."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "source.yaml").write_text(yaml.safe_dump(tiny_base(), sort_keys=False))
    sets = ["checkpoint.interval_steps=8", "checkpoint.keep=10", 'hooks=[{"type": "noise_scale"}]']
    result = run_cli(
        "train", "--config", str(folder / "source.yaml"), "--run-dir", str(folder / "source"), *[a for s in sets for a in ("--set", s)]
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def branched(tmp_path_factory):
    folder = tmp_path_factory.mktemp("branched")
    make_source(folder)
    write_study(folder, branches=BRANCHES, **ONLY_BRANCHES)  # a study of branches only: no cells to tune
    result = study_cli("run", "study.yaml", "--jobs", "2", cwd=folder)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return folder


@pytest.mark.slow
def test_branches_run_as_trials_and_the_report_has_the_critical_batch_along_training(branched):
    import optuna

    folder = branched
    spec = load_study(folder / "study.yaml")
    study = optuna.load_study(study_name=spec.name, storage=f"sqlite:///{folder / 'study.db'}")
    trials = study.get_trials()
    assert all(t.user_attrs.get("phase") == "branch" for t in trials)  # no tuning trial, no re-run
    assert sorted(t.user_attrs["key"] for t in trials) == sorted(
        f"branch/source/n{n}/k{k}/d256/sqrt/s{s}" for n in (256, 768) for k in (1, 2, 4) for s in (1, 2)
    )
    assert all(t.state.name == "COMPLETE" for t in trials)
    for t in trials:
        b = t.user_attrs["branch"]
        saved = yaml.safe_load((folder / t.user_attrs["run_dir"] / "config.yaml").read_text())
        # the source's cosine schedule at the checkpoint's step (32 steps, 1 warmup step), times sqrt(k) for AdamW
        at = 0.5 * (1 + math.cos(math.pi * (b["step"] - 1) / 31)) * 1e-3
        assert saved["optimizer"]["lr"] == pytest.approx(at * math.sqrt(b["k"]))
        assert saved["global_batch_size"] == 32 * b["k"] and saved["derived"]["max_steps"] == 256 // (32 * b["k"])
        assert t.user_attrs["outcome"]["steps_run"] == 256 // (32 * b["k"])
    written = json.loads((folder / "report.json").read_text())
    assert set(written) == {"study", "study_file", "storage", "threads_per_trial", "heldout_split", "branches"}
    report = written["branches"]
    assert [row["samples"] for row in report["rows"]] == [256, 768]
    for row in report["rows"]:
        mine = [t for t in trials if t.user_attrs["branch"]["at_samples"] == row["samples"]]
        starts = {t.user_attrs["outcome"]["start_loss"] for t in mine}
        assert len(starts) == 1  # every branch starts from the checkpoint's weights
        losses = {k: {s: t.value for t in mine for s in [t.user_attrs["seed"]] if t.user_attrs["branch"]["k"] == k} for k in (1, 2, 4)}
        expected = critical(starts.pop(), losses, 32, 0.3)
        assert (row["critical_k"], row["critical_batch"], row["missing"]) == (expected.k, expected.batch, 0)
        assert row["b_simple"] is not None and row["b_simple"] > 0
    markdown = (folder / "report.md").read_text()
    assert markdown.startswith(f"# Study `{spec.name}`: the critical batch along training") and "## Protocol" not in markdown
    assert "## The critical batch along training" in markdown and "![critical_batch.png](critical_batch.png)" in markdown
    assert sorted(p.name for p in folder.glob("*.png")) == ["critical_batch.png"]
    assert (folder / "critical_batch.png").stat().st_size > 1000
    status = study_cli("status", "study.yaml", cwd=folder)
    assert "branches from source: 12 of 12 complete, 0 running" in status.stdout, status.stdout + status.stderr
    assert "cell" not in status.stdout


def test_a_study_of_branches_only_has_no_cells_and_one_with_some_tuning_keys_names_the_missing_one(tmp_path):
    spec = load_study(write_study(tmp_path, branches=BRANCHES, **ONLY_BRANCHES))
    assert (spec.optimizers, spec.batches, spec.targets, spec.cells()) == ((), (), (), [])
    with pytest.raises(UserError, match="batches: is required"):
        load_study(write_study(tmp_path, branches=BRANCHES, **{**ONLY_BRANCHES, "optimizers": {"adamw": {}}}))
    with pytest.raises(UserError, match="optimizers: is required"):
        load_study(write_study(tmp_path, **ONLY_BRANCHES))  # no branches either: nothing to measure


@pytest.mark.parametrize(
    ("key", "value"),
    [("noise_scale", {"at_eval_loss": 1.0}), ("micro_batch_size", 8), ("trials", 3), ("evaluation", {"coarse": 1.4}), ("pilot", {})],
)
def test_a_key_that_only_shapes_the_cells_is_refused_in_a_study_of_branches_only(tmp_path, key, value):
    with pytest.raises(UserError, match=f"{key}: has no effect in a study of branches only"):
        load_study(write_study(tmp_path, branches=BRANCHES, **{**ONLY_BRANCHES, key: value}))


def test_b_simple_is_the_last_estimate_at_or_before_each_checkpoint(tmp_path):
    from largebatch.study.branch_trials import _b_simple

    records = [{"step": 4, "noise_scale/b_simple": 10.0}, {"step": 8, "loss": 1.0}, {"step": 12, "noise_scale/b_simple": float("nan")}]
    records += [{"step": 16, "noise_scale/b_simple": 30.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert _b_simple(tmp_path / "metrics.jsonl", [2, 8, 12, 16, 20]) == {2: None, 8: 10.0, 12: 10.0, 16: 30.0, 20: 30.0}
    assert _b_simple(tmp_path / "none.jsonl", [8]) == {8: None}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ks": [2, 4]}, "branches.ks"),
        ({"ks": None}, "branches.ks"),
        ({"seeds": [1, 1]}, "branches.seeds"),
        ({"run": None}, "branches.run"),
        ({"tolerance": 1.5}, "branches.tolerance"),
        ({"lr_rule": "cubic"}, "branches.lr_rule"),
        ({"sample": 10}, "branches.sample"),
    ],
)
def test_a_bad_branches_section_is_named(tmp_path, change, message):
    path = write_study(tmp_path, branches={**BRANCHES, **change})
    with pytest.raises(UserError, match=message):
        load_study(path)


def test_a_source_without_the_checkpoint_is_one_error_line(tmp_path):
    make_source(tmp_path)
    write_study(tmp_path, optimizers={"adamw": {}}, batches=[32], trials=1, branches={**BRANCHES, "at_samples": [300]})
    result = study_cli("run", "study.yaml", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith("error:"), result.stderr
    assert "branches.at_samples" in result.stderr and "256, 512, 768, 1024 samples" in result.stderr


@pytest.mark.slow
def test_queued_branches_the_section_no_longer_has_are_withdrawn_unrun_and_queued_again_when_it_has_them_again(tmp_path):
    """`study run` queues every branch and may stop before it ran them (--max-trials, a
    stop); run again after the section changed, it runs only the section's branches: one
    queued from the old section is withdrawn (PRUNED, ``withdrawn``) and never run; put back
    in the section, it is queued and run anew."""
    import optuna

    make_source(tmp_path)
    section = {**BRANCHES, "ks": [1, 2], "seeds": [1]}
    write_study(tmp_path, branches=section, **ONLY_BRANCHES)
    first = study_cli("run", "study.yaml", "--max-trials", "1", "--no-report", cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    write_study(tmp_path, branches={**section, "at_samples": [256]}, **ONLY_BRANCHES)
    second = study_cli("run", "study.yaml", "--no-report", cwd=tmp_path)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    study = optuna.load_study(study_name=tmp_path.name, storage=f"sqlite:///{tmp_path / 'study.db'}")
    by_state = {(t.user_attrs["key"].split("/")[2], t.user_attrs["key"].split("/")[3], t.state.name) for t in study.get_trials()}
    assert by_state == {("n256", "k1", "COMPLETE"), ("n256", "k2", "COMPLETE"), ("n768", "k1", "PRUNED"), ("n768", "k2", "PRUNED")}
    withdrawn = [t for t in study.get_trials() if t.state.name == "PRUNED"]
    assert all("withdrawn" in t.user_attrs and "outcome" not in t.user_attrs and "run_dir" not in t.user_attrs for t in withdrawn)
    write_study(tmp_path, branches=section, **ONLY_BRANCHES)
    third = study_cli("run", "study.yaml", cwd=tmp_path)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    complete = sorted(t.user_attrs["key"] for t in study.get_trials() if t.state.name == "COMPLETE")
    assert complete == sorted(f"branch/source/n{n}/k{k}/d256/sqrt/s1" for n in (256, 768) for k in (1, 2))
    assert [row["missing"] for row in json.loads((tmp_path / "report.json").read_text())["branches"]["rows"]] == [0, 0]


@pytest.mark.slow
def test_a_study_with_cells_and_branches_runs_both_and_reports_both(tmp_path):
    """Tuning cells and branches in one storage: the tuning trial and its seed re-run run
    beside the branches, and the report has the cells' sections and the CBS(t) section."""
    import optuna

    make_source(tmp_path)
    section = {**BRANCHES, "at_samples": [256], "ks": [1, 2], "seeds": [1]}
    spec = load_study(write_study(tmp_path, optimizers={"adamw": {}}, batches=[32], trials=1, branches=section))
    result = study_cli("run", "study.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = optuna.load_study(study_name=spec.name, storage=f"sqlite:///{tmp_path / 'study.db'}")
    phases = sorted(t.user_attrs.get("phase") for t in study.get_trials() if t.state.name == "COMPLETE")
    assert phases.count("branch") == 2 and len(phases) > 2, phases  # both branches, and the cell's trials
    branches = sorted(t.user_attrs["key"] for t in study.get_trials() if t.user_attrs.get("phase") == "branch")
    assert branches == [f"branch/source/n256/k{k}/d256/sqrt/s1" for k in (1, 2)]
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["branches"]["rows"][0]["missing"] == 0 and written["cells"], sorted(written)
    markdown = (tmp_path / "report.md").read_text()
    assert "## Protocol" in markdown and "## The critical batch along training" in markdown
