"""Everything a study can check before its first trial: the base config, every cell's
config at the corners of its search space, the target, the splits.

Each cell's trial config is resolved with ``largebatch.config.resolve_config`` (the same
call ``largebatch train`` makes) at the low and the high end of every range, and its batch
arithmetic derived, so a key the optimizer does not take, a batch the micro-batch does
not divide or a value outside the schema is one ``error:`` line now, not a failed trial
later. The target must be a metric the config's task measures on evaluation, the
held-out split must hold samples, and the test split too when one is named.

**Budgets.** ``budget_warnings`` compares each cell's longest run (the top of its epoch
range, in optimizer steps) with the steps a pilot fit S = S_min (1 + B_crit / B) predicts
to the target: the study file's ``pilot``, else a fit to the study's own finished tuning
trials (each cell's fewest held-out steps). A longest budget under ``MARGIN`` times the
prediction is a warning before the first trial: such a cell may record "not reached"
because of the study file, not the batch.

**Identity.** ``fingerprint`` hashes what decides a study's trials; ``bind`` records it and
the thread count per trial in the storage and refuses a storage made otherwise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from typing import Any

from largebatch.errors import UserError
from largebatch.study.runner import Base, arm_overrides, trial_overrides
from largebatch.study.spec import Pilot, StudySpec

TFRECORD_LOADERS = ("native", "dali", "mediapipe")
MARGIN = 2.0  # a cell's longest budget should be at least this many times the pilot's predicted steps


def prepare(spec: StudySpec) -> Base:
    """Check the study against its base config (carving the held-out split when asked) and
    return what trials need of the base config.

    Raises:
        UserError: the first problem found, naming the study file's key or the config key.
    """
    from largebatch.config import resolve_config
    from largebatch.config.frozen import thaw

    where = str(spec.path)
    cfg = resolve_config(spec.base_config, spec.overrides)
    betas = cfg.optimizer.extra.get("betas") or (0.9, 0.999)
    base = Base(cfg.epochs, float(betas[1]), cfg.micro_batch_size, tuple(thaw(cfg.hooks)))
    _check_target(spec, cfg, where)
    _check_data(spec, cfg, where)
    longest = {}
    for label, batch in spec.cells():
        opt = spec.optimizer(label)
        for end in ("low", "high"):
            params = {p.name: p.value(0.0 if end == "low" else 0.999999, batch, min(spec.batches)) for p in opt.space}
            for phase in ("tune", "seed"):
                info = {"optimizer": label, "batch": batch, "seed": spec.tune_seed, "phase": phase, "key": f"{label}/b{batch}"}
                try:
                    steps = _check_cell(spec, base, info, params)
                except UserError as exc:
                    raise UserError(f"{label} at batch {batch} ({end} end of its ranges): {exc}", path=where) from exc
                longest[(label, batch)] = max(steps, longest.get((label, batch), 0))
    arm_hooks = {arm.label: _check_arm(spec, arm) for arm in spec.arms}
    return dataclasses.replace(base, longest=longest, arm_hooks=arm_hooks)


def budget_warnings(spec: StudySpec, base: Base, trials: list[Any]) -> list[str]:
    """A line for every cell whose longest budget (``base.longest``) is under ``MARGIN``
    times the steps its optimizer's pilot fit predicts (the study file's ``pilot``, else a
    fit to the study's finished tuning trials; no line for an optimizer with neither)."""
    lines = []
    for opt in spec.optimizers:
        pilot, source = spec.pilot.get(opt.label), "the study file's pilot"
        if pilot is None:
            pilot, source = _pilot_from_trials(spec, opt.label, trials), "a fit to the study's finished trials"
        if pilot is None:
            continue
        key = next(t.key for t in spec.targets if t.value == pilot.value)
        epochs = next((p for p in opt.space if p.name == "epochs"), None)
        how = (
            f"raise optimizers.{opt.label}.search.epochs.high or search.epochs.high, or scale the epoch range by the pilot "
            "(epochs=dict(..., scale='pilot'))"
            if epochs is None or epochs.scale != "pilot"
            else f"raise optimizers.{opt.label}.search.epochs.high or search.epochs.high"
        )
        for batch in spec.batches:
            longest, predicted = base.longest[(opt.label, batch)], pilot.steps(batch)
            if longest < MARGIN * predicted:
                lines.append(
                    f"warning: {opt.label} at batch {batch}: its longest budget is {longest} steps, and {source} "
                    f"(S_min {pilot.s_min:.4g}, B_crit {pilot.b_crit:.4g}) predicts {predicted:.0f} steps to {key}, "
                    f"less than {MARGIN:g}x; {how}"
                )
    return lines


