"""A study's ``branches`` section as trials: the critical batch along a run (``branches``).

::

    branches = dict(
        run="runs/source",          # a run directory with checkpoints, relative to the study file
        at_samples=[4096, 16384],   # the checkpoints to branch from, by samples seen (None: every checkpoint)
        ks=[1, 2, 4, 8],            # branches at k x the run's global batch
        samples=8192,               # samples each branch trains on, the same for every k
        seeds=[1, 2, 3],            # None: the study's seeds
        tolerance=0.2,              # a branch may lose this fraction of the k = 1 branch's progress
        lr_rule=None,               # 'sqrt', 'linear' or 'none'; None: by the run's optimizer
    )

Each (checkpoint, k, seed) is one trial in the study's storage, claimed and run by the
study's workers like any other (``study run``, Slurm array workers), with the key
``branch/<run>/n<samples seen>/k<k>/d<samples>/<rule>/s<seed>``. A branch is
``largebatch train --config <run>/config.yaml --branch-from <checkpoint>`` (the
checkpoint's weights and optimizer state, counters from zero) with overrides: the global
batch k x B, the source run's micro-batch, the seed, a constant learning rate equal to the
source schedule's at the checkpoint's step times the rule's multiplier
(``branches.lr_multiplier``), no warmup, ``max_steps`` = samples / (k x B), the study's
held-out split, no checkpoints, and ``branch_hook.BranchLossHook`` as its only hook (the
held-out loss at the start and the end). Everything a report needs (the checkpoint's
samples, the branch's batch, the source's B_simple there) is kept with the trial, so the
report reads the storage alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any

from largebatch.errors import UserError
from largebatch.study import branches, ledger

PHASE = "branch"
HOOK = "largebatch.study.branch_hook:BranchLossHook"
KEYS = {"run": None, "at_samples": None, "ks": [1, 2, 4, 8], "samples": None, "seeds": None, "tolerance": 0.2, "lr_rule": None}


def parse(value: Any, seeds: tuple[int, ...], where: str) -> dict[str, Any]:
    """The ``branches`` section, checked for its shape (the run itself: ``source``).

    Raises:
        UserError: an unknown key, a missing run or samples, ks without 1, a tolerance
            outside (0, 1), an unknown learning-rate rule.
    """
    if not isinstance(value, dict):
        raise UserError(f"must be a dict(run=..., samples=..., ...), got {value!r}", key="branches", path=where)
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise UserError(f"unknown key; known keys: {', '.join(KEYS)}", key=f"branches.{unknown[0]}", path=where)
    entry = {k: value.get(k, default) for k, default in KEYS.items()}
    if not isinstance(entry["run"], str):
        raise UserError("is required: the source run's directory, relative to the study file", key="branches.run", path=where)
    for key in ("ks", "seeds", "at_samples"):
        items = list(seeds) if key == "seeds" and entry[key] is None else entry[key]
        if items is None and key == "at_samples":  # every checkpoint
            continue
        if not isinstance(items, list) or not items or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in items):
            raise UserError(f"must be a list of distinct non-negative integers, got {items!r}", key=f"branches.{key}", path=where)
        if len(set(items)) != len(items):
            raise UserError(f"must be distinct, got {items!r}", key=f"branches.{key}", path=where)
        entry[key] = sorted(items)
    if 1 not in entry["ks"] or min(entry["ks"]) < 1:
        raise UserError(f"must hold 1 (the base batch) and positive factors, got {entry['ks']}", key="branches.ks", path=where)
    samples = entry["samples"]
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise UserError(
            f"is required: the samples each branch trains on (a positive integer), got {samples!r}", key="branches.samples", path=where
        )
    tolerance = entry["tolerance"]
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not 0 < tolerance < 1:
        raise UserError(f"must be a fraction in (0, 1), got {tolerance!r}", key="branches.tolerance", path=where)
    if entry["lr_rule"] is not None and entry["lr_rule"] not in branches.LR_RULES:
        raise UserError(
            f"must be one of {', '.join(branches.LR_RULES)} or None (by the optimizer), got {entry['lr_rule']!r}",
            key="branches.lr_rule",
            path=where,
        )
    return entry


@dataclasses.dataclass(frozen=True)
class Source:
    """The run the branches start from, read once: its config, batch, schedule, checkpoints."""

    run: pathlib.Path
    label: str
    batch: int
    micro_batch: int
    optimizer: str
    train_samples: int
    lr_at: dict[int, float]  # checkpoint step -> the schedule's learning rate for that step
    checkpoints: dict[int, pathlib.Path]  # step -> path
    b_simple: dict[int, float | None]  # step -> the last B_simple logged at or before it


def source(spec: Any) -> Source:
    """Read the ``branches`` section's run (``spec.branches``) and check it can be branched.

    Raises:
        UserError: no run directory, config.yaml or checkpoint there; an ``at_samples`` that
            is no checkpoint; samples the largest k x B does not divide.
    """
    from largebatch.checkpoint import NAME_PATTERN, list_checkpoints
    from largebatch.config import resolve_saved_config
    from largebatch.config.loader import read_yaml_data
    from largebatch.optim.schedules import LRSchedule

    section, where = spec.branches, str(spec.path)
    run = (spec.folder / section["run"]).resolve()
    saved = run / "config.yaml"
    if not saved.is_file():
        raise UserError(f"{run} holds no run (no config.yaml); train it first with checkpoints", key="branches.run", path=where)
    config = resolve_saved_config(saved)[0]  # a run directory is data: one YAML file, no _base_
    derived = read_yaml_data(saved).get("derived") or {}  # the numbers it was derived to at its launch
    batch = int(derived.get("global_batch_size") or config.global_batch_size)
    found = {int(NAME_PATTERN.match(p.name).group(1)): p for p in list_checkpoints(run)}  # type: ignore[union-attr]
    if not found:
        raise UserError(f"{run} holds no checkpoint to branch from", key="branches.run", path=where)
    wanted = section["at_samples"]
    if wanted is not None:
        missing = [s for s in wanted if s % batch or s // batch not in found]
        if missing:
            steps = ", ".join(str(step * batch) for step in sorted(found))
            raise UserError(
                f"{missing[0]} samples is no checkpoint of {run} (batch {batch}); its checkpoints are at {steps} samples",
                key="branches.at_samples",
                path=where,
            )
        found = {s // batch: found[s // batch] for s in wanted}
    largest = max(section["ks"]) * batch
    if section["samples"] % largest:
        raise UserError(
            f"{section['samples']} samples is not a whole number of steps at the largest branch's batch {largest}; give a multiple of it",
            key="branches.samples",
            path=where,
        )
    schedule_section = config.lr_schedule
    schedule = LRSchedule(
        peak_lr=float(derived["peak_lr"]),
        total_steps=int(derived["total_steps"]),
        warmup_steps=int(derived["warmup_steps"]),
        decay=schedule_section.type,
        min_lr=schedule_section.min_lr,
        warmup_init_lr=schedule_section.warmup_init_lr,
        power=schedule_section.power,
    )
    return Source(
        run=run,
        label=run.name,
        batch=batch,
        micro_batch=int(derived.get("micro_batch_size") or config.micro_batch_size),
        optimizer=config.optimizer.type,
        train_samples=int(derived["train_samples"]),
        lr_at={step: schedule.lr_at(step) for step in found},
        checkpoints=found,
        b_simple=_b_simple(run / "metrics.jsonl", sorted(found)),
    )


def _b_simple(metrics: pathlib.Path, steps: list[int]) -> dict[int, float | None]:
    """The last ``noise_scale/b_simple`` logged at or before each step (None: none logged)."""
    logged = []
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            record = json.loads(line) if line.strip() else {}
            value = record.get("noise_scale/b_simple")
            if isinstance(value, int | float) and math.isfinite(value):
                logged.append((int(record["step"]), float(value)))
    return {s: next((v for t, v in reversed(logged) if t <= s), None) for s in steps}


def rule(spec: Any, src: Source) -> str:
    """The learning-rate rule: the section's, else the optimizer's (``branches.DEFAULT_LR_RULE``)."""
    return spec.branches["lr_rule"] or branches.DEFAULT_LR_RULE.get(src.optimizer, "sqrt")


def key(src: Source, step: int, k: int, samples: int, lr_rule: str, seed: int) -> str:
    """A branch trial's identity: ``branch/<run>/n<samples seen>/k<k>/d<samples>/<rule>/s<seed>``."""
    return f"branch/{src.label}/n{step * src.batch}/k{k}/d{samples}/{lr_rule}/s{seed}"


