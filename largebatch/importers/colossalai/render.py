"""The imported config as a Python config file in the style of configs/vit-b16.py: a
header saying where every value came from, then lower-case dicts in schema order."""

from __future__ import annotations

import textwrap
from typing import Any

from largebatch.config.schema import SCHEMA, Section
from largebatch.importers.colossalai.builder import Builder, Entry

WIDTH = 100


def literal(value: Any) -> str:
    """``value`` as Python source: dicts as ``dict(key=...)``, strings single-quoted."""
    if isinstance(value, dict):
        if all(isinstance(k, str) and k.isidentifier() for k in value):
            return "dict(" + ", ".join(f"{k}={literal(v)}" for k, v in value.items()) + ")"
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    return repr(value)


def _ordered(values: dict[str, Any], section: Section) -> dict[str, Any]:
    """``values`` in the schema's order, the keys it does not name after."""
    order = list(section.fields)
    known = sorted((k for k in values if k in section.fields), key=order.index)
    ordered = {k: values[k] for k in known}
    ordered.update({k: v for k, v in values.items() if k not in section.fields})
    for key, value in ordered.items():
        spec = section.fields.get(key)
        if isinstance(value, dict) and isinstance(spec, Section):
            ordered[key] = _ordered(value, spec)
    return ordered


def _position(dotted: str) -> tuple[int, int]:
    """Where a dotted key sits in the schema (keys it does not name last), to list keys in the file's order."""
    top, _, rest = dotted.partition(".")
    order = list(SCHEMA.fields)
    spec = SCHEMA.fields.get(top)
    inner = list(spec.fields) if isinstance(spec, Section) else []
    first = rest.split(".")[0]
    return (order.index(top) if top in order else len(order), inner.index(first) if first in inner else len(inner))


def _assignment(key: str, value: Any) -> str:
    line = f"{key} = {literal(value)}"
    if not isinstance(value, dict) or len(line) <= WIDTH:
        return line
    items = "".join(f"    {k}={literal(v)},\n" for k, v in value.items())
    return f"{key} = dict(\n{items})"


def _comment(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, WIDTH - 2, initial_indent=f"# {indent}", subsequent_indent=f"# {indent}    ", break_on_hyphens=False)


def _entries(title: str, entries: list[Entry], arrow: str) -> list[str]:
    if not entries:
        return []
    lines = ["#", f"# {title}"]
    for entry in entries:
        shown = "" if entry.value in ("", None) else f" = {literal(entry.value)}"
        lines += _comment(f"{entry.name}{shown}", "  ")
        lines += _comment(f"{arrow}{entry.why}", "      ")
    return lines


def render(b: Builder, sources: list[tuple[str, str]], check: str) -> str:
    """The config file's text.

    Args:
        b: the built config with the story of each value.
        sources: ``(label, text)`` lines naming what it was imported from.
        check: the command that shows the config resolved.
    """
    header = ["# Imported from a Colossal-AI config by `largebatch config import colossalai` (docs/coming-from.md)."]
    header += [line for label, text in sources for line in _comment(f"{label:<13} {text}", "  ")]
    header += _entries(
        "Mapped (largebatch key = value, <- the Colossal-AI setting it comes from):",
        sorted(b.mapped, key=lambda e: _position(e.name)),
        "<- ",
    )
    header += _entries("Filled in (not in the source; check them):", sorted(b.filled, key=lambda e: _position(e.name)), "")
    header += _entries("Not mapped (Colossal-AI setting = value: why):", b.unmapped, "")
    header += ["#", f"# Check it: {check}"]
    config = _ordered(b.config, SCHEMA)
    scalars = [_assignment(k, v) for k, v in config.items() if not isinstance(v, dict)]
    sections = [_assignment(k, v) for k, v in config.items() if isinstance(v, dict)]
    return "\n".join(header) + "\n\n" + "\n".join(scalars) + "\n\n" + "\n".join(sections) + "\n"
