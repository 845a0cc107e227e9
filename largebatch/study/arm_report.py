"""The report's section on a study's ``arms``: per arm, the median and range over seeds of
the steps, samples and training seconds to each target and of the final test value;
pairwise, which differences the seeds separate; ``arms.png`` (``arm_plots``); from the
storage alone.

**Separation.** Two arms differ on a measure when the exact two-sided rank test over their
seeds (``statistics.rank_sum_test``, every split of the pooled seeds enumerated) gives
p <= ``ALPHA``. With few seeds the test cannot get there whatever the values: its smallest
p-value with a and b seeds is 2 / C(a + b, a) for a = b (0.1 with 3 and 3), stated beside
each comparison, and such a pair is never called separated. Beside it, the ratio of medians
(second arm over first) and its bootstrap interval over seeds (``statistics.compare``);
for a pair not separated, the seeds per arm that would separate it were the ratio as
measured: the bootstrap interval's width taken to narrow as 1 / sqrt(seeds), and at least
the seeds at which the test can reach ``ALPHA`` (``statistics.seeds_to_resolve``).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import statistics as stats
from typing import Any

from largebatch.study import arm_plots, arm_trials
from largebatch.study import statistics as study_statistics
from largebatch.study.numbers import number_text as _num
from largebatch.study.target import Crossing

ALPHA = 0.05
MEASURES = (("steps", "steps"), ("samples", "samples"), ("seconds", "training seconds"))


@dataclasses.dataclass(frozen=True)
class Section:
    """What the report adds: its plain data, its markdown, its figure."""

    data: dict[str, Any]
    markdown: str
    plot: pathlib.Path


def summary(values: list[float | None]) -> dict[str, Any]:
    """Median and range over seeds (None: not reached, counted as more than any reached
    value): no median unless more than half reached it, no upper end if one did not."""
    ordered = sorted(math.inf if v is None else v for v in values)
    if not ordered:
        return {"median": None, "low": None, "high": None, "reached": 0, "seeds": 0}
    middle = stats.median(ordered)
    finite = [v for v in ordered if math.isfinite(v)]
    return {
        "median": None if math.isinf(middle) else middle,
        "low": finite[0] if finite else None,
        "high": None if math.isinf(ordered[-1]) else ordered[-1],
        "reached": len(finite),
        "seeds": len(ordered),
    }


def build(spec: Any, trials: list[Any], out: pathlib.Path, bootstrap_samples: int = 1000) -> Section:
    """The section from the study's trials (``spec.arms`` set); writes the figure into ``out``."""
    found = arm_trials.results(spec, trials)
    targets = [t.key for t in spec.targets]
    rows, arms = [], []
    for arm in spec.arms:
        mine = sorted((r for r in found if r["arm"] == arm.label), key=lambda r: r["seed"])
        per_seed = [_trial_row(spec, r, targets) for r in mine]
        rows += per_seed
        entry: dict[str, Any] = {
            "label": arm.label,
            "set": list(arm.overrides),
            "seeds": list(arm.seeds),
            "done": len(per_seed),
            "targets": {t: {m: summary([r["targets"][t][m] for r in per_seed]) for m, _ in MEASURES} for t in targets},
            "final": summary([r["final"] for r in per_seed]),
            "totals": {m: summary([r["totals"][m] for r in per_seed]) for m, _ in MEASURES},
            "seeds_steps": {t: [r["targets"][t]["steps"] for r in per_seed] for t in targets},
        }
        arms.append(entry)
    comparisons = []
    for t in targets:
        for measure, name in MEASURES:
            values = {a["label"]: [r["targets"][t][measure] for r in rows if r["arm"] == a["label"]] for a in arms if a["done"]}
            comparisons += [
                _comparison(f"{name} to {t}", c) for c in study_statistics.seed_comparisons(values, True, bootstrap_samples, ALPHA)
            ]
    finals = {a["label"]: [r["final"] for r in rows if r["arm"] == a["label"]] for a in arms if a["done"]}
    lower = spec.target.mode == "min"
    comparisons += [
        _comparison(f"final {spec.target.metric}", c) for c in study_statistics.seed_comparisons(finals, lower, bootstrap_samples, ALPHA)
    ]
    # a crossing at the first evaluation has no lower end: an unbounded width (null in report.json)
    widths = sorted(
        math.inf if c["resolution"] is None else c["resolution"] for r in rows for c in r["targets"].values() if c["steps"] is not None
    )
    data = {
        "split": spec.data["heldout"],
        "final_split": spec.data["test"] or spec.data["heldout"],
        "alpha": ALPHA,
        "seeds_to_resolve": study_statistics.seeds_to_resolve(ALPHA),
        "resolution": {
            "median": stats.median(widths) if widths else None,
            "worst": widths[-1] if widths else None,
            "crossings": len(widths),
        },
        "arms": arms,
        "trials": rows,
        "comparisons": comparisons,
    }
    plot = arm_plots.steps_to_target(arms, targets, data["split"], out / "arms.png")
    return Section(data, _markdown(spec, data), plot)


