"""``batch.png`` (``largebatch.batch_curves``): its data against a real adaptive run's
metrics and decisions, a critical-batch study's report drawn along its run, a fixed run
plotted as before, and untrusted ``metrics.jsonl`` / ``report.json`` values left out with a
note or refused with one error line."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest

from largebatch import batch_curves, preemption
from largebatch.errors import UserError
from largebatch.launch import TrainArgs, train
from largebatch.run_curves import plot_run
from largebatch.rundir import read_metrics
from tests.conftest import REPO, tiny_config, write_config

SHIPPED_REPORT = REPO / "studies/fashion-mnist-cbs/report.json"
FAMILIES = {"loss.png", "accuracy.png", "lr.png", "throughput.png", "grad_norm.png"}


def trained(tmp_path: pathlib.Path, name: str, **overrides):
    """A one-epoch tiny run logging every step; ``(the run's engine, its folder)``."""
    cfg = tiny_config(**{"log.interval": 1, **overrides})
    preemption.clear()
    run_dir = tmp_path / name
    return train(TrainArgs(config=str(write_config(tmp_path, cfg, name=f"{name}.yaml")), run_dir=str(run_dir))), run_dir


@pytest.fixture(scope="module")
def adaptive(tmp_path_factory):
    # 16 -> 32 as soon as the smoothed |G|^2 is positive (factor 10^6), checked every 32 samples
    tmp = tmp_path_factory.mktemp("adaptive")
    return trained(
        tmp,
        "adaptive",
        hooks=[{"type": "noise_scale", "beta": 0.5}],
        batch_schedule={"type": "adaptive", "start_batch_size": 16, "factor": 1e6, "check_every_samples": 32},
    )


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("fixed"), "fixed")


def report_for(run_dir: pathlib.Path, folder: pathlib.Path, edit=None) -> pathlib.Path:
    """The shipped critical-batch study's report.json in ``folder``, its branches.run
    pointing at ``run_dir`` (relative, as a study writes it), then ``edit(report)``."""
    report = json.loads(SHIPPED_REPORT.read_text())
    report["branches"]["run"] = os.path.relpath(run_dir, folder)
    if edit is not None:
        edit(report)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report))
    return folder / "report.json"


def test_the_batch_figure_holds_the_runs_batch_and_the_estimate_the_criterion_read(adaptive, tmp_path, capsys):
    engine, run_dir = adaptive
    written = plot_run(run_dir, tmp_path / "plots")
    assert (tmp_path / "plots" / "batch.png") in written
    records = read_metrics(run_dir / "metrics.jsonl")
    curves = batch_curves.batch_curves(records, run_dir)
    steps = [r for r in records if "batch/global" in r]
    assert len(steps) == engine.step  # one record per step (log.interval 1)
    assert curves.batch == [(r["samples_seen"], float(r["batch/global"])) for r in steps]
    # the staircase against the run: 16 until the step at whose end it doubled, 32 after;
    # each step's samples are its batch (a window cut at the epoch's end: fewer)
    ((_, grew_after, criterion, new_batch),) = engine.run.batch.decisions
    assert [b for _, b in curves.batch] == [16.0] * int(grew_after) + [new_batch] * (engine.step - int(grew_after))
    samples = [0] + [s for s, _ in curves.batch]
    assert all(after - before <= batch for (before, after), (_, batch) in zip(zip(samples, samples[1:]), curves.batch))
    # B_simple as drawn is the value the criterion compared, at the step it decided
    assert dict(curves.b_simple)[samples[int(grew_after)]] == pytest.approx(criterion)
    assert curves.b_simple == [(r["samples_seen"], r["noise_scale/b_simple"]) for r in steps if r["noise_scale/b_simple"] > 0]
    assert curves.critical == [] and curves.fixed_batch is None
    # NaN until the smoothed |G|^2 is positive, and a noisy estimate may be negative: off the log axis, with a note
    dropped = len(steps) - len(curves.b_simple)
    assert dropped > 0
    (note,) = capsys.readouterr().err.splitlines()
    assert note.endswith(
        f"metrics.jsonl: {dropped} record(s) with a noise_scale/b_simple that is not a positive number (the log axis) left out of batch.png"
    )


def test_a_fixed_run_plots_as_before(fixed, tmp_path):
    _, run_dir = fixed
    records = read_metrics(run_dir / "metrics.jsonl")
    assert batch_curves.batch_curves(records, run_dir) is None
    assert {p.name for p in plot_run(run_dir, tmp_path / "plots")} == FAMILIES


