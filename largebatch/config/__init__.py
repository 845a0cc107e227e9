"""Config files: load (``loader``), validate (``schema``), type (``typed``), derive (``derive``), save."""

from __future__ import annotations

import pathlib
from typing import Any

import yaml

from largebatch.config.derive import derive, make_plan, scaled_lr
from largebatch.config.loader import apply_override, load_config, merge_into
from largebatch.config.schema import SCHEMA, validate
from largebatch.config.typed import Config, typed, validate_typed

__all__ = [
    "SCHEMA",
    "Config",
    "apply_override",
    "derive",
    "dump_yaml",
    "load_and_validate",
    "load_config",
    "make_plan",
    "merge_into",
    "scaled_lr",
    "typed",
    "validate",
    "validate_typed",
]


def load_and_validate(path: str | pathlib.Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """``load_config`` then ``validate``: the resolved config with defaults filled in."""
    return validate(load_config(path, overrides))


def dump_yaml(config: dict[str, Any]) -> str:
    """The config as YAML, keys in the order they were given (round-trips through loading)."""
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False, width=100)