def keys(spec: Any, src: Source) -> set[str]:
    """The keys of every branch of the section as it stands."""
    section, lr_rule = spec.branches, rule(spec, src)
    return {
        key(src, step, k, section["samples"], lr_rule, seed) for step in src.checkpoints for k in section["ks"] for seed in section["seeds"]
    }


def decide(spec: Any, src: Source, trials: list[Any], skipped: set[str], retry_failed: bool) -> list[dict[str, Any]]:
    """The user attributes of the branch trials to queue now (a branch trial has no searched
    parameters; the worker queues each as a ``plan.Wanted``): each (checkpoint, k, seed) that has
    none live, or whose last attempt was killed (at most ``workers.max_retries`` times), or
    failed and ``retry_failed``."""
    section, lr_rule = spec.branches, rule(spec, src)
    history = ledger.histories(trials, PHASE)
    wanted = []
    for step, checkpoint in sorted(src.checkpoints.items()):
        for k in section["ks"]:
            for seed in section["seeds"]:
                name = key(src, step, k, section["samples"], lr_rule, seed)
                past = history.get(name, [])
                if not ledger.due(past, name in skipped, retry_failed, int(spec.workers["max_retries"])):
                    continue
                batch = k * src.batch
                branch = {
                    "run": src.label,
                    "checkpoint": str(checkpoint),
                    "at_samples": step * src.batch,
                    "step": step,
                    "base_batch": src.batch,
                    "k": k,
                    "batch": batch,
                    "micro_batch": src.micro_batch,
                    "samples": section["samples"],
                    "steps": section["samples"] // batch,
                    "epochs": math.ceil(section["samples"] / batch / max(1, src.train_samples // batch)),
                    "lr": src.lr_at[step] * branches.lr_multiplier(lr_rule, k),
                    "lr_rule": lr_rule,
                    "b_simple": src.b_simple.get(step),
                }
                order = f"2-{step:010d}-{seed:08d}-{k:06d}"
                attrs = {"key": name, "phase": PHASE, "seed": seed, "order": order, "attempt": len(past) + 1, "branch": branch}
                wanted.append(attrs)
    return wanted


def launch(spec: Any, info: dict[str, Any], run_dir: pathlib.Path) -> list[str]:
    """The ``largebatch train`` arguments of one branch trial (``info``: its user attributes)."""
    b = info["branch"]
    sets = [
        f"global_batch_size={b['batch']}",
        f"micro_batch_size={math.gcd(b['micro_batch'], b['batch'])}",
        f"seed={info['seed']}",
        "model.init_from=null",  # the weights come from the checkpoint
        f"optimizer.lr={b['lr']!r}",
        "lr_schedule.type=constant",
        "lr_schedule.warmup_steps=0",
        "lr_schedule.warmup_epochs=null",
        "lr_schedule.scaling=none",
        f"epochs={b['epochs']}",
        f"max_steps={b['steps']}",
        f"data.eval_split={spec.data['heldout']}",
        "eval.interval_epochs=0",
        "eval.at_end=false",
        "checkpoint.interval_epochs=0",
        "checkpoint.at_end=false",
        "checkpoint.interval_steps=null",
        "checkpoint.interval_minutes=null",
        "hooks=" + json.dumps([{"type": HOOK}]),
    ]
    if spec.data["carve"]:
        sets.append(f"data.root={spec.folder / 'data'}")
    config = str(pathlib.Path(b["checkpoint"]).parent.parent / "config.yaml")
    return ["--config", config, "--run-dir", str(run_dir), "--branch-from", b["checkpoint"]] + [a for s in sets for a in ("--set", s)]


def read_outcome(run_dir: pathlib.Path, seconds: float) -> dict[str, Any]:
    """What a finished branch measured (``branch_hook.OUTCOME``): the held-out loss at its
    start and end (None: not finite), the steps it took."""
    from largebatch.study.branch_hook import OUTCOME

    path = run_dir / OUTCOME
    found = json.loads(path.read_text()) if path.is_file() else {}
    return {**found, "seconds": round(seconds, 1)}


def results(spec: Any, trials: list[Any]) -> list[dict[str, Any]]:
    """The finished branches of the section as it stands (its ks, seeds, samples and rule),
    as ``branches.table`` takes them."""
    from optuna.trial import TrialState

    section, out = spec.branches, []
    for trial in trials:
        info = ledger.attrs(trial)
        b = info.get("branch")
        if info.get("phase") != PHASE or trial.state != TrialState.COMPLETE or "duplicate_of" in info or b is None:
            continue
        if (
            b["run"] != pathlib.Path(section["run"]).name
            or b["samples"] != section["samples"]
            or (section["lr_rule"] or b["lr_rule"]) != b["lr_rule"]
        ):
            continue
        if section["at_samples"] is not None and b["at_samples"] not in section["at_samples"]:
            continue
        outcome = info.get("outcome") or {}
        out.append({**b, "seed": info["seed"], "start_loss": outcome.get("start_loss"), "end_loss": outcome.get("end_loss")})
    return out
