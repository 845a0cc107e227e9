"""A study's report from its storage: ``report.md``, ``report.json`` and the plots, and the
``study status`` table.

Everything here is a function of the storage (and the study file): running
``largebatch study report`` again on the same storage writes the same files. The report
states the protocol, each cell's steps to target as median and range over seeds with the
resolution of the evaluations, efficiencies, the fit with its bootstrap interval, the
critical batches, B_simple, which differences the seeds and the resolution separate, the
cells whose choice sits at the edge of a searched range (with the wider range to try),
failures, and the time it took.

A study with several targets gets all of that once per target (each target has its own
choice and re-runs), after a summary of the critical batch by target: per optimizer,
each target's fit, and whether the B_crit intervals of consecutive targets overlap; the
report calls the critical batch grown (McCandlish et al. 2018; Zhang et al. 2024) only
where they do not.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib
from typing import Any

from largebatch.config.redact import redact_text
from largebatch.study import analysis, arm_report, branch_report, ledger, plots, statistics
from largebatch.study import fit as fitting
from largebatch.study.numbers import number_text as _num
from largebatch.study.space import PARAMS
from largebatch.study.spec import StudySpec, Target

EDGE_MARK = "†"
TUNING_MARK = "‡"


def _steps(cell: statistics.CellStats) -> str:
    if cell.median is None:
        if not cell.reruns:
            return "-"
        reached = sum(r.steps is not None for r in cell.reruns)
        budget = _num(cell.budget)
        return f"not reached in {budget}" if not reached else f"{reached}/{len(cell.reruns)} seeds reached it in {budget}"
    high = f"{cell.high:.0f}" if cell.high is not None else f">{_num(cell.budget)}"
    return f"{cell.median:.0f} [{cell.low:.0f}, {high}]"


def _efficiency(cell: statistics.CellStats) -> str:
    if cell.efficiency is not None and cell.efficiency_range is not None:
        return f"{cell.efficiency:.2f} [{cell.efficiency_range[0]:.2f}, {cell.efficiency_range[1]:.2f}]"
    if cell.efficiency_below is not None:
        return f"< {cell.efficiency_below:.2f}"
    return "-"


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


@dataclasses.dataclass(frozen=True)
class Section:
    """One target's part of the report: every cell's trials and figures for it, and its findings."""

    target: Target
    cells: list[analysis.CellResult]
    found: statistics.Findings


def build(spec: StudySpec, study: Any, url: str, bootstrap_samples: int = 1000) -> dict[str, Any]:
    """The report's content as plain data (``report.json``).

    A study with one target keeps its figures at the top level (``target``, ``resolution``,
    ``cells``, ``optimizers``, ``comparisons``); one with several gives them per target in
    ``targets`` (easiest first), after ``critical_batch_by_target``: per optimizer, each
    target's fit and whether the B_crit intervals of consecutive targets overlap.
    """
    from optuna.trial import TrialState

    trials = [t for t in study.get_trials(deepcopy=False) if "duplicate_of" not in ledger.attrs(t)]
    skipped = ledger.skipped(study)
    sections = [Section(t, *analysis.collect(spec, trials, skipped, t, samples=bootstrap_samples)) for t in spec.targets]
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAIL)]
    busy, span = _busy_seconds(finished)
    trial_seconds = sum((ledger.attrs(t).get("outcome") or {}).get("seconds", 0.0) for t in finished)
    smallest = min(spec.batches)
    head = _head(spec, study, url)
    protocol = {
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
        "bootstrap_samples": bootstrap_samples,
    }
    if len(sections) == 1:
        one = _section_json(sections[0])
        target = one.pop("target")
        figures = {**head, "target": target, **protocol, **one}
    else:
        figures = {
            **head,
            **protocol,
            "critical_batch_by_target": _summary_json(sections),
            "targets": [_section_json(section) for section in sections],
        }
    return {
        **figures,
        "time": {
            "trials": len(finished),
            "trial_seconds": round(trial_seconds, 1),
            "busy_wall_seconds": round(busy, 1),
            "span_wall_seconds": round(span, 1),
        },
        "_sections": sections,
    }


def _section_json(section: Section) -> dict[str, Any]:
    t, found = section.target, section.found
    return {
        "target": {"metric": t.metric, "value": t.value, "mode": t.mode},
        "resolution": dataclasses.asdict(found.resolution),
        "cells": [_cell_json(c) for c in section.cells],
        "optimizers": [_optimizer_json(o) for o in found.optimizers],
        "comparisons": [_comparison_json(c) for c in found.comparisons],
    }


@dataclasses.dataclass(frozen=True)
class Step:
    """One optimizer's B_crit at two consecutive targets (``lower`` easier) and whether
    their intervals overlap (None: a fit or an interval is missing, or a B_crit is only a
    bound, so there is nothing to compare)."""

    optimizer: str
    lower: Target
    higher: Target
    ratio: float | None
    overlap: bool | None
    why: str = ""  # when ``overlap`` is None


def _fits(sections: list[Section], label: str) -> list[tuple[Target, statistics.OptimizerStats | None]]:
    return [(s.target, next((o for o in s.found.optimizers if o.optimizer == label), None)) for s in sections]


def _labels(sections: list[Section]) -> list[str]:
    return list(dict.fromkeys(o.optimizer for s in sections for o in s.found.optimizers))


def growth(sections: list[Section]) -> list[Step]:
    """Per optimizer, B_crit from each target to the next (see ``Step``)."""
    steps = []
    for label in _labels(sections):
        fits = _fits(sections, label)
        for (lower, a), (higher, b) in zip(fits, fits[1:], strict=False):
            step = functools.partial(Step, label, lower, higher)
            if a is None or b is None or a.fit is None or b.fit is None:
                steps.append(
                    step(None, None, "no fit at " + " and ".join(t.key for t, o in ((lower, a), (higher, b)) if o is None or o.fit is None))
                )
                continue
            ratio = b.fit.b_crit / a.fit.b_crit
            bounds = [f"at {t.key} it is {o.fit.bounded} the batches measured" for t, o in ((lower, a), (higher, b)) if o.fit.bounded]
            if bounds:
                steps.append(step(ratio, None, "B_crit is a bound, not located: " + "; ".join(bounds)))
            elif "b_crit" not in a.intervals or "b_crit" not in b.intervals:
                steps.append(step(ratio, None, "no bootstrap interval"))
            else:
                steps.append(step(ratio, a.intervals["b_crit"].overlaps(b.intervals["b_crit"])))
    return steps


def _summary_json(sections: list[Section]) -> list[dict[str, Any]]:
    out = []
    steps = growth(sections)
    for label in _labels(sections):
        rows = []
        for target, o in _fits(sections, label):
            fit = None if o is None else o.fit
            band = None if o is None or "b_crit" not in o.intervals else o.intervals["b_crit"]
            rows.append(
                {
                    "target": target.key,
                    "s_min": None if fit is None else fit.s_min,
                    "b_crit": None if fit is None else fit.b_crit,
                    "b_crit_interval_95": None if band is None else [band.low, band.high],
                    "b_crit_bounded": None if fit is None else fit.bounded,
                    "e_min": None if fit is None else fit.e_min,
                    "b20": None if o is None else o.b20,
                }
            )
        between = [
            {
                "lower": x.lower.key,
                "higher": x.higher.key,
                "b_crit_ratio": x.ratio,
                "intervals_overlap": x.overlap,
                "not_compared": x.why or None,
            }
            for x in steps
            if x.optimizer == label
        ]
        out.append({"optimizer": label, "by_target": rows, "b_crit_between_targets": between})
    return out


RERUN_FIELDS = ("seed", "number", "steps", "resolution", "budget", "heldout_steps", "b_simple", "stopped")


def _cell_json(c: analysis.CellResult) -> dict[str, Any]:
    s = c.stats
    return {
        "optimizer": s.optimizer,
        "batch": s.batch,
        "tuned": c.tuned,
        "planned": c.planned,
        "best": c.best,
        "reruns": [{k: getattr(r, k) for k in RERUN_FIELDS} for r in s.reruns],
        "steps_median": s.median,
        "steps_low": s.low,
        "steps_high": s.high,
        "budget_steps": s.budget,
        "resolution": s.resolution,
        "efficiency": s.efficiency,
        "efficiency_range": s.efficiency_range,
        "efficiency_below": s.efficiency_below,
        "runner_up_margin": s.margin,
        "seed_spread": s.spread,
        "tuning_decides": s.tuning_decides,
        "b_simple": s.b_simple,
        "b_simple_range": s.b_simple_range,
        "failed": c.failed,
    }


def _fit_json(fit: fitting.Fit | None) -> dict[str, Any] | None:
    if fit is None:
        return None
    return {**dataclasses.asdict(fit), "e_min": fit.e_min}


def _optimizer_json(o: statistics.OptimizerStats) -> dict[str, Any]:
    return {
        "optimizer": o.optimizer,
        "base_batch": o.base_batch,
        "fit": _fit_json(o.fit),
        "interval_95": {k: [v.low, v.high] for k, v in o.intervals.items()} or None,
        "leave_one_batch_out": [{"batch": x.batch, "fit": _fit_json(x.fit), "b_crit_inside_interval": x.inside} for x in o.left_out],
        "b20": o.b20,
        "b20_from_smallest_batch": o.b20_b0,
        "b20_measured": o.b20_measured,
        "b20_measured_range": list(o.b20_measured_range),
        "b_simple": o.b_simple,
        "b_simple_read_at_losses": None if o.b_simple_losses is None else list(o.b_simple_losses),
    }


def _comparison_json(c: statistics.Comparison) -> dict[str, Any]:
    return {
        "a": c.a,
        "b": c.b,
        "ratio": c.ratio,
        "interval_95": None if c.interval is None else [c.interval.low, c.interval.high],
        "separated": c.separated,
        "seeds": c.seeds,
        "seeds_needed": c.seeds_needed,
    }


def _head(spec: StudySpec, study: Any, url: str) -> dict[str, Any]:
    """The study, its file, its storage (credentials redacted) and the threads per trial recorded in it."""
    threads = {"threads_per_trial": study.user_attrs["threads"]} if "threads" in study.user_attrs else {}  # absent: not recorded
    return {
        "study": spec.name,
        "study_file": spec.path.name,
        "storage": "study.db in this folder (SQLite)" if url.endswith(str(spec.folder / "study.db")) else redact_text(url),
        **threads,
    }


def write(spec: StudySpec, study: Any, url: str, out: pathlib.Path, bootstrap_samples: int = 1000) -> list[pathlib.Path]:
    """Write report.json, the plots and report.md into ``out``; the paths written."""
    if not spec.optimizers:  # a study of branches or arms only: their sections and nothing else
        return _write_without_cells(spec, study, url, out, bootstrap_samples)
    data = build(spec, study, url, bootstrap_samples)
    sections = data.pop("_sections")
    several = len(sections) > 1
    series = [plots.Series(f"{s.target.value:g}" if several else "", s.cells, s.found.optimizers) for s in sections]
    label = f"{spec.target.metric} {', '.join(f'{s.target.value:g}' for s in sections)} ({data['reported_split']})"
    paths = [
        plots.steps_vs_batch(series, label, out / "steps_vs_batch.png"),
        plots.steps_vs_samples(series, label, out / "steps_vs_samples.png"),
    ]
    if spec.noise_scale is not None:
        paths.append(plots.noise_scale(series, float(spec.noise_scale["at_eval_loss"]), out / "noise_scale.png"))
    extra = _extra_sections(spec, study, out, bootstrap_samples)  # arms, the critical batch along training: each its own, at the end
    data.update({name: section.data for name, section in extra.items()})
    _replace(out / "report.json", json.dumps(_strict(data), indent=1, default=str, allow_nan=False) + "\n")
    text = markdown(spec, data, sections, [p.name for p in paths])
    _replace(out / "report.md", text + "".join(section.markdown for section in extra.values()))
    return [out / "report.md", out / "report.json", *paths, *(section.plot for section in extra.values())]


def _extra_sections(spec: StudySpec, study: Any, out: pathlib.Path, bootstrap_samples: int) -> dict[str, Any]:
    """The report's sections beside the cells': ``arms`` and ``branches``, where the study has them."""
    trials = study.get_trials(deepcopy=False)
    found: dict[str, Any] = {}
    if spec.arms:
        found["arms"] = arm_report.build(spec, trials, out, bootstrap_samples)
    if spec.branches is not None:
        found["branches"] = branch_report.build(spec, trials, out)
    return found


def _write_without_cells(spec: StudySpec, study: Any, url: str, out: pathlib.Path, bootstrap_samples: int) -> list[pathlib.Path]:
    extra = _extra_sections(spec, study, out, bootstrap_samples)
    data = {**_head(spec, study, url), "heldout_split": spec.data["heldout"], **{name: s.data for name, s in extra.items()}}
    _replace(out / "report.json", json.dumps(_strict(data), indent=1, default=str, allow_nan=False) + "\n")
    threads = f" {data['threads_per_trial']} thread(s) per trial." if "threads_per_trial" in data else ""
    title = " and ".join({"arms": "recipes compared over seeds", "branches": "the critical batch along training"}[n] for n in extra)
    lines = [
        f"# Study `{spec.name}`: {title}",
        "",
        f"Written from the storage ({data['storage']}) by `largebatch study report {spec.path.name}` (`study run` writes it too). "
        f"Held-out split `{data['heldout_split']}`.{threads}",
    ]
    _replace(out / "report.md", "\n".join(lines) + "\n" + "".join(s.markdown for s in extra.values()))
    return [out / "report.md", out / "report.json", *(s.plot for s in extra.values())]


def _strict(value: Any) -> Any:
    """``value`` with every infinite or NaN number as null (strict JSON: an open bound, a
    seed that did not reach the target, a crossing at the first evaluation)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    return value


