"""Everything a study can check before its first trial: the base config, every cell's
config at the corners of its search space, the target, the splits.

Each cell's trial config is resolved with ``largebatch.config.resolve_config`` (the same
call ``largebatch train`` makes) at the low and the high end of every range, and its batch
arithmetic derived, so a key the optimizer does not take, a batch the micro-batch does
not divide or a value outside the schema is one ``error:`` line now, not a failed trial
later. The target must be a metric the config's task measures on evaluation, the
held-out split must hold samples, and the test split too when one is named.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from largebatch.errors import UserError
from largebatch.study.runner import Base, trial_overrides
from largebatch.study.spec import StudySpec

TFRECORD_LOADERS = ("native", "dali", "mediapipe")


def prepare(spec: StudySpec) -> Base:
    """Check the study against its base config (carving the held-out split when asked) and
    return what trials need of the base config.

    Raises:
        UserError: the first problem found, naming the study file's key or the config key.
    """
    from largebatch.config import resolve_config

    where = str(spec.path)
    cfg = resolve_config(spec.base_config, spec.overrides)
    plain = cfg.to_dict()
    betas = plain["optimizer"].get("betas") or [0.9, 0.999]
    base = Base(cfg.epochs, float(betas[1]), cfg.micro_batch_size, tuple(plain["hooks"]))
    _check_target(spec, cfg, where)
    _check_data(spec, cfg, where)
    for label, batch in spec.cells():
        opt = spec.optimizer(label)
        for end in ("low", "high"):
            params = {p.name: p.value(0.0 if end == "low" else 0.999999, batch, min(spec.batches)) for p in opt.space}
            for phase in ("tune", "seed"):
                info = {"optimizer": label, "batch": batch, "seed": spec.tune_seed, "phase": phase, "key": f"{label}/b{batch}"}
                try:
                    _check_cell(spec, base, info, params)
                except UserError as exc:
                    raise UserError(f"{label} at batch {batch} ({end} end of its ranges): {exc}", path=where) from exc
    return base


def _check_cell(spec: StudySpec, base: Base, info: dict[str, Any], params: dict[str, float]) -> None:
    from largebatch.config import derive, resolve_config
    from largebatch.data import count_samples
    from largebatch.hooks import build_hooks

    cfg = resolve_config(spec.base_config, trial_overrides(spec, base, info, params, None))
    derive(cfg, 1, count_samples(cfg.data, "train"))
    build_hooks(cfg, spec.base_config)
    ratio = cfg.global_batch_size // cfg.micro_batch_size
    if spec.noise_scale is not None and ratio < int(spec.noise_scale["min_ratio"]):
        raise UserError(
            f"the noise_scale hook needs a micro-batch at most 1/{spec.noise_scale['min_ratio']} of the batch, and batch "
            f"{cfg.global_batch_size} allows 1/{ratio}; drop the batch or lower noise_scale.min_ratio",
            key="noise_scale.min_ratio",
        )


def _check_target(spec: StudySpec, cfg: Any, where: str) -> None:
    from largebatch.tasks import build_task

    task = build_task(cfg.task, spec.base_config)
    measured = tuple(task.eval_sum_names)
    if spec.target.metric not in measured:
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
    """A hash of what decides a study's trials (cells, spaces, budget, target, seeds, the
    overrides and the base config's text): a storage made with another refuses to continue."""
    parts = {
        "base_config": spec.base_config.read_text(),
        "overrides": spec.overrides,
        "optimizers": [dataclasses.asdict(o) for o in spec.optimizers],
        "batches": spec.batches,
        "micro_batch_size": spec.micro_batch_size,
        "trials": spec.trials,
        "tune_seed": spec.tune_seed,
        "target": dataclasses.asdict(spec.target),
        "data": spec.data,
        "evaluation": spec.evaluation,
        "noise_scale": spec.noise_scale,
        "sampler_seed": spec.sampler_seed,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
