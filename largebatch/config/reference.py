"""The config key reference, from the schema: ``largebatch config keys`` prints it as
text, ``--markdown`` as the tables of ``docs/configs.md``, and ``--write PAGE`` puts those
tables into a page between its two marker lines, so the page cannot drift from the schema.
"""

from __future__ import annotations

import difflib
import pathlib

from largebatch.config.schema import REQUIRED, SCHEMA, Field, Section, describe_keys
from largebatch.errors import UserError

Row = tuple[str, str, str, str]  # (dotted key, kind, default, meaning), as describe_keys gives them

REGENERATE = "largebatch config keys --write docs/configs.md"
BEGIN_PREFIX = "<!-- generated from largebatch/config/schema.py"
BEGIN = f"{BEGIN_PREFIX} by `{REGENERATE}`; edit the schema, not these tables -->"
END = "<!-- end of the generated key reference -->"


def section_names(schema: Section = SCHEMA) -> list[str]:
    """The names of the schema's sections (``model``, ``optimizer``, ...), in schema order."""
    return [name for name, spec in schema.fields.items() if isinstance(spec, Section)]


def select(selector: str, schema: Section = SCHEMA) -> list[Row]:
    """The rows of one section or key (``optimizer``, ``optimizer.lr``, ``seed``), or every
    row for an empty selector.

    Raises:
        UserError: nothing is called ``selector``; lists the sections and the closest name.
    """
    rows = describe_keys(schema)
    selector = selector.rstrip(".")
    if not selector:
        return rows
    chosen = [row for row in rows if row[0] == selector or row[0].startswith(selector + ".")]
    if chosen:
        return chosen
    sections = section_names(schema)
    close = difflib.get_close_matches(selector, sections + [row[0] for row in rows], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UserError(f"no config section or key {selector!r}{hint} (sections: {', '.join(sections)}; or a key such as optimizer.lr)")


def render_text(rows: list[Row]) -> str:
    """One aligned line per key: key, kind, default, meaning."""
    width, kinds = max(len(row[0]) for row in rows), max(len(row[1]) for row in rows)
    return "".join(f"{key:<{width}}  {kind:<{kinds}}  {default:<14} {doc}".rstrip() + "\n" for key, kind, default, doc in rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _allowed(spec: Field) -> str:
    """The values a field accepts beyond its type: its choices, or its bounds."""
    if spec.choices:
        return ", ".join(f"`{choice}`" for choice in spec.choices)
    bounds = []
    if spec.low is not None:
        bounds.append(f"{'>' if spec.low_open else '>='} {spec.low:g}")
    if spec.high is not None:
        bounds.append(f"{'<' if spec.high_open else '<='} {spec.high:g}")
    return " and ".join(bounds)


def _tables(section: Section, prefix: str, out: list[str], *, subsections: bool = True) -> None:
    """The keys of one section as a table, then its subsections, each under a heading."""
    title = f"`{prefix.rstrip('.')}`" if prefix else "Top-level keys"
    out.append(f"### {title}\n")
    if section.doc:
        out.append(f"\n{title}: {section.doc}.\n")
    fields = [(name, spec) for name, spec in section.fields.items() if isinstance(spec, Field)]
    if fields:
        out.append("\n| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n")
    for name, spec in fields:
        kind = spec.kind.__name__ + (f"[{spec.items.__name__}]" if spec.items else "") + (" or None" if spec.nullable else "")
        default = "required" if spec.default is REQUIRED else f"`{_cell(repr(spec.default))}`"
        out.append(f"| `{prefix}{name}` | {kind} | {default} | {_cell(_allowed(spec))} | {_cell(spec.doc)} |\n")
    out.append("\n")
    for name, child in section.fields.items():
        if subsections and isinstance(child, Section):
            _tables(child, f"{prefix}{name}.", out)


def render_markdown(selector: str = "", schema: Section = SCHEMA) -> str:
    """The top-level keys, then one table per section, each under its own heading; with a
    selector, that section's table only (a key selects its section).

    Raises:
        UserError: as ``select``.
    """
    out: list[str] = []
    if not selector:
        _tables(schema, "", out)
    else:
        name = select(selector, schema)[0][0].split(".")[0]
        spec = schema.fields[name]
        if isinstance(spec, Section):
            _tables(spec, f"{name}.", out)
        else:
            _tables(schema, "", out, subsections=False)
    return "".join(out).rstrip("\n") + "\n"


def generated_block() -> str:
    """The page's generated part: the markers and the tables between them."""
    return f"{BEGIN}\n\n{render_markdown()}\n{END}"


def write_reference(page: str | pathlib.Path) -> None:
    """Replace the generated key reference in ``page`` with the schema's.

    Raises:
        UserError: the page is missing or lacks the marker lines.
    """
    path = pathlib.Path(page)
    if not path.is_file():
        raise UserError("no such page; give the markdown file that holds the key reference", path=str(path))
    text = path.read_text()
    start, end = text.find(BEGIN_PREFIX), text.find(END)
    if start < 0 or end < start:
        raise UserError(f"has no generated key reference; put the lines '{BEGIN_PREFIX} -->' and {END!r} where it goes", path=str(path))
    path.write_text(text[:start] + generated_block() + text[end + len(END) :])
