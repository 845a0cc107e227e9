"""Optimizers by name (``adamw``, ``sgd``, ``lamb``, ``lars``), their parameter groups and schedules."""

from __future__ import annotations

import difflib
import inspect
from typing import Any

import torch

from largebatch.config.sections import OptimizerConfig
from largebatch.config.signature import check_call
from largebatch.errors import ConfigError
from largebatch.optim.param_groups import section_param_groups

GROUP_KEYS = ("no_weight_decay", "exclude_1d", "layer_decay")


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """The optimizer class for ``optimizer.type``."""
    if name == "adamw":
        return torch.optim.AdamW
    if name == "sgd":
        return torch.optim.SGD
    if name == "lamb":
        from largebatch.optim.lamb import Lamb

        return Lamb
    if name == "lars":
        from largebatch.optim.lars import Lars

        return Lars
    raise ConfigError(f"unknown optimizer {name!r}; use adamw, sgd, lamb or lars", key="optimizer.type")


def optimizer_kwargs(section: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for the optimizer class, checked against its signature.

    Raises:
        ConfigError: a key the optimizer does not take, with a "did you mean".
    """
    cls = optimizer_class(section["type"])
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "params")]
    kwargs = {k: v for k, v in section.items() if k not in ("type", *GROUP_KEYS)}
    for key in kwargs:
        if key not in accepted:
            close = difflib.get_close_matches(key, [*accepted, *GROUP_KEYS], n=1)
            hint = f"did you mean 'optimizer.{close[0]}'?" if close else f"{cls.__name__} takes: {', '.join(accepted)}"
            raise ConfigError(f"{section['type']} does not take {key!r}; {hint}", key=f"optimizer.{key}")
    check_call(cls, kwargs, "optimizer")
    for key in ("betas",):
        if key in kwargs and isinstance(kwargs[key], list):
            kwargs[key] = tuple(kwargs[key])
    return kwargs


def build_optimizer(section: OptimizerConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The ``optimizer`` section's optimizer over the model's parameter groups (weight-decay
    exclusion, optional layer-wise lr decay). The learning rate is set by the schedule each step."""
    groups = section_param_groups(section, model)
    return optimizer_class(section.type)(groups, **optimizer_kwargs(section.to_dict()))
