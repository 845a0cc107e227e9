"""The sinks (csv, tensorboard, progress bar, plot) write what the logger logged, and
every hook's state survives a checkpoint."""

from __future__ import annotations

import csv
import json
import sys

import pytest
import torch

from largebatch import checkpoint as ckpt
from largebatch.errors import UserError
from largebatch.hooks import BUILTIN_HOOKS, DEFAULT_HOOKS, _builtin_class
from largebatch.hooks.checkpoint import CheckpointHook
from largebatch.hooks.csv_sink import CsvSink
from largebatch.hooks.grad_norm import GradNormHook
from largebatch.hooks.hook_timer import HookTimerHook
from largebatch.hooks.loss_accuracy import LossAccuracyHook
from largebatch.hooks.lr import LearningRateHook
from largebatch.hooks.memory import MemoryHook
from largebatch.hooks.progress import ProgressBar
from largebatch.hooks.tensorboard import TensorBoardSink
from largebatch.hooks.throughput import ThroughputHook
from largebatch.hooks.trust_ratio import TrustRatioHook
from largebatch.run_curves import plot_run
from tests.conftest import REPO
from tests.engine.helpers import ListLoader
from tests.hooks.common import CLASSES, batches, build

METRIC_HOOKS = (LossAccuracyHook, LearningRateHook, GradNormHook, ThroughputHook, MemoryHook)


def metric_run(tmp_path, *sinks, optimizer="lamb"):
    hooks = [cls() for cls in METRIC_HOOKS] + [TrustRatioHook(), *sinks]
    engine, records = build(tmp_path, hooks, steps=4, optimizer=optimizer, clip_grad_norm=1.0, **{"log.interval": 2, "eval.at_end": True})
    engine.eval_loader = ListLoader(batches(2, seed=4), CLASSES)
    engine.run()
    return engine, records


