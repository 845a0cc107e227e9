"""The building blocks of the typed config: frozen values and the section base class.

A validated config is held as frozen dataclasses, one per schema section
(``largebatch.config.sections``, generated from the schema). Lists become tuples and free
dicts ``FrozenDict``; ``ConfigSection.to_dict()`` gives back the plain nested dict that
``largebatch.config.schema.validate`` returned (YAML dumps, checkpoints and their hash).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from largebatch.config.schema import SCHEMA, Field, Section
from largebatch.errors import ConfigError


class FrozenDict(dict):
    """A dict that refuses changes (a free dict or a hook entry inside a frozen config)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("the config is frozen; build a new one from to_dict() instead")

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))


for _method in ("__setitem__", "__delitem__", "__ior__", "clear", "pop", "popitem", "setdefault", "update"):
    setattr(FrozenDict, _method, FrozenDict._refuse)


def freeze(value: Any) -> Any:
    """Lists (and tuples) as tuples and dicts as ``FrozenDict``, all the way down."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return FrozenDict((k, freeze(v)) for k, v in value.items())
    return value


def thaw(value: Any) -> Any:
    """The plain form of a frozen value: tuples as lists, dicts as dicts, sections via ``to_dict``."""
    if isinstance(value, ConfigSection):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    return value


_CLASSES: dict[int, type[ConfigSection]] = {}  # id(schema Section) -> its dataclass


class ConfigSection:
    """Base of the section dataclasses: built from a validated section, back to its dict.

    Each subclass names its schema section in ``_schema`` and registers itself, so a
    section's subsections are built by their own classes.
    """

    _schema: ClassVar[Section] = SCHEMA

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _CLASSES[id(cls._schema)] = cls

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Self:
        """Build from a validated section (every schema key present).

        Raises:
            ConfigError: ``sections.py`` names what the schema no longer has (``STALE``).
        """
        if STALE:
            raise ConfigError(
                f"largebatch/config/sections.py is stale: the schema has no {', '.join(STALE)}; run `python -m largebatch.config.generate`"
            )
        kwargs: dict[str, Any] = {}
        for name, spec in cls._schema.fields.items():
            value = values[name]
            kwargs[name] = _CLASSES[id(spec)].from_dict(value) if isinstance(spec, Section) else freeze(value)
        if cls._schema.open:
            kwargs["extra"] = FrozenDict((k, freeze(v)) for k, v in values.items() if k not in cls._schema.fields)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The plain nested dict ``validate`` returned: schema keys in schema order, then
        an open section's other keys in their order."""
        out = {name: thaw(getattr(self, name)) for name in self._schema.fields}
        out.update((k, thaw(v)) for k, v in getattr(self, "extra", {}).items())
        return out


# What the generated ``sections.py`` names and the schema no longer has. A stale
# ``sections.py`` still imports, so that ``python -m largebatch.config.generate`` (which
# imports this package) can replace it; no config is typed until it has (``from_dict``).
STALE: list[str] = []


def schema_section(name: str) -> Section:
    """The schema's section ``name`` (the root for ``""``); an empty one, noted in ``STALE``,
    when the schema no longer has it."""
    spec = SCHEMA.fields.get(name) if name else SCHEMA
    if isinstance(spec, Section):
        return spec
    STALE.append(name)
    return Section({})


def field_meta(dotted: str) -> types.MappingProxyType:
    """A schema key's ``doc``, ``choices``, ``low`` and ``high``, as a dataclass field's
    metadata (empty, noted in ``STALE``, for a key the schema no longer has)."""
    spec: Any = SCHEMA
    for part in dotted.split("."):
        spec = spec.fields.get(part) if isinstance(spec, Section) else None
    if not isinstance(spec, Field):
        STALE.append(dotted)
        return types.MappingProxyType({})
    return types.MappingProxyType({"doc": spec.doc, "choices": spec.choices, "low": spec.low, "high": spec.high})
