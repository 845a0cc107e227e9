"""``largebatch plot RUN_DIR [--out DIR]``: PNG curves from a run's ``metrics.jsonl``.

Writes, next to ``metrics.jsonl`` (or into ``--out``), one figure per family of metrics the
run logged:
``loss.png`` (training and evaluation loss), ``accuracy.png`` (train and eval top-1 /
top-5), ``lr.png`` (base and per-group rates), ``throughput.png`` (samples/s, TFLOP/s,
MFU, data wait), ``grad_norm.png`` (global and per group, before and after clipping) and
``trust_ratio.png`` (per group min / median / max), and ``batch.png`` (the global batch
against samples seen beside B_simple and, with ``--critical-batch``, a study's critical
batch along the run: ``largebatch.batch_curves``; only for a run that logged its batch,
or with a study). A family with no values is skipped.
Curves that are the same series (the base rate and a parameter group's rate, when the
group is not scaled) are drawn once, labelled with every name they stand for. Uses
matplotlib's Agg backend (no display needed); matplotlib is the ``plot`` extra.
"""

from __future__ import annotations

import math
import os
import pathlib
import tempfile

from largebatch import batch_curves
from largebatch.errors import UserError
from largebatch.rundir import RunDir, read_metrics


def _keys(*names: str):
    return lambda key: key in names


def _prefix(prefix: str):
    return lambda key: key == prefix or key.startswith(prefix + "/")


def _trust(key: str) -> bool:
    return key.startswith("trust_ratio/") and key.rsplit("/", 1)[-1] in ("min", "median", "max")


# (file stem, title, panels); a panel is (y label, log scale, key selector). Panels keep
# quantities of different scales (images/s and utilisation) on their own axes.
FIGURES = (
    ("loss", "Loss", [("loss", False, _keys("loss", "eval/loss"))]),
    ("accuracy", "Accuracy", [("fraction", False, _keys("train/top1", "train/top5", "eval/top1", "eval/top5"))]),
    ("lr", "Learning rate", [("lr", False, _prefix("lr"))]),
    (
        "throughput",
        "Throughput",
        [
            ("samples/s", False, _keys("samples_per_sec", "samples_per_sec_per_device")),
            ("TFLOP/s per device", False, _keys("tflops_per_device")),
            ("fraction", False, _keys("mfu", "data_wait_fraction")),
        ],
    ),
    ("grad_norm", "Gradient norm", [("L2 norm", True, lambda key: key.startswith("grad_norm"))]),
    ("trust_ratio", "LAMB trust ratio", [("ratio", True, _trust)]),
)


def read_records(path: pathlib.Path) -> list[dict]:
    """The records of a ``metrics.jsonl`` (``largebatch.rundir.read_metrics``: a last line
    cut short is left out).

    Raises:
        UserError: the file is missing, or a line before the last is not a metrics record.
    """
    if not path.is_file():
        raise UserError("no metrics.jsonl here; give the run directory of a training run (it holds metrics.jsonl)", path=str(path))
    return read_metrics(path)


def series_of(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """``{key: [(step, value), ...]}`` of every finite number in metrics records."""
    series: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        step = int(record["step"])
        for key, value in record.items():
            if key in ("step", "epoch", "samples_seen") or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            try:
                number = float(value)
            except OverflowError:  # an integer beyond any float
                continue
            if math.isfinite(number):
                series.setdefault(key, []).append((step, number))
    return series


def distinct_curves(series: dict[str, list[tuple[int, float]]], keys: list[str]) -> list[tuple[str, list[tuple[int, float]]]]:
    """``(label, points)`` for each distinct series among ``keys``, in order: keys whose
    points are identical share one curve labelled ``'a = b'``."""
    curves: dict[tuple, list[str]] = {}
    for key in keys:
        curves.setdefault(tuple(series[key]), []).append(key)
    return [(" = ".join(names), list(points)) for points, names in curves.items()]


def _save(fig, path: pathlib.Path) -> None:
    """Write ``fig`` as a PNG at ``path``: into a new file beside it, then renamed, so a
    link (or anything else) at ``path`` is replaced, never written through."""
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False) as handle:
        try:
            fig.savefig(handle, format="png", dpi=100)
        except BaseException:
            os.unlink(handle.name)
            raise
    os.chmod(handle.name, 0o644)  # a temporary file is private; a plot is not
    os.replace(handle.name, path)


def plot_run(
    run_dir: str | pathlib.Path, out: str | pathlib.Path | None = None, critical_batch: str | pathlib.Path | None = None
) -> list[pathlib.Path]:
    """Write the PNG figures for ``run_dir`` into it, or into ``out`` (made if missing);
    returns their paths.

    Args:
        run_dir: the run directory.
        out: the folder for the PNGs (default: ``run_dir``).
        critical_batch: a critical-batch study's folder or ``report.json`` whose
            ``branches.run`` is ``run_dir``, drawn in ``batch.png`` (None: none).

    Raises:
        UserError: matplotlib is missing, ``run_dir`` has no readable metrics.jsonl,
            ``out`` cannot be a folder, or the study's report is not one of this run.
    """
    try:
        import matplotlib
    except ImportError:
        raise UserError("plotting needs matplotlib, which is not installed; pip install 'largebatch[plot]' (or matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = RunDir(run_dir)
    records = read_records(run_dir.metrics)
    series = series_of(records)
    batch = batch_curves.batch_curves(records, run_dir.path, critical_batch)  # checked before anything is written
    folder = RunDir(out if out is not None else run_dir)
    if folder.path.exists() and not folder.path.is_dir():
        raise UserError("--out names a file; give a folder for the PNGs", path=str(folder))
    folder.path.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, title, panels in FIGURES:
        used = [(label, log, sorted(k for k in series if select(k))) for label, log, select in panels]
        used = [panel for panel in used if panel[2]]
        if not used:
            continue
        fig, axes = plt.subplots(len(used), 1, figsize=(8, 1.0 + 3.5 * len(used)), sharex=True, squeeze=False)
        for ax, (label, log, keys) in zip(axes[:, 0], used):
            curves = distinct_curves(series, keys)
            for name, points in curves:
                steps, values = zip(*points)
                ax.plot(steps, values, label=name, marker="o" if len(steps) < 30 else None, markersize=3)
            if log and all(v > 0 for k in keys for _, v in series[k]):
                ax.set_yscale("log")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small", ncol=2 if len(curves) > 6 else 1)
        axes[0, 0].set_title(f"{title}: {run_dir.name}")
        axes[-1, 0].set_xlabel("optimizer step")
        fig.tight_layout()
        path = folder.plot(stem)
        _save(fig, path)
        plt.close(fig)
        written.append(path)
    if batch is not None:
        batch_curves.print_notes(batch)
        fig, ax = plt.subplots(figsize=(8, 4.5))
        batch_curves.draw(batch, ax)
        ax.set_title(f"Batch: {run_dir.name}")
        fig.tight_layout()
        path = folder.plot("batch")
        _save(fig, path)
        plt.close(fig)
        written.append(path)
    if not written:
        raise UserError("metrics.jsonl holds no numbers to plot yet; plot again once the run has logged a step", path=str(run_dir))
    return written
