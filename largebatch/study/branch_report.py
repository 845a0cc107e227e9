"""The report's section on the critical batch along training (``branches``): the CBS(t)
table in report.md and report.json, and ``critical_batch.png`` (``branch_plots``), from
the storage alone."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from largebatch.study import branch_plots, branch_trials, branches


@dataclasses.dataclass(frozen=True)
class Section:
    """What the report adds: its plain data, its markdown, its figure."""

    data: dict[str, Any]
    markdown: str
    plot: pathlib.Path


def build(spec: Any, trials: list[Any], out: pathlib.Path) -> Section:
    """The section from the study's trials (``spec.branches`` set); writes the figure into ``out``."""
    section = spec.branches
    rows = branches.table(branch_trials.results(spec, trials), section["ks"], section["seeds"], float(section["tolerance"]))
    rules = sorted({r["lr_rule"] for r in branch_trials.results(spec, trials)})
    data = {
        "run": section["run"],
        "ks": section["ks"],
        "samples": section["samples"],
        "seeds": section["seeds"],
        "tolerance": section["tolerance"],
        "lr_rule": section["lr_rule"] or (rules[0] if len(rules) == 1 else None),
        "rows": [row.to_dict() for row in rows],
    }
    plot = branch_plots.critical_batch(rows, out / "critical_batch.png")
    return Section(data, _markdown(data, rows), plot)


def status_line(spec: Any, trials: list[Any]) -> str:
    """``study status``'s line on the branches: complete of planned, and running."""
    section = spec.branches
    done = len(branch_trials.results(spec, trials))
    running = sum(t.state.name == "RUNNING" and t.user_attrs.get("phase") == branch_trials.PHASE for t in trials)
    planned = len(section["ks"]) * len(section["seeds"]) * len(section["at_samples"]) if section["at_samples"] else None
    of = f" of {planned}" if planned is not None else ""
    return f"branches from {section['run']}: {done}{of} complete, {running} running"


def _num(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _markdown(data: dict[str, Any], rows: list[branches.Row]) -> str:
    ks = data["ks"]
    tolerance = data["tolerance"]
    lines = [
        "",
        "## The critical batch along training",
        "",
        f"Branches from the checkpoints of `{data['run']}`: at k x its batch B for k in {', '.join(map(str, ks))}, each trained on "
        f"{data['samples']:,} samples from the checkpoint with its weights and optimizer state, a constant learning rate (the run's "
        f"at the checkpoint times the `{data['lr_rule']}` rule's factor), seeds {', '.join(map(str, data['seeds']))}. Efficiency: "
        "(L0 - L(k)) / (L0 - L(1)) on the held-out loss, L0 at the checkpoint, mean over seeds. The critical k is the largest k "
        f"with every k up to it at least {1 - tolerance:g} efficient (tolerance {tolerance:g}); the critical batch interpolates in "
        "log k where the efficiency falls through it (`>=`: every k was efficient). B_simple: the run's `noise_scale` hook at the "
        "checkpoint. In brackets: each seed on its own (the seeds are paired: every k of a seed sees the same samples).",
        "",
        "| samples seen | step | L0 | L(1) | "
        + " | ".join(f"eff. k={k}" for k in ks if k != 1)
        + " | critical k [seeds] | critical batch [seeds] | B_simple |",
        "|---:|---:|---:|---:|" + "---:|" * (len(ks) - 1) + "---|---:|---:|",
    ]
    for row in rows:
        c = row.critical
        mean_l1 = sum(row.losses.get(1, {}).values()) / len(row.losses[1]) if row.losses.get(1) else None
        if c is None or c.k is None:
            why = f"{row.missing} branch(es) to run" if row.missing else "no progress at k = 1"
            effs, choice, batch = ["-"] * (len(ks) - 1), why, "-"
        else:
            effs = [_num(c.efficiency.get(k), 3) for k in ks if k != 1]
            seeds = [v for v in c.k_by_seed.values() if v is not None]
            choice = f"{c.k} [{min(seeds)}, {max(seeds)}]" if seeds else str(c.k)
            batches = [v for v in c.batch_by_seed.values() if v is not None]
            spread = f" [{min(batches):,.0f}, {max(batches):,.0f}]" if batches else ""
            batch = (">= " if c.bound else "") + f"{c.batch:,.0f}{spread}"
        lines.append(
            f"| {row.samples:,} | {row.step:,} | {_num(row.start_loss)} | {_num(mean_l1)} | "
            + " | ".join(effs)
            + f" | {choice} | {batch} | {_num(row.b_simple, 3)} |"
        )
    lines += ["", "![critical_batch.png](critical_batch.png)"]
    return "\n".join(lines) + "\n"