def _replace(path: pathlib.Path, text: str) -> None:
    """Write ``path`` whole or not at all: workers finishing together may both write the report."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(text)
    os.replace(temporary, path)


def _sign(t: Target) -> str:
    return ">=" if t.mode == "max" else "<="


def _aim(t: Target) -> str:
    """``top1 >= 0.78``."""
    return f"{t.metric} {_sign(t)} {t.value:g}"


def markdown(spec: StudySpec, data: dict[str, Any], sections: list[Section], images: list[str]) -> str:
    """report.md: the protocol, then each target's figures (with several targets, a summary
    of the critical batch by target first and a part per target), the failures, the time."""
    several = len(sections) > 1
    t = spec.target
    sign = _sign(t)
    values = [f"{s.target.value:g}" for s in sections]
    aims = f"{t.metric} {sign} {', '.join(values[:-1])} and {values[-1]}" if several else _aim(t)
    batches = list(spec.batches)
    labels = [o.label for o in spec.optimizers]
    lines = [
        f"# Study `{spec.name}`: steps to {aims}",
        "",
        f"Written from the storage ({data['storage']}) by `largebatch study report {spec.path.name}` (`study run` writes it too).",
    ]
    if several:
        lines += _summary_section(sections)
    choice = (
        "for each target, the choice is the trial that reaches it"
        if several
        else f"the choice is the trial that reaches {t.metric} {sign} {t.value:g}"
    )
    lines += [
        "",
        "## Protocol",
        "",
        f"- Base config `{spec.base_config.name}` with {len(spec.overrides)} study override(s); cells: {', '.join(labels)} at global "
        f"batches {', '.join(f'{b:,}' for b in batches)}.",
        f"- Tuning, the same in every cell: {spec.trials} trials, {_sampling(spec)}, training seed {spec.tune_seed}; "
        f"{choice} on the held-out split "
        f"`{data['heldout_split']}` in the fewest steps (none: the best held-out value at its end). A tuning trial stops once it "
        f"can no longer beat its cell's best so far{' for any target' if several else ''}.",
        f"- Re-runs: each cell's choice{' for each target (targets with the same choice share its re-runs)' if several else ''} "
        f"with seeds {', '.join(map(str, spec.seeds))}; every figure below is the median "
        f"[min, max] over them, on the `{data['reported_split']}` split, which no choice was made on.",
        f"- Evaluation: steps {spec.evaluation['coarse']}x apart; "
        + (
            (
                f"around the first crossing, every copy of the weights kept every {spec.evaluation['fine']}x steps between the "
                "two evaluations is evaluated (held-out curves dip, so none is skipped)"
                if "threads_per_trial" in data
                # a storage without a recorded thread count was written by the version before, whose
                # refining bisected the kept copies (both changed together)
                else f"around a crossing, the weights kept every {spec.evaluation['fine']}x steps between the two evaluations "
                "are evaluated by bisection"
            )
            if spec.evaluation["refine"]
            else f"{spec.evaluation['fine']}x apart within {spec.evaluation['dense_within']:g} of the target"
        )
        + "; steps to target interpolated linearly in log(step) between the two evaluations around the crossing.",
    ]
    if not several:
        lines.append(_resolution_line(sections[0].found.resolution, t, data["reported_split"]))
    shown = [p for p in PARAMS if any(p == q["param"] for s in data["search"].values() for q in s)]
    lines += [
        "",
        "Search space (ranges at the smallest batch; `sqrt`/`linear`: both ends scale with the batch):",
        "",
        "| optimizer | " + " | ".join(shown) + " |",
        "|---|" + "---|" * len(shown),
    ]
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
    for section in sections:
        part = _target_sections(spec, data, section, shown)
        if several:
            part = [
                "",
                f"## Target {_aim(section.target)}",
                "",
                _resolution_line(section.found.resolution, section.target, data["reported_split"]),
                *("#" + line if line.startswith("## ") else line for line in part),
            ]
        lines += part
    lines += _failure_section(sections[0].cells)  # a cell's failed trials are the same for every target
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


def _target_sections(spec: StudySpec, data: dict[str, Any], section: Section, shown: list[str]) -> list[str]:
    """One target's figures: steps, efficiencies, the fit, leaving a batch out, what the
    statistics separate, the choices at an edge and each cell's choice."""
    t, cells, found = section.target, section.cells, section.found
    batches = list(spec.batches)
    by = {(c.optimizer, c.batch): c for c in cells}
    labels = [o.label for o in spec.optimizers]
    header = "| optimizer | " + " | ".join(f"{b:,}" for b in batches) + " |"
    rule = "|---|" + "---:|" * len(batches)
    lines = [
        "",
        f"## Steps to {_aim(t)} on `{data['reported_split']}`",
        "",
        f"Median [range] over seeds; `{EDGE_MARK}`: the cell's choice sits in the outer 10% of a searched range or at the shortest or longest epoch budget its cell allowed; `{TUNING_MARK}`: its "
        "margin over the runner-up tuning trial lies within its seeds' spread, so tuning, not the batch, decides its figure (see below).",
        "",
        header,
        rule,
    ]
    for label in labels:
        row = [_steps(by[(label, b)].stats) + _marks(by[(label, b)]) for b in batches]
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    lines += [
        "",
        "Scaling efficiency against each optimizer's smallest batch that reached the target (1: perfect scaling; `< e`: not reached, bounded by the budget):",
        "",
        header,
        rule,
    ]
    for label in labels:
        lines.append(f"| {label} | " + " | ".join(_efficiency(by[(label, b)].stats) for b in batches) + " |")
    lines += _fit_section(found.optimizers, spec, data["bootstrap_samples"])
    lines += _left_out_section(found.optimizers)
    lines += _separation_section(found.comparisons)
    lines += _edge_section(spec, cells)
    lines += _choices_section(spec, cells, shown)
    return lines


