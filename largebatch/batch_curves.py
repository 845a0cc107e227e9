"""``batch.png`` of ``largebatch plot``: the global batch along a run, against samples seen,
beside the gradient noise scale and, where a study measured it, the critical batch.

* *The batch*: ``batch/global`` of each logged step (a run with a ``batch_schedule`` other
  than ``fixed`` logs it, ``largebatch.batch_schedule``), drawn as a staircase: a record at
  samples seen ``s`` holds the batch of the steps that led to ``s``.
* *B_simple*: ``noise_scale/b_simple``, the ``noise_scale`` hook's ratio of its smoothed,
  bias-corrected averages of tr(Sigma) and |G|^2: the value the adaptive criterion reads
  (``largebatch.hooks.noise_scale``), so the figure shows what the criterion saw.
* *The critical batch along training*: from a critical-batch study's ``report.json``
  (``--critical-batch STUDY_DIR_OR_REPORT``), whose ``branches.run`` is this run: each
  checkpoint's critical batch (the mean over seeds; a bar from the smallest to the
  largest seed's; a triangle where every branch was efficient and it is only a lower
  bound), at the samples seen of its checkpoint (``largebatch.study.branches``).

Both files may come from someone else. ``metrics.jsonl`` is read as ``run_curves`` reads it
(a damaged line is an ``error:`` line); a record without a usable ``samples_seen``, a batch
that is not a positive whole number, or a B_simple that is not positive (the log axis; a
single step's estimate may be negative early on) is left out, with one note on stderr
saying how many. ``report.json`` is checked whole before anything is drawn: anything
malformed is one ``error:`` line naming the file, the row and the key.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import sys
from typing import Any

from largebatch.errors import UserError, whole_number

BATCH, B_SIMPLE = "batch/global", "noise_scale/b_simple"
REPORT = "report.json"


@dataclasses.dataclass(frozen=True)
class CriticalPoint:
    """One checkpoint's critical batch, as a study's branches measured it.

    Attributes:
        samples: the samples seen at the checkpoint.
        batch: the critical batch (the mean over seeds).
        low, high: the smallest and the largest seed's (``batch`` when none are given).
        bound: every branch was efficient: the critical batch is at least ``batch``.
    """

    samples: int
    batch: float
    low: float
    high: float
    bound: bool


@dataclasses.dataclass
class BatchCurves:
    """What ``batch.png`` draws.

    Attributes:
        batch: ``(samples seen, global batch)`` of each logged step.
        b_simple: ``(samples seen, B_simple)`` of each logged step that has it.
        critical: the critical batch at the study's checkpoints, by samples seen.
        fixed_batch: the run's batch when it logged none (a fixed run; the study's
            ``base_batch``), else None.
        notes: what was left out, and why.
    """

    batch: list[tuple[int, float]]
    b_simple: list[tuple[int, float]]
    critical: list[CriticalPoint]
    fixed_batch: int | None
    notes: list[str]


def _count(value: Any) -> int | None:
    """``value`` as a whole number at least 0, else None."""
    count = whole_number(value)
    return count if count is not None and count >= 0 else None


def _positive(value: Any) -> float | None:
    """``value`` as a finite number above 0, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and number > 0 else None


def batch_curves(records: list[dict], run_dir: pathlib.Path, critical_batch: str | pathlib.Path | None = None) -> BatchCurves | None:
    """The data of ``batch.png`` from a run's metrics records (``read_metrics``), or None
    when there is nothing to draw: the run logged no batch (a fixed run) and no study is given.

    Args:
        records: the run's ``metrics.jsonl`` records, in order.
        run_dir: the run directory (a study's ``branches.run`` must be it).
        critical_batch: a study folder or its ``report.json``, or None.

    Raises:
        UserError: the report is missing, malformed, or measured along another run.
    """
    logged = any(BATCH in record for record in records)
    if not logged and critical_batch is None:
        return None
    points: dict[str, list[tuple[int, float]]] = {BATCH: [], B_SIMPLE: []}
    left_out = {BATCH: 0, B_SIMPLE: 0, "samples_seen": 0}
    for record in records:
        present = [key for key in points if key in record]
        if not present:
            continue
        samples = _count(record.get("samples_seen"))
        if samples is None:
            left_out["samples_seen"] += 1
            continue
        for key in present:
            value = _positive(record[key])
            if value is None or key == BATCH and not value.is_integer():
                left_out[key] += 1
                continue
            points[key].append((samples, value))
    notes = [
        f"{run_dir / 'metrics.jsonl'}: {n} record(s) with {what} left out"
        for n, what in (
            (left_out["samples_seen"], "no whole-number samples_seen"),
            (left_out[BATCH], f"a {BATCH} that is not a positive whole number"),
            (left_out[B_SIMPLE], f"a {B_SIMPLE} that is not a positive number (the log axis)"),
        )
        if n
    ]
    critical: list[CriticalPoint] = []
    fixed_batch = None
    if critical_batch is not None:
        critical, base, skipped = read_critical_batch(critical_batch, run_dir)
        fixed_batch = None if logged else base
        notes += [f"{_report_path(critical_batch)}: {skipped} checkpoint(s) with no critical batch measured left out"] if skipped else []
    return BatchCurves(sorted(points[BATCH]), sorted(points[B_SIMPLE]), critical, fixed_batch, notes)