def jsonl(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_csv_holds_the_jsonl_records(tmp_path):
    metric_run(tmp_path, CsvSink())
    with open(tmp_path / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    expected = jsonl(tmp_path)
    assert len(rows) == len(expected) == 3  # steps 2 and 4, then the evaluation
    for row, record in zip(rows, expected):
        for key, value in record.items():
            if isinstance(value, float):
                assert float(row[key]) == pytest.approx(value, rel=1e-9)
            else:
                assert row[key] == str(value)
        assert all(row[k] == "" for k in row if k not in record)


def test_tensorboard_scalars_match_the_jsonl(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    metric_run(tmp_path, TensorBoardSink())
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for record in jsonl(tmp_path):
        for key, value in record.items():
            if key in ("step", "epoch") or not isinstance(value, float):
                continue
            assert key in tags
            (point,) = [e for e in events.Scalars(key) if e.step == record["step"]]
            assert point.value == pytest.approx(value, rel=1e-6)
    assert {"loss", "train/top5", "grad_norm/decay", "trust_ratio/decay/median", "eval/top1"} <= tags


def test_tensorboard_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    with pytest.raises(UserError, match=r"pip install 'largebatch\[tensorboard\]'"):
        TensorBoardSink()


def test_progress_bar_is_off_without_a_terminal_and_counts_steps_when_forced(tmp_path, capsys):
    quiet = ProgressBar()
    engine, _ = build(tmp_path / "quiet", [quiet], steps=3)
    engine.run()
    assert "it/s" not in capsys.readouterr().err and quiet.bar is None  # pytest's output is no terminal
    engine, _ = build(tmp_path / "forced", [LossAccuracyHook(), ProgressBar(force=True)], steps=3)
    engine.run()
    err = capsys.readouterr().err
    assert "3/3" in err and "loss=" in err


def test_plot_writes_parseable_pngs(tmp_path):
    metric_run(tmp_path)
    written = plot_run(tmp_path)
    assert {p.name for p in written} == {f"{n}.png" for n in ("loss", "accuracy", "lr", "throughput", "grad_norm", "trust_ratio")}
    from PIL import Image

    for path in written:
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size[0] > 300


def test_plot_writes_into_out_and_draws_identical_series_once(tmp_path):
    # A run with one unscaled group: lr, lr/decay and lr/no_decay are one series, drawn
    # as one labelled line; the loss panel keeps train and eval apart.
    (tmp_path / "metrics.jsonl").write_text(
        "\n".join(
            json.dumps(r)
            for r in (
                {"step": 1, "lr": 0.1, "lr/decay": 0.1, "lr/no_decay": 0.1, "loss": 2.0},
                {"step": 2, "lr": 0.2, "lr/decay": 0.2, "lr/no_decay": 0.2, "loss": 1.5},
                {"step": 2, "eval/loss": 1.7},
            )
        )
        + "\n"
    )
    out = tmp_path / "figures" / "here"
    written = plot_run(tmp_path, out)
    assert {p.parent for p in written} == {out} and not list(tmp_path.glob("*.png"))
    from largebatch.run_curves import distinct_curves, read_records, series_of

    series = series_of(read_records(tmp_path / "metrics.jsonl"))
    (curve,) = distinct_curves(series, ["lr", "lr/decay", "lr/no_decay"])
    assert curve == ("lr = lr/decay = lr/no_decay", [(1, 0.1), (2, 0.2)])
    assert [name for name, _ in distinct_curves(series, ["loss", "eval/loss"])] == ["loss", "eval/loss"]
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="--out names a file"):
        plot_run(tmp_path, tmp_path / "file")


def test_plot_leaves_out_a_cut_last_line_and_values_beyond_a_float(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0, "big": 1e400, "huge": 1' + "0" * 400 + '}\n{"step": 2, "lo')
    written = plot_run(tmp_path)
    assert [p.name for p in written] == ["loss.png"]
    assert "line 2, the last, was cut short" in capsys.readouterr().err


def test_plot_replaces_a_planted_link_and_leaves_its_target(tmp_path):
    """A link at RUN/loss.png is replaced by the figure; the file it pointed at is untouched."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0}\n')
    target = tmp_path / "precious.txt"
    target.write_text("mine")
    (tmp_path / "loss.png").symlink_to(target)
    (written,) = plot_run(tmp_path)
    assert not written.is_symlink() and written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert target.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loss.png", "metrics.jsonl", "precious.txt"]


def test_plot_errors(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="no metrics.jsonl here"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo\n{"step": 3, "loss": 1.0}\n')
    with pytest.raises(UserError, match="metrics.jsonl: line 2 is not JSON"):
        plot_run(tmp_path)
    for bad in ("[1, 2]", "1e400", '{"step": "two"}', '{"step": 1e400}'):
        (tmp_path / "metrics.jsonl").write_text(f'{{"step": 1, "loss": 2.0}}\n{bad}\n')
        with pytest.raises(UserError, match=r"metrics.jsonl: line 2 is not a metrics record"):
            plot_run(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(UserError, match=r"pip install 'largebatch\[plot\]'"):
        plot_run(tmp_path)


def test_every_hooks_state_round_trips_through_a_checkpoint(tmp_path):
    def hooks():
        return [cls() for cls in METRIC_HOOKS] + [TrustRatioHook(), HookTimerHook(top=0), CsvSink()]

    first = hooks()
    saver = CheckpointHook(interval_steps=3, interval_epochs=0, at_end=False)
    engine, _ = build(tmp_path, [*first, saver], steps=4, optimizer="lamb", **{"log.interval": 2})
    engine.run()
    (path,) = ckpt.list_checkpoints(tmp_path)  # step 3
    second = hooks()
    fresh, _ = build(tmp_path / "fresh", second, steps=4, optimizer="lamb")
    ckpt.load_checkpoint(path, fresh.state, fresh.hooks, fresh.train_loader, ignore_config=True)
    assert fresh.state.step == 3
    saved = torch.load(path, weights_only=True)["hooks"]
    for old, new in zip(first, second):
        expected, got = saved[old.name], new.state_dict()
        if isinstance(new, HookTimerHook):
            assert got["times"] == expected["times"] and got["run_seconds"] >= expected["run_seconds"]
            continue
        assert got == expected, old.name
    loss_state = saved["LossAccuracyHook"]
    assert loss_state["steps"] == 1 and loss_state["samples"] == 8  # step 3 of interval 2 is half done
    assert saved["ThroughputHook"]["flops_per_sample"]


def test_every_builtin_is_registered_and_documented():
    page = (REPO / "docs/hooks.md").read_text()
    section = page[page.index("## Built-in hooks") : page.index("## Write your first debugging hook")]
    for name in BUILTIN_HOOKS:
        assert _builtin_class(name).__module__.startswith("largebatch.hooks.")
        assert f"`{name}`" in section, f"docs/hooks.md's Built-in hooks section does not describe {name!r}"
    assert set(DEFAULT_HOOKS) <= set(BUILTIN_HOOKS)