def _trial_row(spec: Any, result: dict[str, Any], targets: list[str]) -> dict[str, Any]:
    """One trial's figures: per target its held-out crossing (steps, samples, training
    seconds, the bracket's relative width), its final value and totals, its batch log."""
    outcome = result["outcome"]
    crossings = {t: (outcome.get("crossings", {}).get(t) or {}).get("eval") for t in targets}
    return {
        "arm": result["arm"],
        "seed": result["seed"],
        "number": result["number"],
        "targets": {
            t: {
                "steps": None if c is None else c["steps"],
                "samples": None if c is None else c.get("samples"),
                "seconds": None if c is None else c.get("seconds"),
                "resolution": None if c is None else _finite(Crossing.from_dict(c).resolution),  # type: ignore[union-attr]
            }
            for t, c in crossings.items()
        },
        "final": outcome.get("final_test"),
        "totals": {"steps": outcome.get("steps_total"), "samples": outcome.get("samples_total"), "seconds": outcome.get("train_seconds")},
        "stopped": outcome.get("stopped"),
        "batch_log": outcome.get("batch_log") or {},
    }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _comparison(measure: str, c: study_statistics.SeedComparison) -> dict[str, Any]:
    return {
        "measure": measure,
        "a": c.a,
        "b": c.b,
        "ratio": c.ratio,
        "interval": None if c.interval is None else [c.interval.low, c.interval.high],
        "p": c.p,
        "smallest_p": c.smallest_p,
        "separated": c.separated,
        "seeds_needed": c.seeds_needed,
    }


def status_line(spec: Any, trials: list[Any]) -> str:
    """``study status``'s line on the arms: complete of planned, and running."""
    done = len(arm_trials.results(spec, trials))
    running = sum(t.state.name == "RUNNING" and t.user_attrs.get("phase") == arm_trials.PHASE for t in trials)
    return f"arms: {done} of {len(arm_trials.keys(spec))} complete, {running} running"


def _spread(s: dict[str, Any]) -> str:
    """``median [low, high]``; ``>`` an open upper end; the seeds that reached it when not all."""
    if not s["seeds"]:
        return "-"
    if s["median"] is None:
        return f"{s['reached']}/{s['seeds']} reached"
    high = _num(s["high"]) if s["high"] is not None else "not reached"
    return f"{_num(s['median'])} [{_num(s['low'])}, {high}]"


def _pct(value: float | None) -> str:
    return "unbounded (reached at the first evaluation)" if value is None else f"{100 * value:.1f}%"