def _report_path(given: str | pathlib.Path) -> pathlib.Path:
    path = pathlib.Path(given)
    if path.is_dir():
        path = path / REPORT
    if not path.is_file():
        raise UserError(
            f"--critical-batch: no {REPORT} here; give a critical-batch study's folder or its {REPORT} "
            "(`largebatch study report STUDY` writes it)",
            path=str(path),
        )
    return path


def read_critical_batch(given: str | pathlib.Path, run_dir: pathlib.Path) -> tuple[list[CriticalPoint], int, int]:
    """The critical batch along ``run_dir`` from a study's ``report.json``: the points by
    samples seen, the run's batch the branches started from, and how many checkpoints had
    no critical batch measured.

    Raises:
        UserError: no report, not JSON, no ``branches`` section, ``branches.run`` is not
            ``run_dir``, or a row whose values are not what a report writes (naming it).
    """
    path = _report_path(given)
    try:
        report = json.loads(path.read_text(errors="replace"))
    except json.JSONDecodeError as exc:
        raise UserError(
            f"is not JSON ({exc.msg}, line {exc.lineno}); write it again with `largebatch study report`", path=str(path)
        ) from None
    section = report.get("branches") if isinstance(report, dict) else None
    if not isinstance(section, dict) or not isinstance(section.get("rows"), list) or not isinstance(section.get("run"), str):
        raise UserError(
            "holds no critical batch along a run (no branches section with its run and rows); give the report of a study "
            "with a branches section",
            path=str(path),
        )
    measured = (path.parent / section["run"]).resolve()
    if measured != run_dir.resolve():
        raise UserError(
            f"its branches were measured along {section['run']!r} ({measured}), not along {run_dir}; give the report of a "
            "study whose branches.run is this run",
            path=str(path),
        )
    points, bases, skipped = [], set(), 0
    for number, row in enumerate(section["rows"], 1):
        where = f"branches.rows[{number}]"
        if not isinstance(row, dict):
            raise UserError(f"{where} is not an object; write the report again with `largebatch study report`", path=str(path))

        def bad(key: str, where: str = where, row: dict = row) -> UserError:
            return UserError(
                f"{where}.{key} is {row.get(key)!r}, not what a report writes; write the report again with `largebatch study report`",
                path=str(path),
            )

        samples, base = _count(row.get("samples")), _count(row.get("base_batch"))
        if samples is None:
            raise bad("samples")
        if not base:
            raise bad("base_batch")
        bases.add(base)
        if row.get("critical_batch") is None:  # no branch finished at this checkpoint
            skipped += 1
            continue
        batch = _positive(row["critical_batch"])
        if batch is None:
            raise bad("critical_batch")
        if not isinstance(row.get("bound"), bool):
            raise bad("bound")
        by_seed = row.get("batch_by_seed") or {}
        values = list(by_seed.values()) if isinstance(by_seed, dict) else [None]
        seeds = [v for v in map(_positive, values) if v is not None]
        if len(seeds) != len(values):
            raise bad("batch_by_seed")
        low, high = (min(seeds), max(seeds)) if seeds else (batch, batch)
        points.append(CriticalPoint(samples, batch, low, high, row["bound"]))
    if len(bases) > 1:
        raise UserError(f"its rows start from different batches {sorted(bases)}; one run has one", path=str(path))
    return sorted(points, key=lambda p: p.samples), (bases.pop() if bases else 0), skipped


def draw(curves: BatchCurves, axes: Any) -> None:
    """Draw ``curves`` on matplotlib ``axes`` (log2 batch against samples seen)."""
    from matplotlib.ticker import ScalarFormatter

    if curves.batch:
        samples, batches = zip(*curves.batch)
        axes.plot(samples, batches, drawstyle="steps-pre", label="global batch (batch/global)", color="C0")
    elif curves.fixed_batch:
        axes.axhline(curves.fixed_batch, label=f"global batch (fixed, {curves.fixed_batch})", color="C0")
    if curves.b_simple:
        samples, values = zip(*curves.b_simple)
        axes.plot(samples, values, label="B_simple (noise_scale, smoothed)", color="C1", alpha=0.8)
    for bound in (False, True):
        chosen = [p for p in curves.critical if p.bound == bound]
        if not chosen:
            continue
        axes.errorbar(
            [p.samples for p in chosen],
            [p.batch for p in chosen],
            yerr=[[p.batch - p.low for p in chosen], [p.high - p.batch for p in chosen]],
            fmt="^" if bound else "o",
            color="C2",
            capsize=3,
            label="critical batch, at least (every branch efficient)" if bound else "critical batch (study; bars: each seed's)",
        )
    axes.set_yscale("log", base=2)
    axes.yaxis.set_major_formatter(ScalarFormatter())  # 256, not 2^8
    axes.set_ylabel("batch (samples)")
    axes.set_xlabel("samples seen")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")


def print_notes(curves: BatchCurves) -> None:
    """One ``note:`` line on stderr per kind of value left out of ``batch.png``."""
    for note in curves.notes:
        print(f"note: {note} of batch.png", file=sys.stderr, flush=True)
