"""Writes ``largebatch/config/sections.py``, the typed config's classes, from the schema.

    python -m largebatch.config.generate

Each schema section becomes a frozen dataclass (``ConfigSection``) whose fields carry the
schema's types and defaults as source, so a type checker sees ``cfg.optimizer.lr`` as a
``float``; each field's metadata holds its doc, choices and bounds. ``render_sections``
gives the source; a test compares it with the file. The generated module looks the schema
up by name and tolerates names the schema no longer has, so this runs even when the file
is stale.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from largebatch.config.frozen import freeze
from largebatch.config.schema import REQUIRED, SCHEMA, Field, Section

SECTIONS_FILE = pathlib.Path(__file__).with_name("sections.py")
REGENERATE = "python -m largebatch.config.generate"


def class_name(path: str) -> str:
    """``lr_schedule`` -> ``LrScheduleConfig``; the root section is ``Config``."""
    return "".join(part.capitalize() for part in path.split("_")) + "Config" if path else "Config"


def _literal(value: Any) -> str:
    """Python source for a frozen default, in the project's formatting (double quotes)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple):
        items = ", ".join(_literal(v) for v in value)
        return f"({items},)" if len(value) == 1 else f"({items})"
    if isinstance(value, (bool, int, float)) or value is None:
        return repr(value)
    raise TypeError(f"no literal for the default {value!r}")


def _annotation(spec: Field) -> str:
    names = {int: "int", float: "float", str: "str", bool: "bool"}
    if spec.kind is list:
        kind = f"tuple[{names[spec.items] if spec.items else 'Any'}, ...]"
    elif spec.kind is dict:
        kind = "Mapping[str, Any]"
    else:
        kind = names[spec.kind]
    return f"{kind} | None" if spec.nullable or spec.default is None else kind


def _class_source(name: str, section: Section) -> list[str]:
    doc = section.doc or (f"The ``{name}`` section." if name else "The whole config.")
    lines = ["", "", "@dataclasses.dataclass(frozen=True)", f"class {class_name(name)}(ConfigSection):", f'    """{doc}"""', ""]
    lines.append(f'    _schema: ClassVar[Section] = schema_section("{name}")')
    required: list[str] = []
    optional: list[str] = []
    for key, spec in section.fields.items():
        if isinstance(spec, Section):
            needed = any(isinstance(f, Field) and f.default is REQUIRED for f in spec.fields.values())
            cls = class_name(key)
            (required if needed else optional).append(
                f"    {key}: {cls}" + ("" if needed else f" = dataclasses.field(default_factory={cls})")
            )
            continue
        meta = f'metadata=field_meta("{f"{name}." if name else ""}{key}")'
        if spec.default is REQUIRED:
            required.append(f"    {key}: {_annotation(spec)} = dataclasses.field({meta})")
        else:
            optional.append(f"    {key}: {_annotation(spec)} = dataclasses.field(default={_literal(freeze(spec.default))}, {meta})")
    lines += required + optional  # required first, as dataclasses need; to_dict keeps the schema's order
    if section.open:
        if "extra" in section.fields:
            raise AssertionError("'extra' is reserved in an open section")
        lines.append("    extra: Mapping[str, Any] = dataclasses.field(default_factory=FrozenDict)")
    return lines


def render_sections() -> str:
    """The source of ``largebatch/config/sections.py`` for the current schema."""
    names = [name for name, spec in SCHEMA.fields.items() if isinstance(spec, Section)]
    lines = [
        '"""The config\'s sections as frozen dataclasses. Generated from largebatch/config/schema.py by',
        f"``{REGENERATE}``: edit the schema, then regenerate (a test fails when they differ).",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "import dataclasses",
        "from collections.abc import Mapping",
        "from typing import Any, ClassVar",
        "",
        "from largebatch.config.frozen import ConfigSection, FrozenDict, field_meta, schema_section",
        "from largebatch.config.schema import Section",
        "",
        "__all__ = [" + ", ".join(json.dumps(class_name(n)) for n in ["", *names]) + "]",
    ]
    for name in names:
        lines += _class_source(name, SCHEMA.fields[name])  # type: ignore[arg-type]
    lines += _class_source("", SCHEMA)
    return "\n".join(lines) + "\n"


def write_sections() -> pathlib.Path:
    """Rewrite ``sections.py`` from the schema."""
    SECTIONS_FILE.write_text(render_sections())
    return SECTIONS_FILE


if __name__ == "__main__":
    print(f"wrote {write_sections()}")
