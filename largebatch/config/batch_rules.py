"""The ``batch_schedule`` section's rules that need no world size (``validate`` runs them on
the config dict; the world size's are ``largebatch.batch_schedule.build_batch_schedule``'s).
The section itself, and what each type does: ``largebatch.batch_schedule``."""

from __future__ import annotations

import math
from typing import Any

from largebatch.errors import ConfigError


def check_batch_schedule(cfg: dict[str, Any]) -> None:
    """The section's rules that need no world size (``largebatch.config.schema`` calls it).

    Raises:
        ConfigError: naming the key, the value and the fix.
    """
    section, reference = cfg["batch_schedule"], cfg["global_batch_size"]
    kind = section["type"]
    used = {
        "ramp": ("start_batch_size", "ramp_samples", "increment"),
        "adaptive": ("start_batch_size", "max_batch_size", "check_every_samples", "branch_samples"),
    }
    for key in ("start_batch_size", "ramp_samples", "increment", "max_batch_size", "check_every_samples", "branch_samples"):
        if section[key] is not None and key not in used.get(kind, ()):
            takes = " or ".join(repr(k) for k, keys in used.items() if key in keys)
            raise ConfigError(f"is set but batch_schedule.type is {kind!r}; set type to {takes}, or drop it", key=f"batch_schedule.{key}")
    if section["keep_wd_timescale"] and cfg["optimizer"]["type"] != "adamw":
        raise ConfigError(
            f"keeps AdamW's weight-decay timescale, but optimizer.type is {cfg['optimizer']['type']!r}; set it to false",
            key="batch_schedule.keep_wd_timescale",
        )
    if section["lr_scaling"] == "adascale" and "noise_scale" not in hook_names(cfg):
        raise ConfigError(
            "'adascale' scales the learning rate by the noise_scale hook's estimate; add \"noise_scale\" to hooks "
            "(e.g. hooks = [dict(type='noise_scale', beta=0.9)]), or choose sqrt, linear or none",
            key="batch_schedule.lr_scaling",
        )
    if kind == "fixed":
        return
    start = section["start_batch_size"]
    if start is None:
        raise ConfigError(f"is required with type {kind!r}: the global batch at the start", key="batch_schedule.start_batch_size")
    if kind == "ramp":
        _check_ramp(section, start, reference)
    else:
        _check_adaptive(cfg, section, start, reference)


def _check_ramp(section: dict[str, Any], start: int, reference: int) -> None:
    if start >= reference:
        raise ConfigError(
            f"{start} is not below global_batch_size {reference}, where the ramp ends; lower it (e.g. {reference // 4})",
            key="batch_schedule.start_batch_size",
        )
    if section["ramp_samples"] is None:
        raise ConfigError(
            "is required with type 'ramp': the samples seen when the batch reaches global_batch_size", key="batch_schedule.ramp_samples"
        )
    increment = section["increment"]
    if increment is not None and (reference - start) % increment:
        divisors = [d for d in range(1, reference - start + 1) if (reference - start) % d == 0]
        nearest = min(divisors, key=lambda d: (abs(d - increment), d))
        raise ConfigError(
            f"{increment} does not lead from start_batch_size {start} to global_batch_size {reference}; "
            f"set it to a divisor of {reference - start}, e.g. {nearest}",
            key="batch_schedule.increment",
        )
    if increment is None:
        _check_doubling(start, reference, "batch_schedule.start_batch_size", "global_batch_size")


def _check_adaptive(cfg: dict[str, Any], section: dict[str, Any], start: int, reference: int) -> None:
    top = section["max_batch_size"] or reference
    key = "batch_schedule.max_batch_size" if section["max_batch_size"] else "batch_schedule.start_batch_size"
    if start >= top:
        raise ConfigError(f"{start} leaves no room to grow below the maximum batch {top}; lower it", key="batch_schedule.start_batch_size")
    _check_doubling(start, top, key, "max_batch_size" if section["max_batch_size"] else "global_batch_size")
    branch = section["criterion"] == "branch"
    if branch != (section["branch_samples"] is not None):
        needs = (
            "is required with criterion 'branch': the samples each fork trains on"
            if branch
            else "is read by criterion 'branch' only; drop it"
        )
        raise ConfigError(needs, key="batch_schedule.branch_samples")
    if section["criterion"] == "noise_scale" and "noise_scale" not in hook_names(cfg):
        raise ConfigError(
            "the criterion 'noise_scale' reads the noise_scale hook's estimate; add \"noise_scale\" to hooks "
            "(e.g. hooks = [dict(type='noise_scale', beta=0.9)])",
            key="batch_schedule.criterion",
        )


def hook_names(cfg: dict[str, Any]) -> set[str]:
    """The config's hooks by type (an entry is a name or a dict with ``type``)."""
    return {entry if isinstance(entry, str) else entry.get("type") for entry in cfg["hooks"]}


def _check_doubling(start: int, end: int, key: str, end_name: str) -> None:
    ratio = end / start
    if ratio == 2 ** round(math.log2(ratio)):
        return
    if key.endswith("max_batch_size"):
        fix = f"set max_batch_size to start_batch_size x 2^k, e.g. {start << math.floor(math.log2(ratio))} or {start << math.ceil(math.log2(ratio))}"
    else:
        fix = (
            f"set start_batch_size to {end_name} / 2^k, e.g. {end >> math.ceil(math.log2(ratio))} or {end >> math.floor(math.log2(ratio))}"
        )
        fix += ", or set batch_schedule.increment" if end_name == "global_batch_size" else ""
    raise ConfigError(f"doubling from start_batch_size {start} does not reach {end_name} {end}; {fix}", key=key)
