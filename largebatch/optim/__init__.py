"""Optimizers by name (``adamw``, ``sgd``, ``lamb``, ``lars``), their parameter groups and schedules.

Checking an ``optimizer`` section imports no torch: the optimizers' signatures are
recorded in ``largebatch.signatures`` (read from the classes when the installed torch is
not the recorded version).
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from largebatch import signatures
from largebatch.config.arguments import Signature, read_signature
from largebatch.config.frozen import thaw
from largebatch.config.sections import OptimizerConfig
from largebatch.errors import ConfigError

if TYPE_CHECKING:
    import torch

GROUP_KEYS = ("no_weight_decay", "exclude_1d", "layer_decay")


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """The optimizer class for ``optimizer.type``."""
    import torch

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


def optimizer_signature(name: str) -> Signature:
    """The constructor signature of ``optimizer_class(name)``: the recorded one while it is
    current, else read from the class."""
    recorded = signatures.OPTIMIZERS.get(name)
    if recorded is not None and recorded[0].matches_installed():
        return recorded[1]
    signature = read_signature(optimizer_class(name))
    assert signature is not None, name
    return signature


def optimizer_kwargs(section: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for the optimizer class, checked against its signature.

    Raises:
        ConfigError: a key the optimizer does not take, with a "did you mean".
    """
    signature = optimizer_signature(section["type"])
    accepted = [p for p in signature.names() if p != "params"]
    kwargs = {k: v for k, v in section.items() if k not in ("type", *GROUP_KEYS)}
    for key in kwargs:
        if key not in accepted:
            close = difflib.get_close_matches(key, [*accepted, *GROUP_KEYS], n=1)
            hint = f"did you mean 'optimizer.{close[0]}'?" if close else f"{signature.owner} takes: {', '.join(accepted)}"
            raise ConfigError(f"{section['type']} does not take {key!r}; {hint}", key=f"optimizer.{key}")
    signature.check(kwargs, "optimizer")
    for key in ("betas",):
        if key in kwargs and isinstance(kwargs[key], list):
            kwargs[key] = tuple(kwargs[key])
    return kwargs


def build_optimizer(
    section: OptimizerConfig, model: torch.nn.Module, *, fused_lamb: type[torch.optim.Optimizer] | None = None
) -> torch.optim.Optimizer:
    """The ``optimizer`` section's optimizer over the model's parameter groups (weight-decay
    exclusion, optional layer-wise lr decay). The learning rate is set by the schedule each step.

    Args:
        section: the ``optimizer`` section.
        model: the model (as trained: wrapped or sharded).
        fused_lamb: a whole LAMB optimizer class the device supplies (``Backend.fused_lamb``:
            Habana's FusedLamb), run for ``type='lamb'`` in place of largebatch's ``Lamb``
            where it can take the parameters (none sharded; ``largebatch.optim.lamb_habana``).

    Raises:
        ConfigError: a key the optimizer does not take.
        UserError: a setting ``fused_lamb`` cannot reproduce.
    """
    if fused_lamb is not None and section.type == "lamb":
        from largebatch.optim import lamb_habana

        if lamb_habana.applies(model):
            return lamb_habana.fused_lamb_optimizer(fused_lamb, section, model)
    from largebatch.optim.param_groups import section_param_groups

    groups = section_param_groups(section, model)
    values = {"type": section.type, "lr": section.lr, "weight_decay": section.weight_decay, **thaw(section.extra)}
    return optimizer_class(section.type)(groups, **optimizer_kwargs(values))
