"""The validated config as typed, frozen objects generated from the schema.

``schema.SCHEMA`` stays the one description of every key (type, default, range, doc);
this module turns each of its sections into a frozen dataclass, so code reads
``cfg.data.num_workers`` or ``cfg.optimizer.lr`` instead of string lookups, and an
assignment raises ``dataclasses.FrozenInstanceError``. Lists become tuples and free
dicts read-only dicts. An open section (``model``, ``task``, ``optimizer``) keeps the keys
the schema does not name in ``extra``; ``hooks`` keeps its entries as given.
``to_dict()`` gives back exactly the dict ``validate`` returned (YAML dumps, the
checkpoint's config and its hash).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

from largebatch.config.schema import REQUIRED, SCHEMA, Field, Section, validate, validate_section


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


class ConfigSection:
    """Base of the generated section classes."""

    _schema: Section = SCHEMA

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ConfigSection:
        """Build from a validated section (every schema key present)."""
        kwargs: dict[str, Any] = {}
        for name, spec in cls._schema.fields.items():
            value = values[name]
            kwargs[name] = SECTION_CLASSES[id(spec)].from_dict(value) if isinstance(spec, Section) else freeze(value)
        if cls._schema.open:
            kwargs["extra"] = FrozenDict((k, freeze(v)) for k, v in values.items() if k not in cls._schema.fields)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The plain nested dict ``validate`` returned: schema keys in schema order, then
        an open section's other keys in their order."""
        out = {name: thaw(getattr(self, name)) for name in self._schema.fields}
        out.update((k, thaw(v)) for k, v in getattr(self, "extra", {}).items())
        return out


def _annotation(spec: Field) -> Any:
    kind: Any = spec.kind
    if spec.kind is list:
        kind = tuple[(spec.items or Any), ...]
    elif spec.kind is dict:
        kind = Mapping[str, Any]
    return kind | None if spec.nullable or spec.default is None else kind


def _class_name(path: str) -> str:
    return "".join(part.capitalize() for part in path.split("_")) + "Config" if path else "Config"


SECTION_CLASSES: dict[int, type[ConfigSection]] = {}


def section_class(section: Section, path: str = "") -> type[ConfigSection]:
    """The frozen dataclass of ``section`` (and, first, of its subsections): one field per
    key with the schema's type and default (``metadata``: doc, choices, low, high); an
    open section also has ``extra``, its other keys."""
    fields: list[tuple[str, Any, dataclasses.Field[Any]]] = []
    for name, spec in section.fields.items():
        if isinstance(spec, Section):
            sub = section_class(spec, name)
            required = any(isinstance(f, Field) and f.default is REQUIRED for f in spec.fields.values())
            fields.append((name, sub, dataclasses.field() if required else dataclasses.field(default_factory=sub)))
            continue
        meta = types.MappingProxyType({"doc": spec.doc, "choices": spec.choices, "low": spec.low, "high": spec.high})
        if spec.default is REQUIRED:
            fields.append((name, _annotation(spec), dataclasses.field(metadata=meta)))
        else:
            frozen_default = freeze(spec.default)
            fields.append((name, _annotation(spec), dataclasses.field(default=frozen_default, metadata=meta)))
    if section.open:
        if "extra" in section.fields:
            raise AssertionError("'extra' is reserved in an open section")
        fields.append(("extra", Mapping[str, Any], dataclasses.field(default_factory=FrozenDict)))
    # Required fields first in the signature (dataclasses need it); to_dict keeps schema order.
    fields.sort(key=lambda f: f[2].default is dataclasses.MISSING and f[2].default_factory is dataclasses.MISSING, reverse=True)
    cls = dataclasses.make_dataclass(
        _class_name(path), fields, bases=(ConfigSection,), frozen=True, namespace={"_schema": section, "__doc__": section.doc or None}
    )
    cls.__module__ = __name__
    globals()[cls.__name__] = cls  # importable by name, so configs pickle (loader workers)
    SECTION_CLASSES[id(section)] = cls
    return cls


Config = section_class(SCHEMA)


def typed(config: Mapping[str, Any] | ConfigSection) -> Any:
    """The config as a frozen ``Config``: a typed one as is; a dict (the one ``validate``
    returned, one a caller changed, or a run's ``config.yaml``, whose ``derived`` numbers
    are left out) validated first, which leaves a validated dict as it is.

    Raises:
        ConfigError: a dict that does not validate.
    """
    if isinstance(config, ConfigSection):
        return config
    return Config.from_dict(validate(thaw({k: v for k, v in config.items() if k != "derived"})))


def validate_typed(config: dict[str, Any]) -> Any:
    """``validate``, then ``typed``: the checked config as a frozen ``Config``."""
    return Config.from_dict(validate(config))


def section_of(config: Mapping[str, Any] | ConfigSection, name: str) -> Any:
    """Top-level section ``name`` of ``config`` (typed, or a dict holding at least that
    section, as tests build them), typed."""
    return getattr(config, name) if isinstance(config, ConfigSection) else section(name, config[name])


def has_section(name: str) -> bool:
    """Whether the schema has a top-level section ``name``."""
    return isinstance(SCHEMA.fields.get(name), Section)


def section(name: str, values: Mapping[str, Any] | ConfigSection) -> Any:
    """Top-level section ``name`` typed: a frozen section as is; a dict (a component called
    with plain dicts, as tests do) checked against the schema, its missing keys filled with
    the schema's defaults, then converted.

    Raises:
        ConfigError: a key of the dict the schema rejects.
    """
    if isinstance(values, ConfigSection):
        return values
    return SECTION_CLASSES[id(SCHEMA.fields[name])].from_dict(validate_section(name, thaw(values)))