def _summary_section(sections: list[Section]) -> list[str]:
    """The critical batch by target: per optimizer, each target's fit, then whether the
    B_crit intervals of consecutive targets separate them."""
    lines = [
        "",
        "## Critical batch by target",
        "",
        "Each target's fit S = S_min (1 + B_crit / B) (its part below gives the details): E_min = S_min B_crit in samples, "
        "B_20% = 0.2 B_crit, B_crit with its 95% bootstrap interval. The critical batch grows as the loss falls (McCandlish et "
        "al. 2018; Zhang et al. 2024); these trials show it grow only where the intervals of two targets do not overlap.",
        "",
        "| optimizer | target | S_min | B_crit | E_min (samples) | B_20% | runs |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for label in _labels(sections):
        for target, o in _fits(sections, label):
            if o is None or o.fit is None:
                lines.append(f"| {label} | {_aim(target)} | - | - | - | - | too few batches reached the target |")
                continue
            b_crit = _band(o.intervals, "b_crit", o.fit.b_crit) + (f" ({o.fit.bounded} the batches measured)" if o.fit.bounded else "")
            lines.append(
                f"| {label} | {_aim(target)} | {_num(o.fit.s_min)} | {b_crit} | {_num(o.fit.e_min)} | {_num(o.b20)} | "
                f"{o.fit.reached} reached, {o.fit.censored} not |"
            )
    lines.append("")
    by = {s.target: s for s in sections}
    for step in growth(sections):
        a, b = (_fits([by[t]], step.optimizer)[0][1] for t in (step.lower, step.higher))
        between = f"{step.optimizer}, {_aim(step.lower)} to {step.higher.value:g}"
        if step.overlap is None:
            lines.append(f"- {between}: not compared ({step.why}).")
            continue
        assert a is not None and b is not None and a.fit is not None and b.fit is not None and step.ratio is not None
        figures = f"B_crit {_band(a.intervals, 'b_crit', a.fit.b_crit)} then {_band(b.intervals, 'b_crit', b.fit.b_crit)}"
        if step.overlap:
            lines.append(f"- {between}: {figures}; the intervals overlap, so these trials do not separate the two critical batches.")
        else:
            lines.append(
                f"- {between}: {figures}; the intervals do not overlap: B_crit {'grows' if step.ratio > 1 else 'falls'} {step.ratio:.2f}x."
            )
    return lines


def _marks(cell: analysis.CellResult) -> str:
    return (f" {EDGE_MARK}" if (cell.best or {}).get("edges") else "") + (f" {TUNING_MARK}" if cell.stats.tuning_decides else "")


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    return "unbounded (reached at the first evaluation)" if math.isinf(value) else f"{100 * value:.1f}%"


def _sampling(spec: StudySpec) -> str:
    """How a cell's tuning points were drawn, in the report's words."""
    sobol = f"scrambled Sobol sequence (Optuna's QMCSampler, seed {spec.sampler_seed})"
    if spec.quasi_random >= spec.trials:
        return f"all at the first {spec.trials} points of a {sobol}"
    return (
        f"the first {spec.quasi_random} at the first points of a {sobol}, the other {spec.trials - spec.quasi_random} "
        "proposed one at a time by Optuna's multivariate TPE from the cell's finished trials (seeded by the cell and the slot: "
        "the same storage gives the same points)"
    )


def _resolution_line(res: statistics.Resolution, t: Any, split: str) -> str:
    line = (
        f"- **Resolution**: the evaluations around a reported crossing are {_pct(res.median)} apart at the median over its "
        f"{res.crossings} crossings, {_pct(res.worst)} at worst; a steps figure is known to that relative precision"
    )
    if res.standard_error is None or res.samples is None:
        return line + "."
    return (
        line + f". The `{split}` split's {res.samples:,} samples measure {t.metric} near {t.value:g} with a standard error of "
        f"{100 * res.standard_error:.2f} points (sqrt(p (1 - p) / n)): a shift of one standard error moves a crossing by "
        f"{_pct(res.steps_per_error)} of its steps (median over the crossings, from the curve's slope there)."
    )


def _fit_section(optimizers: list[statistics.OptimizerStats], spec: StudySpec, samples: int) -> list[str]:
    lines = [
        "",
        "## Critical batch",
        "",
        "S = S_min (1 + B_crit / B) fitted to every re-run by a censored likelihood on log steps (a run that did not reach the "
        "target counts as more steps than it ran); E_min = S_min B_crit; sigma: the noise of log steps about the fit. 95% "
        f"percentile intervals from {samples:,} bootstrap replicates that redraw each cell's seeds and its tuning choice. "
        "B_20% (Zhang et al. 2024): where steps exceed the fit's perfect scaling E_min / B by 20%, 0.2 B_crit; beside it, "
        "the same 20% against perfect scaling from the smallest batch B0, from the fit (1.2 B0 + 0.2 B_crit) and from the "
        "measured efficiencies (interpolated in log batch; range from the seeds' extremes).",
        "",
        "| optimizer | S_min | B_crit | E_min (samples) | sigma | B_20% | B0-relative: fit, measured | B_simple | runs |",
        "|---|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for o in optimizers:
        if o.fit is None:
            lines.append(f"| {o.optimizer} | - | - | - | - | - | - | {_num(o.b_simple)} | too few batches reached the target |")
            continue
        iv = o.intervals
        b_crit = _band(iv, "b_crit", o.fit.b_crit) + (f" ({o.fit.bounded} the batches measured)" if o.fit.bounded else "")
        low, high = o.b20_measured_range
        measured = "-" if o.b20_measured is None else f"{_num(o.b20_measured)} [{_num(low)}, {_num(high)}]"
        runs = f"{o.fit.reached} reached, {o.fit.censored} not"
        lines.append(
            f"| {o.optimizer} | {_band(iv, 's_min', o.fit.s_min)} | {b_crit} | {_band(iv, 'e_min', o.fit.e_min)} | {o.fit.sigma:.3f} | "
            f"{_band(iv, 'b20', o.b20)} | {_num(o.b20_b0)}, {measured} | {_num(o.b_simple)} | {runs} |"
        )
    if spec.noise_scale is not None:
        lines += [
            "",
            f"B_simple: the `noise_scale` hook's estimate at the first evaluation with held-out loss <= {spec.noise_scale['at_eval_loss']:g} in the re-runs (micro-batch against the step's batch, at least {spec.noise_scale['min_ratio']}x apart), median over every re-run of the optimizer."
            + _read_at(optimizers),
        ]
    return lines


def _read_at(optimizers: list[statistics.OptimizerStats]) -> str:
    """The held-out losses B_simple was read at: B_simple grows as the loss falls, so a read
    below the fixed loss is larger than at it."""
    parts = [f"{o.optimizer} {o.b_simple_losses[0]:.3f} to {o.b_simple_losses[1]:.3f}" for o in optimizers if o.b_simple_losses is not None]
    return f" The evaluations it was read at had held-out losses of {'; '.join(parts)} (B_simple grows as the loss falls)." if parts else ""


def _band(intervals: dict[str, statistics.Interval], name: str, value: float | None) -> str:
    """``value [low, high]`` with its bootstrap interval, when there is one."""
    if name not in intervals:
        return _num(value)
    return f"{_num(value)} [{_num(intervals[name].low)}, {_num(intervals[name].high)}]"


def _left_out_section(optimizers: list[statistics.OptimizerStats]) -> list[str]:
    fitted = [o for o in optimizers if o.fit is not None and o.left_out]
    if not fitted:
        return []
    batches = sorted({x.batch for o in fitted for x in o.left_out})
    lines = [
        "",
        "## Leave one batch out",
        "",
        "B_crit fitted without each batch in turn; `out`: outside the full fit's 95% interval (the fit rests on that batch).",
        "",
        "| optimizer | B_crit | " + " | ".join(f"without {b:,}" for b in batches) + " |",
        "|---|---:|" + "---:|" * len(batches),
    ]
    for o in fitted:
        assert o.fit is not None
        by = {x.batch: x for x in o.left_out}
        row = []
        for b in batches:
            x = by.get(b)
            if x is None or x.fit is None:
                row.append("-")
                continue
            row.append(_num(x.fit.b_crit) + (" out" if x.inside is False else "") + (f" ({x.fit.bounded})" if x.fit.bounded else ""))
        lines.append(f"| {o.optimizer} | {_band(o.intervals, 'b_crit', o.fit.b_crit)} | " + " | ".join(row) + " |")
    moved = [f"{o.optimizer} without {x.batch:,}" for o in fitted for x in o.left_out if x.inside is False]
    lines += ["", "B_crit moves outside its interval: " + ("; ".join(moved) if moved else "never") + "."]
    return lines


def _separation_section(comparisons: list[statistics.Comparison]) -> list[str]:
    lines = [
        "",
        "## What the statistics separate",
        "",
        "Ratio of median steps (second cell over first) with its 95% bootstrap interval over seeds and the tuning choice; two "
        "cells differ when the interval excludes 1. Where it does not, the seeds per cell that would separate them were the "
        "ratio as measured (the interval taken to narrow as 1/sqrt(seeds); the tuning choice's part does not narrow: a lower bound).",
        "",
        "| cells | ratio | 95% interval | differ | seeds that would separate them |",
        "|---|---:|---|---|---:|",
    ]
    for c in comparisons:
        if c.interval is None or c.ratio is None:
            continue
        needed = (
            "-"
            if c.separated
            else _num(c.seeds_needed)
            if c.seeds_needed is not None
            else "none: " + ("equal medians" if c.ratio == 1 else "the interval is open (a replicate's median not reached)")
        )
        interval = f"[{c.interval.low:.2f}, {'inf' if math.isinf(c.interval.high) else f'{c.interval.high:.2f}'}]"
        lines.append(f"| {c.a} / {c.b} | {c.ratio:.2f} | {interval} | {'yes' if c.separated else 'no'} | {needed} |")
    missing = [f"{c.a} / {c.b}" for c in comparisons if c.interval is None]
    if missing:
        lines += ["", "Not comparable (a median is missing: most seeds did not reach the target): " + "; ".join(missing) + "."]
    apart = [c for c in comparisons if c.separated]
    together = [c for c in comparisons if c.separated is False]
    compared = len(apart) + len(together)
    lines += [
        "",
        f"{len(apart)} of {compared} comparable pairs differ. Each interval holds 95%: were none of the {compared} pairs "
        f"different, about {compared / 20:.1f} would appear to differ by chance.",
    ]
    return lines


def _edge_section(spec: StudySpec, cells: list[analysis.CellResult]) -> list[str]:
    lines = ["", "## Choices at the edge of a searched range", ""]
    marked = [(c, e) for c in cells if c.best for e in c.best["edges"]]
    if not marked:
        return lines + ["No cell's choice sits in the outer 10% of a searched range or at an end of its cell's epoch budgets."]
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
        "Held-out steps of the choice; margin: its runner-up's held-out steps over its own, less 1; spread: its re-runs' "
        f"held-out steps, largest over smallest, less 1. `{TUNING_MARK}`: a margin within the spread (which tuning trial won "
        "is inside the seeds' noise, so tuning, not the batch, decides the cell's figure).",
        "",
        "| cell | trial | " + " | ".join(shown) + " | held-out steps | margin | spread | re-runs |",
        "|---|---:|" + "---:|" * (len(shown) + 4),
    ]
    for c in cells:
        if c.best is None:
            lines.append(f"| {c.key} | - | " + " | ".join("-" for _ in shown) + f" | - | - | - | tuned {c.tuned}/{c.planned} |")
            continue
        params = " | ".join(_num(c.best["params"].get(name)) for name in shown)
        margin, spread = _pct(c.stats.margin), _pct(c.stats.spread).replace("unbounded (reached at the first evaluation)", "open")
        mark = f" {TUNING_MARK}" if c.stats.tuning_decides else ""
        lines.append(
            f"| {c.key} | #{c.best['number']} | {params} | {_num(c.best['heldout_steps'])} | {margin}{mark} | {spread} | "
            f"{len(c.stats.reruns)}/{len(spec.seeds)} |"
        )
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
    """``study status``: per cell, tuning trials done/running/failed, then per target its
    choice's re-runs and the steps so far."""
    from optuna.trial import TrialState

    trials = [t for t in study.get_trials(deepcopy=False) if "duplicate_of" not in ledger.attrs(t)]
    counts = {s: sum(t.state == s for t in trials) for s in TrialState}
    several = len(spec.targets) > 1
    lines = [
        f"study {spec.name} in {url}: {counts[TrialState.COMPLETE]} trials complete, {counts[TrialState.RUNNING]} running, "
        f"{counts[TrialState.WAITING]} waiting, {ledger.endings(trials)}",
        "",
    ]
    if spec.optimizers:  # none: a study of branches only
        lines.append(
            f"{'cell':<18} {'tuned':>7} {'running':>8} "
            + ("  per target: re-runs, steps to it (median [range])" if several else f"{'re-runs':>8}  steps to target (median [range])")
        )
    skipped = ledger.skipped(study)
    per_target = [analysis.collect(spec, trials, skipped, target, samples=0)[0] for target in spec.targets] if spec.optimizers else []
    running: dict[tuple[Any, Any], int] = {}
    for t in trials:
        if t.state == TrialState.RUNNING:
            key = (ledger.attrs(t).get("optimizer"), ledger.attrs(t).get("batch"))
            running[key] = running.get(key, 0) + 1
    for index, c in enumerate(per_target[-1] if per_target else []):
        progress = [len(cs[index].stats.reruns) for cs in per_target]
        steps = [_steps(cs[index].stats) for cs in per_target]
        line = f"{c.key:<18} {c.tuned:>3}/{c.planned:<3} {running.get((c.stats.optimizer, c.stats.batch), 0):>8} "
        if several:
            line += "  " + "; ".join(f"{t.key}: {n}/{len(spec.seeds)}, {x}" for t, n, x in zip(spec.targets, progress, steps, strict=True))
        else:
            line += f"{progress[0]:>4}/{len(spec.seeds):<3}  {steps[0]}"
        lines.append(line)
    if spec.arms:
        lines.append(arm_report.status_line(spec, trials))
    if spec.branches is not None:
        lines.append(branch_report.status_line(spec, trials))
    for c in per_target[-1] if per_target else []:
        for f in c.failed:
            last = (f["error"].strip().splitlines() or ["?"])[-1][:200]
            decided = "skipped" if f["skipped"] else "run again with --retry-failed or skip with --skip-failed"
            lines.append(f"failed: trial {f['number']} {f['key']} ({f['failure']}): {last}; {decided}")
    return "\n".join(lines) + "\n"