def _markdown(spec: Any, data: dict[str, Any]) -> str:
    targets = [t.key for t in spec.targets]
    metric = spec.target.metric
    res = data["resolution"]
    lines = [
        "",
        "## Comparing recipes",
        "",
        f"Each arm trains with the study's `set`, then its own, to its own end (no early stop), once per seed. Steps, samples "
        f"and training seconds to each target are read where the `{data['split']}` (held-out) split first reached it on the "
        f"study's evaluation schedule; the final {metric} is the `{data['final_split']}` split's at the end. Training seconds: wall "
        "time from the start of training, less the time spent evaluating and copying weights for the evaluations (a crossing's "
        "samples and seconds are read between the steps recorded around it). Median [range] over seeds.",
        "",
        f"- **Resolution**: the evaluations around a crossing are {_pct(res['median'])} apart at the median over its "
        f"{res['crossings']} crossings, {_pct(res['worst'])} at worst; a steps, samples or seconds figure is known to that "
        "relative precision."
        if res["crossings"]
        else "- **Resolution**: no arm has reached a target yet.",
        "",
        "| arm | seeds | "
        + " | ".join(f"{m} to {t}" for t in targets for _, m in MEASURES)
        + f" | final {metric} | steps | samples | training seconds |",
        "|---|---:|" + "---:|" * (3 * len(targets) + 4),
    ]
    for arm in data["arms"]:
        cells = [_spread(arm["targets"][t][m]) for t in targets for m, _ in MEASURES]
        totals = [_spread(arm["totals"][m]) for m, _ in MEASURES]
        lines.append(
            f"| {arm['label']} | {arm['done']}/{len(arm['seeds'])} | " + " | ".join([*cells, _spread(arm["final"]), *totals]) + " |"
        )
    lines += ["", "Each arm's overrides, after the study's `set`:", ""]
    lines += [f"- `{arm['label']}`: " + (" ".join(f"`{s}`" for s in arm["set"]) or "none") for arm in data["arms"]]
    logged = [(r, name, changes) for r in data["trials"] for name, changes in r["batch_log"].items() if len(changes) > 1]
    if logged:
        lines += ["", "What the runs logged about a changing batch (`batch/*` in metrics.jsonl: step -> value where it changed):", ""]
        lines += [
            f"- {r['arm']} seed {r['seed']}, `{name}`: " + ", ".join(f"{_num(s)} -> {_num(v)}" for s, v in changes)
            for r, name, changes in logged
        ]
    lines += [
        "",
        "### Which differences the seeds separate",
        "",
        f"Exact two-sided rank test over seeds (every split of the pooled seeds): separated when p <= {data['alpha']:g}. The "
        "smallest p the test can give with these seeds is stated: where it is above the level, no difference can be called, "
        f"whatever the values (it takes {data['seeds_to_resolve']} seeds per arm to reach {data['alpha']:g}). Ratio: second arm's "
        "median over the first's, with its 95% bootstrap interval over seeds; seeds needed: per arm, were the ratio as "
        "measured (the interval narrowing as 1/sqrt(seeds), and at least the seeds the test needs).",
        "",
        "| measure | arms | ratio | 95% interval | p | smallest p | separated | seeds needed |",
        "|---|---|---:|---|---:|---:|---|---:|",
    ]
    for c in data["comparisons"]:
        interval = (
            "-" if c["interval"] is None else "[" + ", ".join("inf" if v is None or math.isinf(v) else _num(v) for v in c["interval"]) + "]"
        )
        needed = "-" if c["separated"] or c["seeds_needed"] is None else str(c["seeds_needed"])
        lines.append(
            f"| {c['measure']} | {c['a']} / {c['b']} | {_num(c['ratio'])} | {interval} | {c['p']:.3g} | {c['smallest_p']:.3g} | "
            f"{'yes' if c['separated'] else 'no'} | {needed} |"
        )
    separated = sum(c["separated"] for c in data["comparisons"])
    lines += [
        "",
        f"{separated} of {len(data['comparisons'])} comparisons separated. Each holds at {data['alpha']:g}: were no arm different, "
        f"about {len(data['comparisons']) * data['alpha']:.1f} would appear separated by chance (the measures of one pair are "
        "not independent: steps, samples and seconds to a target move together).",
        "",
        "![arms.png](arms.png)",
    ]
    return "\n".join(lines) + "\n"
