"""The optimizer and the learning-rate schedule of a Colossal-AI run, from its train
script (``colossalai.nn.Lamb(model.parameters(), lr=..., weight_decay=...)``,
``LinearWarmupLR(optimizer, total_steps=..., warmup_steps=...)``), from an early-style
``optimizer=dict(type=...)`` in the config, or, without them, from the config's
``LEARNING_RATE``, ``WEIGHT_DECAY`` and ``WARMUP_EPOCHS``.

Where Colossal-AI's classes default differently from largebatch's, their defaults are
written out: its ``Lamb`` has no bias correction (docs/large-batch.md#lamb), its ``Lars``
no momentum, torch's ``AdamW`` decays by 0.01. Its schedulers count whatever they are
stepped by: ``LRSchedulerHook(by_epoch=True)`` makes the counts epochs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from largebatch.importers.colossalai.builder import Builder
from largebatch.importers.colossalai.reader import ColossalConfig
from largebatch.importers.colossalai.script import Argument, Call, Found, TrainScript, Unknown


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """A Colossal-AI (or torch) optimizer class: its type here, its positional arguments
    after the parameters, renamed arguments, its defaults that differ from largebatch's."""

    type: str
    positions: tuple[str, ...]
    renames: dict[str, str] = dataclasses.field(default_factory=dict)
    defaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    note: str = ""


_ADAM_FAMILY = ("lr", "bias_correction", "betas", "eps", "weight_decay", "adamw_mode")
OPTIMIZERS = {
    "Lamb": OptimizerSpec(
        "lamb",
        ("lr", "betas", "eps", "weight_decay", "adam", "bias_correction"),
        defaults={"bias_correction": False},
        note="Colossal-AI's Lamb defaults to no bias correction (docs/large-batch.md#lamb)",
    ),
    "Lars": OptimizerSpec(
        "lars",
        ("lr", "momentum", "eeta", "weight_decay", "epsilon"),
        renames={"eeta": "eta", "epsilon": "eps"},
        defaults={"momentum": 0.0, "eps": 0.0},
        note="Colossal-AI's Lars defaults: momentum 0, epsilon 0 (its clamps, trust ratio at 50 and gradients at 10, are not offered)",
    ),
    "AdamW": OptimizerSpec(
        "adamw", ("lr", "betas", "eps", "weight_decay", "amsgrad"), defaults={"weight_decay": 0.01}, note="torch's AdamW default"
    ),
    "Adam": OptimizerSpec(
        "adamw",
        ("lr", "betas", "eps", "weight_decay", "amsgrad"),
        note="Adam adds weight decay to the gradient (L2), adamw decouples it: the same when weight_decay is 0",
    ),
    "SGD": OptimizerSpec("sgd", ("lr", "momentum", "dampening", "weight_decay", "nesterov")),
    "HybridAdam": OptimizerSpec("adamw", _ADAM_FAMILY, note="Colossal-AI's HybridAdam with adamw_mode=True (its default) is AdamW"),
    "CPUAdam": OptimizerSpec("adamw", _ADAM_FAMILY, note="Colossal-AI's CPUAdam with adamw_mode=True (its default) is AdamW"),
    "FusedAdam": OptimizerSpec(
        "adamw",
        ("lr", "bias_correction", "betas", "eps", "adamw_mode", "weight_decay"),
        note="FusedAdam with adamw_mode=True (its default) is AdamW",
    ),
    "FusedLAMB": OptimizerSpec(
        "lamb",
        ("lr", "bias_correction", "betas", "eps", "weight_decay"),
        defaults={"no_decay_adapt": False},
        note="apex FusedLAMB (use_nvlamb=False): groups without weight decay take Adam steps",
    ),
}
# The arguments each optimizer type takes here (largebatch.optim).
ACCEPTED = {
    "lamb": {"lr", "betas", "eps", "weight_decay", "adam", "bias_correction", "no_decay_adapt"},
    "lars": {"lr", "momentum", "eta", "weight_decay", "eps", "nesterov"},
    "adamw": {"lr", "betas", "eps", "weight_decay", "amsgrad"},
    "sgd": {"lr", "momentum", "dampening", "weight_decay", "nesterov"},
}