def _pilot_from_trials(spec: StudySpec, label: str, trials: list[Any]) -> Pilot | None:
    """S = S_min (1 + B_crit / B) fitted to each cell's fewest held-out steps to the last
    target among its finished tuning trials (None with fewer than two such cells)."""
    from largebatch.study import plan
    from largebatch.study.fit import Point, fit_scaling

    points = []
    for (name, batch), cell in plan.cells(spec, trials).items():
        steps = plan.cap([t for ts in cell.tune.values() for t in ts], spec.target) if name == label else None
        if steps is not None:
            points.append(Point(float(batch), steps, steps))
    fit = fit_scaling(points)
    return None if fit is None else Pilot(fit.s_min, fit.b_crit, spec.target.value)


def stored_study_file(path: pathlib.Path) -> str:
    """The study file as the storage keeps it: its values as YAML, credentials redacted (a
    storage URL's password, a ``set`` entry's token); the real values stay in the file."""
    import yaml

    from largebatch.config.loader import read_plain_file
    from largebatch.config.redact import redact

    return yaml.safe_dump(redact(read_plain_file(path)), sort_keys=False)


def bind(spec: StudySpec, study: Any, url: str, threads: int) -> None:
    """Record the study's fingerprint and threads per trial in a new storage; refuse one
    made from another study file or run with another thread count (``url`` as shown:
    credentials redacted).

    Raises:
        UserError: the stored fingerprint or thread count differs.
    """
    found, stored = fingerprint(spec), study.user_attrs.get("fingerprint")
    if stored is None:
        study.set_user_attr("fingerprint", found)
        study.set_user_attr("study_file", stored_study_file(spec.path))
        study.set_user_attr("threads", threads)
    elif stored != found:
        raise UserError(
            f"storage {url!r} holds study {spec.name!r} made from another version of the study file or its base config "
            "(cells, search space, budget, target or overrides differ); give the study another name or storage to start afresh",
            path=str(spec.path),
        )
    recorded = study.user_attrs.get("threads")
    if recorded is not None and recorded != threads:
        raise UserError(
            f"storage {url!r} holds study {spec.name!r} run with {recorded} thread(s) per trial, and this run would use {threads} "
            f"(the thread count changes results); resume with --threads {recorded} or threads = {recorded} in the study file",
            path=str(spec.path),
        )


def _check_cell(spec: StudySpec, base: Base, info: dict[str, Any], params: dict[str, float]) -> int:
    """Check one cell's trial config; the optimizer steps it runs."""
    from largebatch.config import derive, resolve_config
    from largebatch.data import count_samples
    from largebatch.hooks import build_hooks

    cfg = resolve_config(spec.base_config, trial_overrides(spec, base, info, params, None))
    derived = derive(cfg, 1, count_samples(cfg.data, "train"))
    build_hooks(cfg.hooks, checkpoint=cfg.checkpoint, log=cfg.log, ema=cfg.ema, config_path=spec.base_config)
    ratio = cfg.global_batch_size // cfg.micro_batch_size
    if spec.noise_scale is not None and ratio < int(spec.noise_scale["min_ratio"]):
        raise UserError(
            f"the noise_scale hook needs a micro-batch at most 1/{spec.noise_scale['min_ratio']} of the batch, and batch "
            f"{cfg.global_batch_size} allows 1/{ratio}; drop the batch or lower noise_scale.min_ratio",
            key="noise_scale.min_ratio",
        )
    return derived.run_steps


def _check_arm(spec: StudySpec, arm: Any) -> tuple[Any, ...]:
    """Check one arm's trial config as its trials run it; the hooks of its config (the
    study's hook is added after them).

    Raises:
        UserError: the arm's overrides make a config that does not resolve, derive or build
            its hooks, named by the arm.
    """
    from largebatch.config import derive, resolve_config
    from largebatch.config.frozen import thaw
    from largebatch.data import count_samples
    from largebatch.hooks import build_hooks

    try:
        own = resolve_config(spec.base_config, [*spec.overrides, *arm.overrides])
        hooks = tuple(thaw(own.hooks))
        cfg = resolve_config(spec.base_config, arm_overrides(spec, hooks, {"arm": arm.label, "seed": arm.seeds[0]}))
        derive(cfg, 1, count_samples(cfg.data, "train"))
        build_hooks(cfg.hooks, checkpoint=cfg.checkpoint, log=cfg.log, ema=cfg.ema, config_path=spec.base_config)
    except UserError as exc:
        raise UserError(f"arm {arm.label!r}: {exc}", key=f"arms.{arm.label}.set", path=str(spec.path)) from exc
    return hooks


