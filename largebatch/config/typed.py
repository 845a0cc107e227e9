"""The validated config as typed, frozen objects, and the generator of their classes.

``schema.SCHEMA`` stays the one description of every key (type, default, range, doc);
``largebatch/config/sections.py`` turns each of its sections into a frozen dataclass
written out as source, so code reads ``cfg.data.num_workers`` or ``cfg.optimizer.lr``, a
type checker sees their types, and an assignment raises
``dataclasses.FrozenInstanceError``. That file is generated from the schema::

    python -m largebatch.config.generate     # rewrites largebatch/config/sections.py

and a test fails when the two differ (``largebatch.config.generate``). Lists become tuples and free dicts read-only dicts.
An open section (``model``, ``task``, ``optimizer``) keeps the keys the schema does not
name in ``extra``; ``hooks`` keeps its entries as given. ``to_dict()`` gives back exactly
the dict ``validate`` returned.

Outside this package nothing turns a dict into a typed config: ``largebatch.config
.resolve_config`` does it once per run, and components receive their typed sections.
``typed`` and ``section`` below are for this package and for tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from largebatch.config import sections
from largebatch.config.frozen import ConfigSection, FrozenDict, freeze, thaw
from largebatch.config.schema import validate, validate_section
from largebatch.config.sections import *  # noqa: F403 - the section classes, importable from here too
from largebatch.config.sections import Config

__all__ = ["Config", "ConfigSection", "FrozenDict", "freeze", "section", "thaw", "typed", *sections.__all__]


def typed(config: Mapping[str, Any] | ConfigSection) -> Any:
    """The config as a frozen ``Config``: a typed one as is; a dict validated first (a
    top-level ``derived`` key, which ``config show`` and a run's ``config.yaml`` carry, is
    left out: those numbers are computed at launch).

    Raises:
        ConfigError: a dict that does not validate.
    """
    if isinstance(config, ConfigSection):
        return config
    return Config.from_dict(validate(thaw({k: v for k, v in config.items() if k != "derived"})))


def section(name: str, values: Mapping[str, Any]) -> Any:
    """Top-level section ``name`` typed from a dict, its missing keys filled with the
    schema's defaults (tests build components' sections this way).

    Raises:
        ConfigError: a key of the dict the schema rejects.
    """
    cls = getattr(sections, "".join(part.capitalize() for part in name.split("_")) + "Config")
    return cls.from_dict(validate_section(name, thaw(values)))
