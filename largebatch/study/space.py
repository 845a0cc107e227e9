"""The search space: which hyperparameters a study tunes, their ranges per cell, and the
config overrides a point stands for.

Searchable parameters (``PARAMS``): the peak learning rate ``lr`` (``optimizer.lr``), the
warmup as a share of the run (``warmup_fraction``) or in epochs (``warmup_epochs``), the
weight decay, ``one_minus_momentum`` (1 - beta1 for adamw and lamb, 1 - momentum for sgd
and lars: searched on a log scale, as Shallue et al. 2019 and Nado et al. 2021 tune it) and
the epoch budget ``epochs``. A range may move with the batch: ``scale='sqrt'`` or
``'linear'`` multiplies both ends by (batch / base_batch)^(1/2 or 1), so every cell searches
around its own scaling rule with the same relative width. The epoch budget may follow a
pilot fit instead (``scale='pilot'``, with the study's ``pilot`` for the optimizer): a run
of S steps at batch B sees S B samples, and the fit S = S_min (1 + B_crit / B) predicts
S_min (B + B_crit) of them, so both ends are multiplied by (B + B_crit) / (base + B_crit):
every batch gets the same multiple of its predicted steps.

A point of the unit cube (one coordinate per parameter, ``unit_point``) maps to every
cell's ranges, so all cells try the same quasi-random points. ``edges`` says where a
chosen point sits within 10% of a range's end (on the log scale for log parameters), and
``widened`` proposes the wider range; a chosen budget (``epochs``) at the top of its range,
the longest a cell could run, is an edge too.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from largebatch.errors import UserError

# name -> (overrides it sets, default log scale, allowed open interval)
PARAMS: dict[str, tuple[str, bool, tuple[float, float]]] = {
    "lr": ("optimizer.lr", True, (0.0, math.inf)),
    "warmup_fraction": ("lr_schedule.warmup_epochs (a share of the run's epochs)", False, (-1e-12, 1.0)),
    "warmup_epochs": ("lr_schedule.warmup_epochs", False, (-1e-12, math.inf)),
    "weight_decay": ("optimizer.weight_decay", True, (-1e-12, math.inf)),
    "one_minus_momentum": ("optimizer.betas[0] = 1 - x (adamw, lamb); optimizer.momentum = 1 - x (sgd, lars)", True, (0.0, 1.0)),
    "epochs": ("epochs (an integer)", False, (0.5, math.inf)),
}
PARAM_KEYS = ("low", "high", "log", "scale", "base_batch")
SCALES = {"none": 0.0, "sqrt": 0.5, "linear": 1.0, "pilot": math.nan}
EDGE = 0.1  # a chosen point in the outer 10% of a range marks the cell
BETAS = ("adamw", "lamb")


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched hyperparameter; ``low``/``high`` are the range at ``base_batch``
    (``None``: the study's smallest batch) before ``scale``."""

    name: str
    low: float
    high: float
    log: bool
    scale: str = "none"
    base_batch: int | None = None
    pilot_b_crit: float | None = None  # scale='pilot': the optimizer's pilot B_crit

    @property
    def integer(self) -> bool:
        return self.name == "epochs"

    def bounds(self, batch: int, smallest: int) -> tuple[float, float]:
        """The range at ``batch``."""
        base = self.base_batch or smallest
        if self.scale == "pilot":
            assert self.pilot_b_crit is not None
            factor = (batch + self.pilot_b_crit) / (base + self.pilot_b_crit)
        else:
            factor = (batch / base) ** SCALES[self.scale]
        return self.low * factor, self.high * factor

    def value(self, unit: float, batch: int, smallest: int) -> float | int:
        """The value at ``unit`` in [0, 1) of this cell's range (6 significant digits;
        integers: every value of the range equally wide)."""
        low, high = self.bounds(batch, smallest)
        wide_low, wide_high = (low - 0.5, high + 0.5) if self.integer else (low, high)
        t_low, t_high = (math.log(wide_low), math.log(wide_high)) if self.log else (wide_low, wide_high)
        x = t_low + unit * (t_high - t_low)
        x = math.exp(x) if self.log else x
        if self.integer:
            return int(min(max(round(x), math.ceil(low)), math.floor(high)))
        return min(max(float(f"{x:.6g}"), low), high)

    def position(self, value: float, batch: int, smallest: int) -> float:
        """Where ``value`` sits in this cell's range: 0 at ``low``, 1 at ``high`` (log scale when ``log``)."""
        low, high = self.bounds(batch, smallest)
        if self.integer:
            low, high = low - 0.5, high + 0.5
        if self.log:
            return (math.log(value) - math.log(low)) / (math.log(high) - math.log(low))
        return (value - low) / (high - low)

    def widened(self, side: str) -> tuple[float | int, float | int] | None:
        """The range (at ``base_batch``) with ``side`` ('low' or 'high') moved out by half the range.

        None when that side already sits at the lowest or highest value the parameter allows
        (a warmup share from 0): the edge is the parameter's, and no wider range exists there.
        """
        lo_ok, hi_ok = max(PARAMS[self.name][2][0], 0.0), PARAMS[self.name][2][1]
        if (side == "low" and self.low <= lo_ok) or (side == "high" and self.high >= hi_ok):
            return None
        if self.log:
            factor = math.sqrt(self.high / self.low)
            low, high = (self.low / factor, self.high) if side == "low" else (self.low, self.high * factor)
        else:
            half = (self.high - self.low) / 2
            low, high = (self.low - half, self.high) if side == "low" else (self.low, self.high + half)
        if low < lo_ok or (self.log and low <= 0):  # stay inside what the parameter allows
            low = (self.low + lo_ok) / 2
        if high >= hi_ok:
            high = (self.high + hi_ok) / 2
        if self.integer:
            return max(1, math.floor(low)), math.ceil(high)
        return float(f"{round(low, 12):.3g}"), float(f"{round(high, 12):.3g}")