def _check_target(spec: StudySpec, cfg: Any, where: str) -> None:
    from largebatch.tasks import build_task

    task = build_task(cfg.task, spec.base_config)
    measured = tuple(task.eval_sum_names)
    if spec.targets and spec.target.metric not in measured:  # a study of branches only has no target
        raise UserError(
            f"the config's task ({cfg.task.type}) does not measure {spec.target.metric!r} on evaluation; it measures "
            f"{', '.join(measured)}: set target.metric to one of them",
            key="target.metric",
            path=where,
        )
    if spec.noise_scale is not None and "loss" not in measured:
        raise UserError(f"needs eval/loss, which the config's task ({cfg.task.type}) does not measure", key="noise_scale", path=where)


def _check_data(spec: StudySpec, cfg: Any, where: str) -> None:
    from largebatch.data import count_samples
    from largebatch.study.data import carve

    heldout, test = spec.data["heldout"], spec.data["test"]
    if cfg.data.loader not in TFRECORD_LOADERS:
        if spec.data["carve"] or test:
            key = "data.carve" if spec.data["carve"] else "data.test"
            raise UserError(
                f"the {cfg.data.loader} loader has one evaluation set, the held-out split; set {key} to None", key=key, path=where
            )
        if count_samples(cfg.data, "eval") < 1:
            raise UserError("the held-out split is empty (data.eval_samples is 0 in the base config)", key="data.heldout", path=where)
        return
    if spec.data["carve"]:
        carve(_root(cfg.data.root), cfg.data.train_split, heldout, int(spec.data["carve"]), spec.folder / "data")
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, root=str(spec.folder / "data")))
    for split, key in ((heldout, "data.heldout"), (test, "data.test")):
        if split is None:
            continue
        try:
            count = count_samples(dataclasses.replace(cfg.data, eval_split=split), "eval")
        except UserError as exc:
            raise UserError(f"split {split!r} cannot be read: {exc}", key=key, path=where) from exc
        if count < 1:
            raise UserError(f"split {split!r} holds no samples", key=key, path=where)


def _root(root: str | None) -> Any:
    import pathlib

    if not root:
        raise UserError("data.carve needs data.root in the base config", key="data.carve")
    return pathlib.Path(root)


def fingerprint(spec: StudySpec) -> str:
    """A hash of what decides a study's trials (cells, spaces, budget, targets, seeds, the
    sampler, the pilot, the overrides and the base config's text): a storage made with
    another refuses to continue. Keys at their defaults are left out, so a study file
    written before they existed keeps its fingerprint."""
    parts = {
        "base_config": spec.base_config.read_text(),
        "overrides": spec.overrides,
        "optimizers": [_without_defaults(dataclasses.asdict(o)) for o in spec.optimizers],
        "batches": spec.batches,
        "micro_batch_size": spec.micro_batch_size,
        "trials": spec.trials,
        "tune_seed": spec.tune_seed,
        "target": dataclasses.asdict(spec.target) if spec.targets else None,  # None: a study of branches only
        "data": spec.data,
        "evaluation": spec.evaluation,
        "noise_scale": spec.noise_scale,
        "sampler_seed": spec.sampler_seed,
    }
    if len(spec.targets) > 1:
        parts["targets"] = [dataclasses.asdict(t) for t in spec.targets]
    if spec.quasi_random != spec.trials:
        parts["quasi_random"] = spec.quasi_random
    if spec.pilot:
        parts["pilot"] = {label: dataclasses.asdict(p) for label, p in spec.pilot.items()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _without_defaults(optimizer: dict[str, Any]) -> dict[str, Any]:
    """An optimizer's fields for the fingerprint, its ranges without an unset pilot B_crit."""
    space = [{k: v for k, v in p.items() if not (k == "pilot_b_crit" and v is None)} for p in optimizer["space"]]
    return {**optimizer, "space": space}
