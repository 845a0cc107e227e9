"""The study file: what a study compares, searches and aims at, read and checked once.

A study file is a Python or YAML file of the shape of a config (lowercase module-level
names holding plain data; ``largebatch.config.loader.read_plain_file`` reads it)::

    base_config = '../../configs/demo/vit-tiny-fmnist.py'   # relative to this file
    set = ['model.depth=2']                    # --set overrides for every trial
    optimizers = dict(lamb=dict(), sgd=dict(set=['optimizer.nesterov=true']))
    batches = [256, 512, 1024]
    search = dict(lr=dict(low=1e-3, high=3e-2, log=True, scale='sqrt'), epochs=dict(low=2, high=8))
    targets = [dict(metric='top1', value=0.75), dict(metric='top1', value=0.8)]  # on the held-out split
    trials = 16                                # tuning trials per (optimizer, batch) cell
    quasi_random = 8                           # the first 8 at Sobol points, then Optuna's TPE
    seeds = [1, 2, 3]                          # the best of each cell, re-run with these seeds

Every key, its default and meaning is in ``KEYS`` (and docs/studies.md). A mistake is a
``UserError`` naming the file and the key, with the fix; nothing here starts a trial or
reads the training config (``largebatch.study.checks`` does that).
"""

from __future__ import annotations

import dataclasses
import difflib
import pathlib
from typing import Any

from largebatch.config.loader import read_plain_file
from largebatch.errors import UserError
from largebatch.study import arm_trials, branch_trials
from largebatch.study.space import Param, parse_space

# name -> (meaning, default; REQUIRED when there is none)
REQUIRED = object()
KEYS: dict[str, tuple[str, Any]] = {
    "name": ("the Optuna study name (default: the study file's folder name)", None),
    "base_config": ("the training config every trial starts from, relative to the study file", REQUIRED),
    "set": ("--set overrides applied to every trial, after the base config", []),
    "optimizers": ("label -> dict(type=..., set=[...], search=dict(...)); type defaults to the label", REQUIRED),
    "batches": ("the global batch sizes to compare", REQUIRED),
    "micro_batch_size": ("largest micro-batch; a cell uses min(this, batch // noise_scale.min_ratio)", None),
    "search": (
        "param -> dict(low, high, log, scale, base_batch): lr, warmup_fraction, warmup_epochs, weight_decay, one_minus_momentum, epochs",
        REQUIRED,
    ),
    "trials": ("tuning trials per (optimizer, batch) cell", 8),
    "quasi_random": ("how many of a cell's trials are scrambled Sobol points; the rest are proposed by TPE (None: all)", None),
    "tune_seed": ("the seed of every tuning trial", 0),
    "seeds": ("the seeds the best configuration of each cell is re-run with (at least 3 for medians and ranges)", [1, 2, 3]),
    "target": ("dict(metric, value, mode): the value of eval/<metric> to reach on the held-out split (one target)", None),
    "targets": ("[dict(metric, value, mode), ...]: several values of one metric, each with its own choice and re-runs", None),
    "pilot": ("optimizer label -> dict(s_min, b_crit, value): a fit S = S_min (1 + B_crit / B) of steps to target value", {}),
    "threads": ("OMP threads per trial (None: this machine's cores / --jobs); recorded in the storage", None),
    "data": (
        "dict(heldout, test, carve): the held-out split's name, the test split's (None: report the held-out "
        "split), and carve=N to make the held-out split from the last N training shards",
        {},
    ),
    "evaluation": ("dict(coarse, fine, dense_within, first_fraction, batch_size, refine): the evaluation schedule", {}),
    "noise_scale": ("None, or dict(at_eval_loss, min_ratio, beta): B_simple at a fixed held-out loss in the seed runs", None),
    "sampler_seed": ("the seed of the scrambled Sobol sequence (the same points in every cell)", 0),
    "storage": ("an Optuna storage URL (None: sqlite:///<study folder>/study.db) or a journal file (journal:PATH)", None),
    "workers": ("dict(heartbeat_seconds, stale_seconds, max_retries, poll_seconds)", {}),
    "branches": ("None, or dict(run, at_samples, ks, samples, seeds, tolerance, lr_rule): the critical batch along a run", None),
    "arms": ("None, or label -> dict(set=[...], seeds=[...]): named training recipes compared over seeds", None),
}
# The keys of the tuning cells: a study with a ``branches`` section may leave all of them
# out and measure only the critical batch along its run; the keys that only shape the
# cells' trials then have no effect (the branches train from the run's config.yaml). A
# study with an ``arms`` section may leave out the cells too, keeping its targets and
# evaluation schedule (the arms are evaluated on it).
TUNING_KEYS = ("optimizers", "batches", "search", "target", "targets")
CELL_KEYS = ("optimizers", "batches", "search")
CELL_ONLY_KEYS = ("micro_batch_size", "trials", "quasi_random", "tune_seed", "pilot", "evaluation", "noise_scale", "sampler_seed")
DATA_KEYS = {"heldout": "heldout", "test": None, "carve": None}
EVALUATION_KEYS = {"coarse": 1.4, "fine": 1.04, "dense_within": 0.03, "first_fraction": 1 / 32, "batch_size": None, "refine": True}
NOISE_KEYS = {"at_eval_loss": REQUIRED, "min_ratio": 8, "beta": 0.99}
WORKER_KEYS = {"heartbeat_seconds": 30.0, "stale_seconds": 300.0, "max_retries": 2, "poll_seconds": 10.0}
TARGET_KEYS = {"metric": REQUIRED, "value": REQUIRED, "mode": None}
PILOT_KEYS = {"s_min": REQUIRED, "b_crit": REQUIRED, "value": None}
OPTIMIZER_KEYS = {"type": None, "set": [], "search": {}}


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """One optimizer of the study: its label, ``optimizer.type``, overrides and search space."""

    label: str
    type: str
    overrides: tuple[str, ...]
    space: tuple[Param, ...]


