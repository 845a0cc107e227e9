"""A study's report from its storage: ``report.md``, ``report.json`` and the plots, and the
``study status`` table.

Everything here is a function of the storage (and the study file): running
``largebatch study report`` again on the same storage writes the same files. The report
states the protocol, each cell's steps to target as median and range over seeds with the
resolution of the evaluations, efficiencies, the fit with its bootstrap interval, the
critical batches, B_simple, which differences the seeds and the resolution separate, the
cells whose choice sits at the edge of a searched range (with the wider range to try),
failures, and the time it took.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any

from largebatch.config.redact import redact_text
from largebatch.study import analysis, branch_report, ledger, plots
from largebatch.study.space import PARAMS
from largebatch.study.spec import StudySpec

EDGE_MARK = "†"


def _steps(cell: analysis.CellResult) -> str:
    if cell.median is None:
        if not cell.reruns:
            return "-"
        reached = sum(r.steps is not None for r in cell.reruns)
        return f"not reached in {cell.budget}" if not reached else f"{reached}/{len(cell.reruns)} seeds reached it in {cell.budget}"
    high = f"{cell.high:.0f}" if cell.high is not None else f">{cell.budget}"
    return f"{cell.median:.0f} [{cell.low:.0f}, {high}]"


def _efficiency(cell: analysis.CellResult) -> str:
    if cell.efficiency is not None and cell.efficiency_range is not None:
        return f"{cell.efficiency:.2f} [{cell.efficiency_range[0]:.2f}, {cell.efficiency_range[1]:.2f}]"
    if cell.efficiency_below is not None:
        return f"< {cell.efficiency_below:.2f}"
    return "-"


def _num(value: float | None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.{digits}g}"


def _busy_seconds(trials: list[Any]) -> tuple[float, float]:
    """(seconds with at least one trial running, first start to last end)."""
    spans = sorted(
        (t.datetime_start.timestamp(), t.datetime_complete.timestamp()) for t in trials if t.datetime_start and t.datetime_complete
    )
    if not spans:
        return 0.0, 0.0
    busy, (start, end) = 0.0, spans[0]
    for s, e in spans[1:]:
        if s > end:
            busy, start, end = busy + end - start, s, e
        else:
            end = max(end, e)
    busy += end - start
    return busy, spans[-1][1] - spans[0][0] if spans else 0.0


def build(spec: StudySpec, study: Any, url: str, bootstrap_samples: int = 1000) -> dict[str, Any]:
    """The report's content as plain data (``report.json``)."""
    from optuna.trial import TrialState

    trials = [t for t in study.get_trials(deepcopy=False) if "duplicate_of" not in ledger.attrs(t)]
    cells = analysis.collect(spec, trials, ledger.skipped(study))
    optimizers = analysis.per_optimizer(spec, cells, bootstrap_samples)
    resolutions = [c.resolution for c in cells if c.resolution is not None]
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAIL)]
    busy, span = _busy_seconds(finished)
    trial_seconds = sum((ledger.attrs(t).get("outcome") or {}).get("seconds", 0.0) for t in finished)
    smallest = min(spec.batches)
    return {
        "study": spec.name,
        "study_file": spec.path.name,
        "storage": "study.db in this folder (SQLite)" if url.endswith(str(spec.folder / "study.db")) else redact_text(url),
        "target": {"metric": spec.target.metric, "value": spec.target.value, "mode": spec.target.mode},
        "reported_split": spec.data["test"] or spec.data["heldout"],
        "heldout_split": spec.data["heldout"],
        "trials_per_cell": spec.trials,
        "seeds": list(spec.seeds),
        "tune_seed": spec.tune_seed,
        "search": {
            o.label: [
                {"param": p.name, "low": p.low, "high": p.high, "log": p.log, "scale": p.scale, "base_batch": p.base_batch or smallest}
                for p in o.space
            ]
            for o in spec.optimizers
        },
        "evaluation": spec.evaluation,
        "noise_scale": spec.noise_scale,
        "resolution": {"worst": max(resolutions) if resolutions else None, "median": _median(resolutions)},
        "cells": [_cell_json(c) for c in cells],
        "optimizers": [_optimizer_json(o) for o in optimizers],
        "comparisons": analysis.comparisons(spec, cells),
        "time": {
            "trials": len(finished),
            "trial_seconds": round(trial_seconds, 1),
            "busy_wall_seconds": round(busy, 1),
            "span_wall_seconds": round(span, 1),
        },
        "_cells": cells,
        "_optimizers": optimizers,
    }