def test_the_critical_batch_is_read_from_a_study_along_this_run(fixed, tmp_path):
    _, run_dir = fixed
    report = report_for(run_dir, tmp_path / "study")
    rows = json.loads(SHIPPED_REPORT.read_text())["branches"]["rows"]
    for given in (report, report.parent):  # the report, or the study's folder
        curves = batch_curves.batch_curves(read_metrics(run_dir / "metrics.jsonl"), run_dir, given)
        assert curves.critical == [
            batch_curves.CriticalPoint(
                r["samples"], r["critical_batch"], min(r["batch_by_seed"].values()), max(r["batch_by_seed"].values()), r["bound"]
            )
            for r in rows
        ]
        assert curves.fixed_batch == 256 and curves.batch == []  # a fixed run: the study's base batch
    assert "batch.png" in {p.name for p in plot_run(run_dir, tmp_path / "plots", report)}


def test_metrics_values_that_cannot_be_drawn_are_left_out_with_a_note(tmp_path, capsys):
    lines = [
        {"step": 1, "samples_seen": 16, "batch/global": 16, "noise_scale/b_simple": 40.0},
        {"step": 2, "samples_seen": "32", "batch/global": 16, "noise_scale/b_simple": 50.0},  # samples_seen a string
        {"step": 3, "samples_seen": 48, "batch/global": 1.5, "noise_scale/b_simple": -3.0},  # a fraction, a negative estimate
        {"step": 4, "samples_seen": 80, "batch/global": 32, "noise_scale/b_simple": True},
        {"step": 5, "batch/global": 32},  # no samples_seen
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    curves = batch_curves.batch_curves(read_metrics(tmp_path / "metrics.jsonl"), tmp_path)
    assert curves.batch == [(16, 16.0), (80, 32.0)] and curves.b_simple == [(16, 40.0)]
    plot_run(tmp_path)
    err = capsys.readouterr().err
    assert "2 record(s) with no whole-number samples_seen left out" in err
    assert "1 record(s) with a batch/global that is not a positive whole number" in err
    assert "2 record(s) with a noise_scale/b_simple that is not a positive number" in err


def _set_row(key, value):
    def edit(report):
        report["branches"]["rows"][1][key] = value

    return edit


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda r: r["branches"].update(run="../elsewhere"), "its branches were measured along '../elsewhere'"),
        (lambda r: r.pop("branches"), "holds no critical batch along a run"),
        (lambda r: r["branches"].update(rows={"a": 1}), "holds no critical batch along a run"),
        (_set_row("critical_batch", "big"), "branches.rows[2].critical_batch is 'big'"),
        (_set_row("critical_batch", -5), "branches.rows[2].critical_batch is -5"),
        (_set_row("samples", 1.5), "branches.rows[2].samples is 1.5"),
        (_set_row("bound", "no"), "branches.rows[2].bound is 'no'"),
        (_set_row("batch_by_seed", {"1": None}), "branches.rows[2].batch_by_seed"),
        (_set_row("base_batch", 512), "its rows start from different batches [256, 512]"),
        (lambda r: r["branches"]["rows"].append(7), "branches.rows[6] is not an object"),
    ],
)
def test_a_malformed_or_foreign_report_is_one_error_and_nothing_is_written(fixed, tmp_path, edit, words):
    _, run_dir = fixed
    report = report_for(run_dir, tmp_path / "study", edit)
    with pytest.raises(UserError, match="report.json") as error:
        plot_run(run_dir, tmp_path / "plots", report)
    assert words in str(error.value)
    assert not (tmp_path / "plots").exists() or not list((tmp_path / "plots").iterdir())


def test_a_checkpoint_without_a_critical_batch_is_left_out_with_a_note(fixed, tmp_path, capsys):
    _, run_dir = fixed
    report = report_for(run_dir, tmp_path / "study", _set_row("critical_batch", None))
    curves = batch_curves.batch_curves(read_metrics(run_dir / "metrics.jsonl"), run_dir, report)
    assert [p.samples for p in curves.critical] == [5120, 51200, 102400, 153600]
    batch_curves.print_notes(curves)
    assert "1 checkpoint(s) with no critical batch measured left out" in capsys.readouterr().err


def test_a_missing_or_unreadable_report_is_one_error(fixed, tmp_path):
    _, run_dir = fixed
    with pytest.raises(UserError, match="--critical-batch: no report.json here"):
        plot_run(run_dir, tmp_path / "plots", tmp_path / "nowhere")
    (tmp_path / "report.json").write_text('{"branches": ')
    with pytest.raises(UserError, match="is not JSON"):
        plot_run(run_dir, tmp_path / "plots", tmp_path)
    shutil.rmtree(tmp_path / "plots", ignore_errors=True)