@dataclasses.dataclass(frozen=True)
class Target:
    """``eval/<metric>`` must reach ``value`` (``mode`` ``max``: at least it; ``min``: at most)."""

    metric: str
    value: float
    mode: str

    @property
    def key(self) -> str:
        """The target's name in a trial's record: ``top1>=0.78``, ``loss<=0.5``."""
        return f"{self.metric}{'>=' if self.mode == 'max' else '<='}{self.value:g}"


@dataclasses.dataclass(frozen=True)
class Pilot:
    """A fit S = S_min (1 + B_crit / B) of the steps one optimizer needs to reach ``value``."""

    s_min: float
    b_crit: float
    value: float

    def steps(self, batch: int) -> float:
        return self.s_min * (1 + self.b_crit / batch)


@dataclasses.dataclass(frozen=True)
class StudySpec:
    """A study file, checked. ``folder`` holds the storage, trials and report."""

    path: pathlib.Path
    name: str
    base_config: pathlib.Path
    overrides: tuple[str, ...]
    optimizers: tuple[OptimizerSpec, ...]
    batches: tuple[int, ...]
    micro_batch_size: int | None
    trials: int
    quasi_random: int
    tune_seed: int
    seeds: tuple[int, ...]
    targets: tuple[Target, ...]
    data: dict[str, Any]
    evaluation: dict[str, Any]
    noise_scale: dict[str, Any] | None
    sampler_seed: int
    storage: str | None
    workers: dict[str, Any]
    pilot: dict[str, Pilot] = dataclasses.field(default_factory=dict)
    threads: int | None = None

    @property
    def target(self) -> Target:
        """The last target (the one reached last: a trial runs until it)."""
        return self.targets[-1]

    branches: dict[str, Any] | None = None  # largebatch.study.branch_trials
    arms: tuple[arm_trials.Arm, ...] = ()  # largebatch.study.arm_trials

    @property
    def folder(self) -> pathlib.Path:
        return self.path.parent

    def optimizer(self, label: str) -> OptimizerSpec:
        return next(o for o in self.optimizers if o.label == label)

    def cells(self) -> list[tuple[str, int]]:
        """Every (optimizer label, global batch) cell, optimizers in the file's order, batches ascending."""
        return [(o.label, b) for o in self.optimizers for b in self.batches]