def parse_space(spec: dict[str, Any], key: str, where: str, pilot_b_crit: float | None = None) -> tuple[Param, ...]:
    """The ``search`` section for one optimizer, checked (``pilot_b_crit``: its pilot's B_crit, if any).

    Raises:
        UserError: an unknown parameter, a missing or empty range, a log range through 0,
            a range outside what the parameter allows, an unknown ``scale``, ``scale='pilot'``
            on another parameter than ``epochs`` or without a pilot.
    """
    if not spec:
        raise UserError(
            f"search at least the learning rate, e.g. search = dict(lr=dict(low=1e-3, high=1e-1)); known: {', '.join(PARAMS)}",
            key=key,
            path=where,
        )
    if "warmup_fraction" in spec and "warmup_epochs" in spec:
        raise UserError("search warmup_fraction or warmup_epochs, not both", key=key, path=where)
    params = []
    for name in PARAMS:
        if name not in spec:
            continue
        entry, pkey = spec[name], f"{key}.{name}"
        unknown = [k for k in entry if k not in PARAM_KEYS]
        if unknown:
            raise UserError(f"unknown key {unknown[0]!r}; a range takes {', '.join(PARAM_KEYS)}", key=pkey, path=where)
        if "low" not in entry or "high" not in entry:
            raise UserError("give the range as low=..., high=...", key=pkey, path=where)
        low, high = entry["low"], entry["high"]
        if any(isinstance(v, bool) or not isinstance(v, int | float) for v in (low, high)):
            raise UserError(f"low and high must be numbers, got {low!r} and {high!r}", key=pkey, path=where)
        if not low < high:
            raise UserError(f"the range [{low}, {high}] is empty; give low < high", key=pkey, path=where)
        log = entry.get("log", PARAMS[name][1])
        lo_ok, hi_ok = PARAMS[name][2]
        if log and low <= 0:
            raise UserError(f"a log range must stay above 0, got low={low}; set log=False or a positive low", key=pkey, path=where)
        if low <= lo_ok or high >= hi_ok:
            raise UserError(f"[{low}, {high}] leaves the allowed ({max(lo_ok, 0):g}, {hi_ok:g})", key=pkey, path=where)
        if name == "epochs" and (low != int(low) or high != int(high)):
            raise UserError(f"epochs are whole numbers, got [{low}, {high}]", key=pkey, path=where)
        scale = entry.get("scale", "none")
        if scale not in SCALES:
            raise UserError(f"unknown scale {scale!r}; use one of {', '.join(SCALES)}", key=f"{pkey}.scale", path=where)
        if scale == "pilot" and (name != "epochs" or pilot_b_crit is None):
            raise UserError(
                "scale='pilot' scales the epoch budget by a pilot fit: use it on epochs, with pilot = dict(<optimizer>="
                "dict(s_min=..., b_crit=...)) for every optimizer",
                key=f"{pkey}.scale",
                path=where,
            )
        base = entry.get("base_batch")
        if base is not None and (isinstance(base, bool) or not isinstance(base, int) or base < 1):
            raise UserError(f"must be a positive integer, got {base!r}", key=f"{pkey}.base_batch", path=where)
        params.append(Param(name, float(low), float(high), bool(log), scale, base, pilot_b_crit if scale == "pilot" else None))
    unknown = sorted(set(spec) - set(PARAMS))
    if unknown:
        raise UserError(f"unknown parameter {unknown[0]!r}; searchable: {', '.join(PARAMS)}", key=key, path=where)
    return tuple(params)