def _listed(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _class_name(value: Any) -> str:
    """``Lamb`` for ``'Lamb'``, ``colossalai.nn.optimizer.Lamb`` or a stand-in of it."""
    return str(value).rsplit(".", 1)[-1]


def _map_arguments(b: Builder, spec: OptimizerSpec, class_name: str, arguments: dict[str, tuple[Argument, str]]) -> None:
    """Set ``optimizer.*`` from ``{argument name: (value, origin)}`` of one optimizer class."""
    for name, (argument, origin) in arguments.items():
        key = spec.renames.get(name, name)
        if key in ACCEPTED[spec.type]:
            b.take(f"optimizer.{key}", argument, origin, _listed)
        elif name == "adamw_mode" and isinstance(argument, Found) and argument.value:
            continue
        elif name == "bias_correction" and spec.type == "adamw" and isinstance(argument, Found) and argument.value:
            continue  # torch's AdamW always corrects the bias
        else:
            b.skip(origin, "", f"an argument of {class_name} with no equivalent in optimizer type {spec.type!r}")
    for key, value in spec.defaults.items():
        if not b.has(f"optimizer.{key}"):
            b.set(f"optimizer.{key}", value, f"{class_name}'s default: {spec.note}")


def _from_call(b: Builder, script: TrainScript, call: Call) -> None:
    spec = OPTIMIZERS[call.name]
    b.set(
        "optimizer.type", spec.type, f"{call.text} at {script.where(call)}" + (f": {spec.note}" if spec.note and not spec.defaults else "")
    )
    arguments = {
        name: (call.args[i + 1], script.origin(call, name, i + 1)) for i, name in enumerate(spec.positions) if i + 1 < len(call.args)
    }
    arguments.update({name: (value, script.origin(call, name)) for name, value in call.kwargs.items() if name != "params"})
    _map_arguments(b, spec, call.name, arguments)
    params = call.args[0] if call.args else None
    decays = b.get("optimizer.weight_decay", 0.0)
    if isinstance(params, Unknown) and params.text.endswith(".parameters()") and isinstance(decays, int | float) and decays > 0:
        why = f"{call.text}({params.text}) at {script.where(call)}: one parameter group, every parameter decayed (biases and norms too)"
        b.set("optimizer.exclude_1d", False, why)
        b.set("optimizer.no_weight_decay", [], why)


def _from_dict(b: Builder, cfg: ColossalConfig) -> bool:
    section = cfg.values.get("optimizer")
    if not isinstance(section, dict) or _class_name(section.get("type")) not in OPTIMIZERS:
        return False
    b.used.add("optimizer")
    class_name = _class_name(section["type"])
    spec = OPTIMIZERS[class_name]
    b.set("optimizer.type", spec.type, f"{cfg.where('optimizer')} type={class_name}")
    arguments: dict[str, tuple[Argument, str]] = {
        name: (Found(value), f"{cfg.where('optimizer')} {name}={value!r}") for name, value in section.items() if name != "type"
    }
    _map_arguments(b, spec, class_name, arguments)
    return True


def map_optimizer(b: Builder, cfg: ColossalConfig, script: TrainScript | None) -> None:
    """Set the ``optimizer`` section."""
    call = script.first(*OPTIMIZERS) if script else None
    if call is not None and script is not None:
        _from_call(b, script, call)
    elif not _from_dict(b, cfg):
        builds = (
            "the train script builds no optimizer the import knows"
            if script
            else "the optimizer is built in the train script (give --train-script)"
        )
        b.fill("optimizer.type", "adamw", f"{builds}: largebatch's default")
    for name, key in (("LEARNING_RATE", "optimizer.lr"), ("WEIGHT_DECAY", "optimizer.weight_decay")):
        if name in cfg.values and not b.has(key) and (script is None or name not in script.config_reads):
            b.set(key, cfg.values[name], f"{cfg.stated(name)}, by its name")
            b.used.add(name)


@dataclasses.dataclass(frozen=True)
class ScheduleSpec:
    """A Colossal-AI scheduler: the type here, and the positions of its counts and floor."""

    type: str
    total: int
    warmup: int | None
    floor: tuple[str, int, float] | None  # (argument, position, Colossal-AI's default)
    power: int | None = None


SCHEDULES = {
    "LinearWarmupLR": ScheduleSpec("linear", 1, 2, None),
    "CosineAnnealingWarmupLR": ScheduleSpec("cosine", 1, 2, ("eta_min", 3, 0.0)),
    "CosineAnnealingLR": ScheduleSpec("cosine", 1, None, ("eta_min", 2, 0.0)),
    "PolynomialWarmupLR": ScheduleSpec("polynomial", 1, 2, ("end_lr", 3, 0.0001), power=4),
    "PolynomialLR": ScheduleSpec("polynomial", 1, None, ("end_lr", 2, 0.0001), power=3),
}


def _by_epoch(script: TrainScript) -> bool | None:
    hook = script.first("LRSchedulerHook")
    argument = hook.argument("by_epoch", 1) if hook else None
    return bool(argument.value) if isinstance(argument, Found) else None


def _stepped_every_iteration(script: TrainScript, call: Call) -> Call | None:
    if call.assigned_to is None:
        return None
    return next((c for c in script.calls if c.text == f"{call.assigned_to}.step" and c.loop_depth >= 2), None)


def _map_schedule_call(b: Builder, script: TrainScript, call: Call) -> None:
    spec = SCHEDULES[call.name]
    b.set("lr_schedule.type", spec.type, f"{call.text} at {script.where(call)}")
    total = call.argument("total_steps", spec.total)
    warmup = call.argument("warmup_steps", spec.warmup) if spec.warmup is not None else None
    counted = [a.origin for a in (total, warmup) if isinstance(a, Found)]
    by_epoch = _by_epoch(script)
    in_epochs = by_epoch if by_epoch is not None else any("EPOCH" in origin for origin in counted)
    origin = script.origin(call, "warmup_steps", spec.warmup)
    if by_epoch is not None:
        origin += f", counted in {'epochs' if by_epoch else 'steps'} by LRSchedulerHook(by_epoch={by_epoch})"
    else:
        stepper = _stepped_every_iteration(script, call)
        if stepper is not None and in_epochs:
            origin += (
                f"; {script.path.name}:{stepper.line} steps it every iteration while its counts are named in epochs: "
                "read as epochs, as the names say"
            )
    if warmup is not None:
        b.take("lr_schedule.warmup_epochs" if in_epochs else "lr_schedule.warmup_steps", warmup, origin)
    epochs = b.get("epochs")
    if isinstance(total, Found) and not (in_epochs and total.value == epochs):
        span = f"{epochs} epochs" if epochs else "all epochs"
        b.skip(script.origin(call, "total_steps", spec.total), total.value, f"the schedule here always spans the whole run ({span})")
    if spec.floor is not None:
        name, position, default = spec.floor
        if not b.take("lr_schedule.min_lr", call.argument(name, position), script.origin(call, name, position)):
            b.set("lr_schedule.min_lr", default, f"{call.name}'s default {name}")
    if spec.power is not None:
        b.take("lr_schedule.power", call.argument("power", spec.power), script.origin(call, "power", spec.power))


def map_schedule(b: Builder, cfg: ColossalConfig, script: TrainScript | None) -> None:
    """Set the ``lr_schedule`` section."""
    schedulers = [c for c in script.calls if c.name.endswith("LR")] if script else []
    known = next((c for c in schedulers if c.name in SCHEDULES), None)
    if known is not None and script is not None:
        _map_schedule_call(b, script, known)
    elif schedulers and script is not None:
        first = schedulers[0]
        b.skip(f"{first.text} at {script.where(first)}", "", "no equivalent: lr_schedule.type is linear, cosine, polynomial or constant")
    elif script is not None:
        b.set("lr_schedule.type", "constant", f"{script.path.name} builds no lr scheduler: a constant learning rate")
    if "WARMUP_EPOCHS" in cfg.values and not b.has("lr_schedule.warmup_epochs") and not b.has("lr_schedule.warmup_steps"):
        if script is None or "WARMUP_EPOCHS" not in script.config_reads:
            b.set("lr_schedule.warmup_epochs", cfg.values["WARMUP_EPOCHS"], f"{cfg.stated('WARMUP_EPOCHS')}, by its name")
            b.used.add("WARMUP_EPOCHS")
    if script is None:
        b.fill("lr_schedule.type", "cosine", "the schedule is built in the train script (give --train-script): largebatch's default")