def load_study(path: str | pathlib.Path) -> StudySpec:
    """Read and check a study file.

    Raises:
        UserError: a missing file, an unknown or misspelt key, a value of the wrong kind,
            an unknown optimizer, an empty or impossible search range.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise UserError("study file not found; give the path of a .py or .yaml study file", path=str(path))
    raw = read_plain_file(path)
    where = str(path)
    _known(raw, KEYS, "", where)
    arms_only = raw.get("arms") is not None and not any(k in raw for k in CELL_KEYS)
    only_branches = not arms_only and raw.get("branches") is not None and not any(k in raw for k in TUNING_KEYS)
    no_cells = arms_only or only_branches
    optional = CELL_KEYS if arms_only else TUNING_KEYS if only_branches else ()
    missing = [k for k, (_, default) in KEYS.items() if default is REQUIRED and k not in raw and k not in optional]
    if missing:
        raise UserError(f"is required: {KEYS[missing[0]][0]}", key=missing[0], path=where)
    idle = [k for k in CELL_ONLY_KEYS if k in raw and not (arms_only and k == "evaluation")] if no_cells else []
    if idle:
        why = (
            "a study of arms only (an arms section without optimizers, batches or search: each arm's set is its whole recipe)"
            if arms_only
            else "a study of branches only (a branches section without optimizers, batches, search or target: the branches train "
            "from the run's config.yaml)"
        )
        raise UserError(f"has no effect in {why}; remove it, or give the cells it would shape", key=idle[0], path=where)
    values = {k: raw.get(k, default) for k, (_, default) in KEYS.items()}
    base = path.parent / _kind(values["base_config"], str, "base_config", where)
    if not base.is_file():
        raise UserError(f"base config {str(base)!r} not found; give a path relative to the study file", key="base_config", path=where)
    batches = () if no_cells else _positive_ints(values["batches"], "batches", where)
    seeds = tuple(_kind(s, int, "seeds", where) for s in _kind(values["seeds"], list, "seeds", where))
    if not seeds or len(set(seeds)) != len(seeds):
        raise UserError(f"give distinct seeds (at least 3 for a median and a range), got {list(seeds)}", key="seeds", path=where)
    tune_seed = _kind(values["tune_seed"], int, "tune_seed", where)
    if tune_seed in seeds and not no_cells:
        raise UserError(
            f"the tuning seed {tune_seed} is among the re-run seeds {list(seeds)}: the re-runs would repeat the trial they were "
            "chosen from; use fresh seeds",
            key="seeds",
            path=where,
        )
    trials = _kind(values["trials"], int, "trials", where)
    if trials < 1:
        raise UserError(f"needs at least 1 trial per cell, got {trials}", key="trials", path=where)
    quasi = trials if values["quasi_random"] is None else _kind(values["quasi_random"], int, "quasi_random", where)
    if not 1 <= quasi <= trials:
        raise UserError(f"must be between 1 and trials ({trials}), got {quasi}", key="quasi_random", path=where)
    threads = values["threads"]
    if threads is not None and _kind(threads, int, "threads", where) < 1:
        raise UserError(f"must be a positive number of threads, got {threads}", key="threads", path=where)
    targets = () if only_branches else _targets(values["target"], values["targets"], where)
    optimizers = () if no_cells else _optimizers(values["optimizers"], values["search"], values["pilot"], where)
    micro = values["micro_batch_size"]
    if micro is not None and _kind(micro, int, "micro_batch_size", where) < 1:
        raise UserError(f"must be positive, got {micro}", key="micro_batch_size", path=where)
    storage = values["storage"]
    if storage is not None:
        _kind(storage, str, "storage", where)
    return StudySpec(
        path=path.resolve(),
        name=_kind(values["name"], str, "name", where) if values["name"] else path.resolve().parent.name,
        base_config=base.resolve(),
        overrides=_overrides(values["set"], "set", where),
        optimizers=optimizers,
        batches=batches,
        micro_batch_size=micro,
        trials=trials,
        quasi_random=quasi,
        tune_seed=tune_seed,
        seeds=seeds,
        targets=targets,
        data=_section(values["data"], DATA_KEYS, "data", where),
        evaluation=_evaluation(values["evaluation"], where),
        noise_scale=None if values["noise_scale"] is None else _noise(values["noise_scale"], where),
        sampler_seed=_kind(values["sampler_seed"], int, "sampler_seed", where),
        storage=storage,
        workers=_section(values["workers"], WORKER_KEYS, "workers", where),
        pilot=_pilots(values["pilot"], optimizers, targets, where),
        threads=threads,
        branches=None if values["branches"] is None else branch_trials.parse(values["branches"], seeds, where),
        arms=() if values["arms"] is None else arm_trials.parse(values["arms"], seeds, where),
    )


def optimizer_types() -> tuple[str, ...]:
    """The optimizers a config can name (the schema's ``optimizer.type`` choices)."""
    from largebatch.config.schema import SCHEMA, Field, Section

    section = SCHEMA.fields["optimizer"]
    assert isinstance(section, Section)
    field = section.fields["type"]
    assert isinstance(field, Field) and field.choices
    return tuple(field.choices)


def _optimizers(value: Any, search: Any, pilot: Any, where: str) -> tuple[OptimizerSpec, ...]:
    if isinstance(value, list):
        value = {_kind(name, str, "optimizers", where): {} for name in value}
    _kind(value, dict, "optimizers", where)
    if not value:
        raise UserError("name at least one optimizer, e.g. optimizers = dict(lamb=dict())", key="optimizers", path=where)
    _kind(search, dict, "search", where)
    types = optimizer_types()
    out = []
    for label, entry in value.items():
        key = f"optimizers.{label}"
        entry = _section(entry if entry is not None else {}, OPTIMIZER_KEYS, key, where)
        kind = entry["type"] or label
        if kind not in types:
            close = difflib.get_close_matches(kind, types, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UserError(f"unknown optimizer {kind!r}; optimizer.type takes one of {', '.join(types)}{hint}", key=key, path=where)
        merged = {name: dict(spec) for name, spec in search.items()}
        for name, spec in _kind(entry["search"], dict, f"{key}.search", where).items():
            merged[name] = {**merged.get(name, {}), **_kind(spec, dict, f"{key}.search.{name}", where)}
        b_crit = (_kind(pilot, dict, "pilot", where).get(label) or {}).get("b_crit")
        space = parse_space(merged, f"{key}.search" if entry["search"] else "search", where, b_crit)
        out.append(OptimizerSpec(label, kind, _overrides(entry["set"], f"{key}.set", where), space))
    return tuple(out)


def _targets(one: Any, several: Any, where: str) -> tuple[Target, ...]:
    """``target`` (one) or ``targets`` (several values of one metric), easiest first."""
    if (one is None) == (several is None):
        raise UserError(
            "give target = dict(metric=..., value=...) or targets = [dict(...), ...] (several values of one metric), one of the two",
            key="targets" if one is not None else "target",
            path=where,
        )
    if one is not None:
        return (_target(one, "target", where),)
    items = _kind(several, list, "targets", where)
    if not items:
        raise UserError("name at least one target, e.g. targets = [dict(metric='top1', value=0.78)]", key="targets", path=where)
    found = [_target(item, f"targets[{i}]", where) for i, item in enumerate(items)]
    if len({(t.metric, t.mode) for t in found}) > 1 or len({t.value for t in found}) < len(found):
        raise UserError(
            f"the targets must be distinct values of one metric and mode, got {', '.join(t.key for t in found)}; run a study per metric",
            key="targets",
            path=where,
        )
    return tuple(sorted(found, key=lambda t: t.value if t.mode == "max" else -t.value))


def _target(value: Any, key: str, where: str) -> Target:
    entry = _section(value, TARGET_KEYS, key, where)
    metric = _kind(entry["metric"], str, f"{key}.metric", where)
    number = entry["value"]
    if isinstance(number, bool) or not isinstance(number, int | float):
        raise UserError(f"must be a number, got {number!r}", key=f"{key}.value", path=where)
    mode = entry["mode"] or ("min" if metric.endswith("loss") else "max")
    if mode not in ("min", "max"):
        raise UserError(f"must be 'max' (reach at least the value) or 'min' (at most), got {mode!r}", key=f"{key}.mode", path=where)
    return Target(metric.removeprefix("eval/"), float(number), mode)


def _pilots(value: Any, optimizers: tuple[OptimizerSpec, ...], targets: tuple[Target, ...], where: str) -> dict[str, Pilot]:
    labels = [o.label for o in optimizers]
    out = {}
    for label, entry in _kind(value, dict, "pilot", where).items():
        key = f"pilot.{label}"
        if label not in labels:
            raise UserError(f"names no optimizer of the study ({', '.join(labels)})", key=key, path=where)
        entry = _section(entry, PILOT_KEYS, key, where)
        numbers = [entry["s_min"], entry["b_crit"]]
        if any(isinstance(v, bool) or not isinstance(v, int | float) or v <= 0 for v in numbers):
            raise UserError(f"s_min and b_crit are positive numbers, got {numbers}", key=key, path=where)
        aim = targets[-1].value if entry["value"] is None else entry["value"]
        if aim not in [t.value for t in targets]:
            raise UserError(f"value {aim!r} is none of the targets' ({', '.join(t.key for t in targets)})", key=f"{key}.value", path=where)
        out[label] = Pilot(float(numbers[0]), float(numbers[1]), float(aim))
    return out


def _evaluation(value: Any, where: str) -> dict[str, Any]:
    entry = _section(value, EVALUATION_KEYS, "evaluation", where)
    for key in ("coarse", "fine"):
        if not isinstance(entry[key], int | float) or entry[key] <= 1:
            raise UserError(
                f"is the ratio between evaluation steps and must be above 1, got {entry[key]!r}", key=f"evaluation.{key}", path=where
            )
    if entry["fine"] > entry["coarse"]:
        raise UserError(f"{entry['fine']} is coarser than evaluation.coarse {entry['coarse']}", key="evaluation.fine", path=where)
    _kind(entry["refine"], bool, "evaluation.refine", where)
    if not 0 < entry["first_fraction"] <= 1:
        raise UserError(f"must be in (0, 1], got {entry['first_fraction']!r}", key="evaluation.first_fraction", path=where)
    return entry


def _noise(value: Any, where: str) -> dict[str, Any]:
    entry = _section(value, NOISE_KEYS, "noise_scale", where)
    if _kind(entry["min_ratio"], int, "noise_scale.min_ratio", where) < 2:
        raise UserError(f"B_big / B_small must be at least 2, got {entry['min_ratio']}", key="noise_scale.min_ratio", path=where)
    return entry


def _section(value: Any, keys: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    _kind(value, dict, name, where)
    _known(value, {k: ("", v) for k, v in keys.items()}, f"{name}.", where)
    missing = [k for k, default in keys.items() if default is REQUIRED and k not in value]
    if missing:
        raise UserError("is required", key=f"{name}.{missing[0]}", path=where)
    return {k: value.get(k, default) for k, default in keys.items()}


def _known(values: dict[str, Any], keys: dict[str, Any], prefix: str, where: str) -> None:
    for key in values:
        if key not in keys:
            close = difflib.get_close_matches(key, list(keys), n=1)
            hint = f"did you mean {(prefix + close[0])!r}?" if close else f"known keys: {', '.join(keys)}"
            raise UserError(f"unknown key; {hint}", key=f"{prefix}{key}", path=where)


def _kind(value: Any, kind: type, key: str, where: str) -> Any:
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise UserError(f"must be a {kind.__name__}, got {value!r}", key=key, path=where)
    return value


def _positive_ints(value: Any, key: str, where: str) -> tuple[int, ...]:
    items = _kind(value, list, key, where)
    if not items or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in items) or len(set(items)) != len(items):
        raise UserError(f"must be a list of distinct positive integers, got {items!r}", key=key, path=where)
    return tuple(sorted(items))


def _overrides(value: Any, key: str, where: str) -> tuple[str, ...]:
    items = _kind(value, list, key, where)
    for item in items:
        if not isinstance(item, str) or "=" not in item or not item.partition("=")[0].strip():
            raise UserError(f"each override is 'key.path=value' as for --set, got {item!r}", key=key, path=where)
    return tuple(items)