def dimensions(spaces: list[tuple[Param, ...]]) -> list[str]:
    """The unit cube's coordinates: every parameter any optimizer searches, in ``PARAMS`` order."""
    names = {p.name for space in spaces for p in space}
    return [name for name in PARAMS if name in names]


def point_values(space: tuple[Param, ...], unit: dict[str, float], batch: int, smallest: int) -> dict[str, float | int]:
    """A unit-cube point as this cell's parameter values."""
    return {p.name: p.value(unit[p.name], batch, smallest) for p in space}


def overrides(values: dict[str, float | int], optimizer: str, base_epochs: int, beta2: float) -> list[str]:
    """The ``--set`` overrides of a point (``PARAMS`` says which key each sets)."""
    out = []
    epochs = int(values.get("epochs", base_epochs))
    for name, value in values.items():
        if name == "lr":
            out.append(f"optimizer.lr={value!r}")
        elif name == "weight_decay":
            out.append(f"optimizer.weight_decay={value!r}")
        elif name == "epochs":
            out.append(f"epochs={int(value)}")
        elif name in ("warmup_fraction", "warmup_epochs"):
            warmup = value * epochs if name == "warmup_fraction" else value
            out += ["lr_schedule.warmup_steps=null", f"lr_schedule.warmup_epochs={float(f'{warmup:.6g}')!r}"]
        elif name == "one_minus_momentum":
            momentum = float(f"{1.0 - value:.8g}")
            out.append(f"optimizer.betas=[{momentum!r}, {beta2!r}]" if optimizer in BETAS else f"optimizer.momentum={momentum!r}")
    return out


def edges(space: tuple[Param, ...], values: dict[str, float | int], batch: int, smallest: int) -> list[tuple[str, str, float]]:
    """``(param, 'low' or 'high', position)`` for every value in the outer ``EDGE`` of its range,
    and for a whole number (the epoch budget) at either end of its range: the shortest or the
    longest run the cell allowed (a shorter schedule can reach a target in fewer steps, so a
    choice at the shortest is an edge for steps to target as much as one at the longest)."""
    marks = []
    for p in space:
        if p.name not in values:
            continue
        u = p.position(values[p.name], batch, smallest)
        low, high = p.bounds(batch, smallest)
        if u < EDGE or (p.integer and values[p.name] <= math.ceil(low)):
            marks.append((p.name, "low", u))
        elif u > 1 - EDGE or (p.integer and values[p.name] >= math.floor(high)):
            marks.append((p.name, "high", u))
    return marks
