"""Models from timm by name, with the config's keyword arguments.

``model = dict(name='vit_base_patch16_224', drop_rate=0.1)``: every key but ``name`` is a
keyword argument of ``timm.create_model``. ``num_classes``, ``img_size`` and
``in_chans`` default to the data section's ``num_classes``, ``image_size`` and
``channels``, so they are stated once. Weights are never downloaded: models start from
random initialisation (``pretrained=False``).
"""

from __future__ import annotations

import difflib
import inspect
import re
from typing import Any

import torch

from largebatch.config.signature import check_call
from largebatch.errors import ConfigError


def model_kwargs(cfg: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments for ``timm.create_model``, data-derived ones filled in."""
    kwargs = {k: v for k, v in cfg["model"].items() if k != "name"}
    data = cfg["data"]
    kwargs.setdefault("num_classes", data["num_classes"])
    kwargs.setdefault("img_size", data["image_size"])
    kwargs.setdefault("in_chans", data["channels"])
    return kwargs


def check_model_name(name: str) -> None:
    """Raise a ``ConfigError`` with close matches when timm has no model ``name``."""
    import timm

    if timm.is_model(name):
        return
    close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else "see timm.list_models('vit_*')"
    raise ConfigError(f"timm has no model {name!r}; {hint}", key="model.name")


def check_model_config(cfg: dict[str, Any]) -> None:
    """Check the model name and its keyword arguments without building the model.

    Raises:
        ConfigError: an unknown name, or a key that neither ``timm.create_model`` nor the
            model's classes take (with a "did you mean").
    """
    import timm

    name = cfg["model"]["name"]
    check_model_name(name)
    accepted = set(_accepted_kwargs(timm, name)) | set(inspect.signature(timm.create_model).parameters)
    for key in model_kwargs(cfg):
        if key not in accepted:
            close = difflib.get_close_matches(key, sorted(accepted), n=1)
            hint = f"did you mean 'model.{close[0]}'?" if close else "remove it"
            raise ConfigError(f"{name} does not take the argument {key!r}; {hint}", key=f"model.{key}")
    model_class = _main_class(timm, name)
    if model_class is not None:
        check_call(model_class, model_kwargs(cfg), "model")


def build_model(cfg: dict[str, Any]) -> torch.nn.Module:
    """Create the config's timm model on the CPU with random weights.

    Raises:
        ConfigError: unknown model name, or a keyword argument the model does not take
            (named as ``model.<key>``, with a "did you mean").
    """
    import timm

    name = cfg["model"]["name"]
    check_model_name(name)
    kwargs = model_kwargs(cfg)
    try:
        return timm.create_model(name, pretrained=False, **kwargs)
    except TypeError as exc:
        match = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
        if not match:
            raise ConfigError(f"timm could not build {name!r} with {kwargs}: {exc}", key="model") from exc
        bad = match.group(1)
        accepted = _accepted_kwargs(timm, name)
        close = difflib.get_close_matches(bad, accepted, n=1)
        hint = f"did you mean 'model.{close[0]}'?" if close else "remove it"
        raise ConfigError(f"{name} does not take the argument {bad!r}; {hint}", key=f"model.{bad}") from exc


def _main_class(timm: Any, name: str) -> type | None:
    """The model class of ``name``'s timm module: the one whose constructor takes the most arguments."""
    module = inspect.getmodule(timm.models.model_entrypoint(name))
    classes = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, torch.nn.Module) and obj.__module__ == module.__name__
    ]
    return max(classes, key=lambda c: len(inspect.signature(c.__init__).parameters), default=None)


def _accepted_kwargs(timm: Any, name: str) -> list[str]:
    """Constructor arguments of the model classes in ``name``'s timm module (for hints)."""
    module = inspect.getmodule(timm.models.model_entrypoint(name))
    names: set[str] = set()
    for obj in vars(module).values():
        if inspect.isclass(obj) and issubclass(obj, torch.nn.Module) and obj.__module__ == module.__name__:
            names.update(inspect.signature(obj.__init__).parameters)
    return sorted(names - {"self", "args", "kwargs"})