def _median(values: list[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _cell_json(c: analysis.CellResult) -> dict[str, Any]:
    return {
        "optimizer": c.optimizer,
        "batch": c.batch,
        "tuned": c.tuned,
        "planned": c.planned,
        "best": c.best,
        "reruns": [r.__dict__ for r in c.reruns],
        "steps_median": c.median,
        "steps_low": c.low,
        "steps_high": c.high,
        "budget_steps": c.budget,
        "resolution": c.resolution,
        "efficiency": c.efficiency,
        "efficiency_range": c.efficiency_range,
        "efficiency_below": c.efficiency_below,
        "b_simple": c.b_simple,
        "b_simple_range": c.b_simple_range,
        "failed": c.failed,
    }


def _optimizer_json(o: analysis.OptimizerResult) -> dict[str, Any]:
    fit = o.fit
    return {
        "optimizer": o.optimizer,
        "base_batch": o.base_batch,
        "fit": None
        if fit is None
        else {"s_min": fit.s_min, "b_crit": fit.b_crit, "e_min": fit.e_min, "rms_log": fit.rms_log, "bounded": fit.bounded},
        "interval_95": None if o.intervals is None else {k: [v.low, v.high] for k, v in o.intervals.items()},
        "points": o.points,
        "batches_not_reached": o.left_out,
        "b20_fit": o.b20_fit,
        "b20_measured": o.b20_measured,
        "b20_measured_range": list(o.b20_measured_range),
        "b_simple": o.b_simple,
    }


def write(spec: StudySpec, study: Any, url: str, out: pathlib.Path) -> list[pathlib.Path]:
    """Write report.json, the plots and report.md into ``out``; the paths written."""
    data = build(spec, study, url)
    cells, optimizers = data.pop("_cells"), data.pop("_optimizers")
    label = f"{spec.target.metric} {spec.target.value:g} ({data['reported_split']})"
    paths = [
        plots.steps_vs_batch(cells, optimizers, label, out / "steps_vs_batch.png"),
        plots.steps_vs_samples(cells, optimizers, label, out / "steps_vs_samples.png"),
    ]
    if spec.noise_scale is not None:
        paths.append(plots.noise_scale(cells, optimizers, float(spec.noise_scale["at_eval_loss"]), out / "noise_scale.png"))
    branch = None if spec.branches is None else branch_report.build(spec, study.get_trials(deepcopy=False), out)
    if branch is not None:  # the critical batch along training: a section of its own, at the end
        data["branches"] = branch.data
    _replace(out / "report.json", json.dumps(data, indent=1, default=str) + "\n")
    text = markdown(spec, data, cells, optimizers, [p.name for p in paths])
    _replace(out / "report.md", text if branch is None else text + branch.markdown)
    return [out / "report.md", out / "report.json", *paths, *([] if branch is None else [branch.plot])]


def _replace(path: pathlib.Path, text: str) -> None:
    """Write ``path`` whole or not at all: workers finishing together may both write the report."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(text)
    os.replace(temporary, path)


def markdown(
    spec: StudySpec, data: dict[str, Any], cells: list[analysis.CellResult], optimizers: list[analysis.OptimizerResult], images: list[str]
) -> str:
    t = spec.target
    sign = ">=" if t.mode == "max" else "<="
    batches = list(spec.batches)
    by = {(c.optimizer, c.batch): c for c in cells}
    labels = [o.label for o in spec.optimizers]
    header = "| optimizer | " + " | ".join(f"{b:,}" for b in batches) + " |"
    rule = "|---|" + "---:|" * len(batches)
    worst, median_res = data["resolution"]["worst"], data["resolution"]["median"]
    lines = [
        f"# Study `{spec.name}`: steps to {t.metric} {sign} {t.value:g}",
        "",
        f"Written from the storage ({data['storage']}) by `largebatch study report {spec.path.name}` (`study run` writes it too).",
        "",
        "## Protocol",
        "",
        f"- Base config `{spec.base_config.name}` with {len(spec.overrides)} study override(s); cells: {', '.join(labels)} at global "
        f"batches {', '.join(f'{b:,}' for b in batches)}.",
        f"- Tuning, the same in every cell: {spec.trials} trials at the first {spec.trials} points of a scrambled Sobol sequence "
        f"(Optuna's QMCSampler, seed {spec.sampler_seed}), seed {spec.tune_seed}; the choice is the trial that reaches "
        f"{t.metric} {sign} {t.value:g} on the held-out split `{data['heldout_split']}` in the fewest steps (none: the best "
        "held-out value at its end). A tuning trial stops once it can no longer beat its cell's best so far.",
        f"- Re-runs: each cell's choice with seeds {', '.join(map(str, spec.seeds))}; every figure below is the median "
        f"[min, max] over them, on the `{data['reported_split']}` split, which no choice was made on.",
        f"- Evaluation: steps {spec.evaluation['coarse']}x apart; "
        + (
            f"around a crossing, the weights kept every {spec.evaluation['fine']}x steps between the two evaluations are "
            "evaluated by bisection"
            if spec.evaluation["refine"]
            else f"{spec.evaluation['fine']}x apart within {spec.evaluation['dense_within']:g} of the target"
        )
        + "; steps to target interpolated linearly in log(step) between the two evaluations around the crossing.",
        f"- **Resolution**: the evaluations around each reported crossing are at most {_pct(worst)} apart "
        f"(median {_pct(median_res)}); a steps figure is known to that relative precision.",
        "",
        "Search space (ranges at the smallest batch; `sqrt`/`linear`: both ends scale with the batch):",
        "",
        "| optimizer | " + " | ".join(p for p in PARAMS if any(p == q["param"] for s in data["search"].values() for q in s)) + " |",
    ]
    shown = [p for p in PARAMS if any(p == q["param"] for s in data["search"].values() for q in s)]
    lines.append("|---|" + "---|" * len(shown))
    for label, space in data["search"].items():
        entries = {q["param"]: q for q in space}
        row = []
        for name in shown:
            q = entries.get(name)
            row.append(
                "fixed"
                if q is None
                else f"{_num(q['low'])} to {_num(q['high'])}{' log' if q['log'] else ''}{'' if q['scale'] == 'none' else ' ' + q['scale']}"
            )
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    lines += ["", f"## Steps to {t.metric} {sign} {t.value:g} on `{data['reported_split']}`", ""]
    lines += [
        f"Median [range] over seeds; `{EDGE_MARK}`: the cell's choice sits in the outer 10% of a searched range (see below).",
        "",
        header,
        rule,
    ]
    for label in labels:
        row = [_steps(by[(label, b)]) + (f" {EDGE_MARK}" if (by[(label, b)].best or {}).get("edges") else "") for b in batches]
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    lines += [
        "",
        "Scaling efficiency against each optimizer's smallest batch that reached the target (1: perfect scaling; `< e`: not reached, bounded by the budget):",
        "",
        header,
        rule,
    ]
    for label in labels:
        lines.append(f"| {label} | " + " | ".join(_efficiency(by[(label, b)]) for b in batches) + " |")
    lines += _fit_section(optimizers, spec)
    lines += _separation_section(data["comparisons"])
    lines += _edge_section(spec, cells)
    lines += _choices_section(spec, cells, shown)
    lines += _failure_section(cells)
    time = data["time"]
    lines += [
        "",
        "## Time",
        "",
        f"{time['trials']} trials; {time['trial_seconds'] / 3600:.2f} hours of trial time, {time['busy_wall_seconds'] / 3600:.2f} hours of "
        f"wall time with a trial running ({time['span_wall_seconds'] / 3600:.2f} hours from the first start to the last end).",
        "",
    ]
    lines += [f"![{name}]({name})" for name in images]
    return "\n".join(lines) + "\n"


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    return "unbounded (reached at the first evaluation)" if math.isinf(value) else f"{100 * value:.1f}%"


def _fit_section(optimizers: list[analysis.OptimizerResult], spec: StudySpec) -> list[str]:
    lines = [
        "",
        "## Critical batch",
        "",
        "S = S_min (1 + B_crit / B) fitted to every re-run that reached the target (least squares on log steps; 95% bootstrap "
        "interval over seeds); E_min = S_min B_crit. B_20%: where steps exceed perfect scaling from the smallest batch by 20% "
        "(Zhang et al. 2024), from the fit and from the measured efficiencies (interpolated in log batch; range from the seeds' extremes).",
        "",
        "| optimizer | S_min | B_crit | E_min (samples) | B_20% (fit) | B_20% (measured) | B_simple | points |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for o in optimizers:
        if o.fit is None:
            lines.append(f"| {o.optimizer} | - | - | - | - | - | {_num(o.b_simple)} | {o.points} (too few batches reached the target) |")
            continue
        iv = o.intervals or {}
        b_crit = _band(iv, "b_crit", o.fit.b_crit) + (f" ({o.fit.bounded} the batches measured)" if o.fit.bounded else "")
        low, high = o.b20_measured_range
        measured = "-" if o.b20_measured is None else f"{_num(o.b20_measured)} [{_num(low)}, {_num(high)}]"
        left = f"; not reached at {', '.join(map(str, o.left_out))}" if o.left_out else ""
        lines.append(
            f"| {o.optimizer} | {_band(iv, 's_min', o.fit.s_min)} | {b_crit} | {_band(iv, 'e_min', o.fit.e_min)} | {_num(o.b20_fit)} | {measured} | "
            f"{_num(o.b_simple)} | {o.points}{left} |"
        )
    if spec.noise_scale is not None:
        lines += [
            "",
            f"B_simple: the `noise_scale` hook's estimate at the first evaluation with held-out loss <= {spec.noise_scale['at_eval_loss']:g} in the re-runs (micro-batch against the step's batch, at least {spec.noise_scale['min_ratio']}x apart), median over every re-run of the optimizer.",
        ]
    return lines


def _band(intervals: dict[str, Any], name: str, value: float) -> str:
    """``value [low, high]`` with its bootstrap interval, when there is one."""
    if name not in intervals:
        return _num(value)
    return f"{_num(value)} [{_num(intervals[name].low)}, {_num(intervals[name].high)}]"


def _separation_section(comparisons: list[dict[str, Any]]) -> list[str]:
    apart = [f"{c['a']} and {c['b']}" for c in comparisons if c["separated"]]
    together = [f"{c['a']} and {c['b']}" for c in comparisons if c["separated"] is False]
    lines = ["", "## What the seeds and the resolution separate", ""]
    lines.append("Two cells are told apart when their ranges over seeds do not overlap by more than the resolution.")
    lines += ["", f"- Separated ({len(apart)}): " + ("; ".join(apart) if apart else "none") + "."]
    lines += [f"- Not separated ({len(together)}): " + ("; ".join(together) if together else "none") + "."]
    return lines


def _edge_section(spec: StudySpec, cells: list[analysis.CellResult]) -> list[str]:
    lines = ["", "## Choices at the edge of a searched range", ""]
    marked = [(c, e) for c in cells if c.best for e in c.best["edges"]]
    if not marked:
        return lines + ["No cell's choice sits in the outer 10% of a searched range."]
    lines += [
        "Whether or not the cell reached the target, its best trial may lie beyond the range: widen it and run a new study "
        "(where the range already starts or ends at what the parameter allows, there is nothing wider to search).",
        "",
        "| cell | parameter | chosen | position | widen to (at the smallest batch) | key |",
        "|---|---|---:|---:|---|---|",
    ]
    for cell, edge in marked:
        opt = spec.optimizer(cell.optimizer)
        param = next(p for p in opt.space if p.name == edge["param"])
        wider = param.widened(edge["side"])
        key = f"optimizers.{opt.label}.search.{param.name}" if opt.label else f"search.{param.name}"
        if wider is None:
            bound = param.low if edge["side"] == "low" else param.high
            advice = f"none: {_num(bound)} is the {'lowest' if edge['side'] == 'low' else 'highest'} value allowed"
        else:
            advice = f"{_num(wider[0])} to {_num(wider[1])}"
        lines.append(
            f"| {cell.key} | {param.name} | {_num(cell.best['params'][param.name])} | {edge['position']:.2f} | {advice} | `{key}` |"
        )
    return lines


def _choices_section(spec: StudySpec, cells: list[analysis.CellResult], shown: list[str]) -> list[str]:
    lines = [
        "",
        "## Each cell's choice",
        "",
        "| cell | trial | " + " | ".join(shown) + " | held-out steps | re-runs |",
        "|---|---:|" + "---:|" * (len(shown) + 2),
    ]
    for c in cells:
        if c.best is None:
            lines.append(f"| {c.key} | - | " + " | ".join("-" for _ in shown) + f" | - | tuned {c.tuned}/{c.planned} |")
            continue
        params = " | ".join(_num(c.best["params"].get(name)) for name in shown)
        lines.append(f"| {c.key} | #{c.best['number']} | {params} | {_num(c.best['heldout_steps'])} | {len(c.reruns)}/{len(spec.seeds)} |")
    return lines


def _failure_section(cells: list[analysis.CellResult]) -> list[str]:
    failed = [(c, f) for c in cells for f in c.failed]
    if not failed:
        return []
    lines = ["", "## Failed trials", "", "| trial | key | kind | decided | error |", "|---:|---|---|---|---|"]
    for _, f in failed:
        last = (f["error"].strip().splitlines() or ["?"])[-1].replace("|", "/")[:160]
        lines.append(f"| #{f['number']} | {f['key']} | {f['failure']} | {'skipped' if f['skipped'] else 'open'} | {last} |")
    return lines


def status_text(spec: StudySpec, study: Any, url: str) -> str:
    """``study status``: per cell, tuning trials done/running/failed, re-runs, the steps so far."""
    from optuna.trial import TrialState

    trials = [t for t in study.get_trials(deepcopy=False) if "duplicate_of" not in ledger.attrs(t)]
    counts = {s: sum(t.state == s for t in trials) for s in TrialState}
    lines = [
        f"study {spec.name} in {url}: {counts[TrialState.COMPLETE]} trials complete, {counts[TrialState.RUNNING]} running, "
        f"{counts[TrialState.WAITING]} waiting, {counts[TrialState.FAIL]} failed",
        "",
        f"{'cell':<18} {'tuned':>7} {'running':>8} {'re-runs':>8}  steps to target (median [range])",
    ]
    cells = analysis.collect(spec, trials, ledger.skipped(study))
    running = {(ledger.attrs(t).get("optimizer"), ledger.attrs(t).get("batch")): 0 for t in trials}
    for t in trials:
        if t.state == TrialState.RUNNING:
            key = (ledger.attrs(t).get("optimizer"), ledger.attrs(t).get("batch"))
            running[key] = running.get(key, 0) + 1
    for c in cells:
        lines.append(
            f"{c.key:<18} {c.tuned:>3}/{c.planned:<3} {running.get((c.optimizer, c.batch), 0):>8} {len(c.reruns):>4}/{len(spec.seeds):<3}  {_steps(c)}"
        )
    if spec.branches is not None:
        lines.append(branch_report.status_line(spec, trials))
    for c in cells:
        for f in c.failed:
            last = (f["error"].strip().splitlines() or ["?"])[-1][:200]
            decided = "skipped" if f["skipped"] else "run again with --retry-failed or skip with --skip-failed"
            lines.append(f"failed: trial {f['number']} {f['key']} ({f['failure']}): {last}; {decided}")
    return "\n".join(lines) + "\n"
