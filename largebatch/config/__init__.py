"""Config files to the typed config, once: ``resolve_config``.

A run's config is a file (``.py`` or ``.yaml``, with ``_base_`` pieces) plus ``--set``
overrides. ``resolve_config`` loads them (``loader``), validates every key against the
schema (``schema``), checks what needs the model library (the model's name and
arguments), and returns the frozen, typed ``Config`` (``sections``, generated from the
schema). A run directory's saved ``config.yaml`` is read by ``resolve_saved_config``
instead, as data: one YAML file, its ``_base_`` refused. These are the only places that
turn files and dicts into a config: components
receive their typed section (``cfg.data``, ``cfg.optimizer``, ...), and the numbers that
follow from the world size and the data are one frozen ``Derived`` (``derive``) holding
the run's ``BatchPlan``.
"""

from __future__ import annotations

import copy
import pathlib
from collections.abc import Sequence
from typing import Any

import yaml

from largebatch.config.derive import Derived, LrScaling, derive
from largebatch.config.loader import apply_override, load_config, read_yaml_data
from largebatch.config.redact import restore
from largebatch.config.schema import SCHEMA, validate
from largebatch.config.sections import *  # noqa: F403 - the section classes
from largebatch.config.sections import Config
from largebatch.config.typed import typed
from largebatch.errors import ConfigError

__all__ = [
    "SCHEMA",
    "Config",
    "Derived",
    "LrScaling",
    "check_config",
    "derive",
    "dump_yaml",
    "load_config",
    "resolve_config",
    "resolve_saved_config",
    "restore_secrets",
    "validate",
]


def resolve_config(path: str | pathlib.Path, overrides: Sequence[str] = ()) -> Config:
    """The run's config: the file with its bases, ``--set`` overrides applied, validated
    (defaults filled in), checked against the model library, typed and frozen.

    A run's own ``config.yaml`` is a config file too (its ``derived:`` numbers, computed
    at launch, are left out).

    Raises:
        ConfigError: the file, an override or a value is wrong (naming the key and the fix).
    """
    return check_config(typed(load_config(path, list(overrides))))


def resolve_saved_config(path: str | pathlib.Path, overrides: Sequence[str] = (), *, trust: bool = False) -> tuple[Config, Config]:
    """A run directory's ``config.yaml``, read as data: the config as saved, and with
    ``--set`` overrides applied (checked as ``resolve_config`` checks).

    A run directory may come from anyone, so its config is one YAML file and nothing
    else: a ``_base_`` in it (which would load, and for a ``.py`` file run, another file
    beside it) is refused unless ``trust`` says to follow it, as ``--trust-checkpoint`` does.

    Raises:
        ConfigError: the file names ``_base_`` (without ``trust``), or it, an override or a
            value is wrong.
    """
    data = read_yaml_data(path)
    if "_base_" in data:
        if not trust:
            raise ConfigError(
                f"names _base_ {data['_base_']!r}, which would load (a .py file: run) a file from the run directory, and a "
                "run directory is read as data (its config.yaml holds the whole config); remove the _base_ line, or, to "
                "follow it in a run directory you trust, resume with --trust-checkpoint",
                path=str(path),
            )
        data = load_config(path)
    saved = typed(data)
    if not overrides:
        return saved, check_config(saved)
    data = copy.deepcopy(data)
    for override in overrides:
        apply_override(data, override)
    return saved, check_config(typed(data))


def check_config(cfg: Config) -> Config:
    """``cfg``, once the checks that need more than the schema pass: the model's name and
    arguments against the model library, the optimizer's keys against its signature
    (``resolve_config`` and ``resolve_saved_config`` run them).

    The checks belong to the layers that build the model and the optimizer, which import this
    package's modules; this module (the entry, ``resolve_config``) sits above them and
    imports them when it runs (docs/architecture.md), so loading a section imports neither.

    Raises:
        ConfigError: an unknown model, or a key the model or the optimizer does not take.
    """
    from largebatch.models import check_model_config
    from largebatch.optim import optimizer_kwargs

    check_model_config(cfg)
    optimizer_kwargs(cfg.optimizer.to_dict())
    return cfg


def restore_secrets(saved: Config, source: Config) -> Config:
    """``saved`` (a run's redacted ``config.yaml``, resolved) with each redacted value taken
    from ``source`` (the config file the command names) where that file's value redacts to
    the saved one (``largebatch.config.redact``).

    Raises:
        ConfigError: the result does not validate.
    """
    return typed(restore(saved.to_dict(), source.to_dict()))


def dump_yaml(config: dict[str, Any]) -> str:
    """A config (``Config.to_dict()``, with any ``derived`` numbers) as YAML, keys in the
    order given (round-trips through loading)."""
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False, width=100)
