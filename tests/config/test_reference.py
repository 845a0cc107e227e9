"""The key reference: ``largebatch config keys`` and docs/configs.md come from the schema."""

from __future__ import annotations

import pytest

from largebatch import cli
from largebatch.config import reference
from largebatch.config.schema import SCHEMA, Field, Section
from largebatch.errors import UserError
from tests.conftest import REPO

PAGE = REPO / "docs/configs.md"


def keys(*argv: str, capsys) -> tuple[int, str, str]:
    status = cli.main(["config", "keys", *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def walk(section: Section, prefix: str = ""):
    for name, spec in section.fields.items():
        yield f"{prefix}{name}", spec
        if isinstance(spec, Section):
            yield from walk(spec, f"{prefix}{name}.")


def test_docs_configs_page_matches_the_schema():
    text = PAGE.read_text()
    start, end = text.find(reference.BEGIN_PREFIX), text.find(reference.END)
    assert 0 <= start < end, f"docs/configs.md lost its generated key reference; run `{reference.REGENERATE}`"
    assert text[start : end + len(reference.END)] == reference.generated_block(), (
        f"docs/configs.md's key reference differs from largebatch/config/schema.py; regenerate it with `{reference.REGENERATE}`"
    )


def test_write_replaces_only_the_generated_part(tmp_path):
    page = tmp_path / "configs.md"
    page.write_text(f"# Configs\n\nbefore\n\n{reference.BEGIN_PREFIX} old -->\n| stale |\n{reference.END}\n\nafter\n")
    reference.write_reference(page)
    text = page.read_text()
    assert text.startswith("# Configs\n\nbefore\n\n") and text.endswith("\n\nafter\n") and "| stale |" not in text
    assert reference.generated_block() in text
    once = text
    reference.write_reference(page)
    assert page.read_text() == once


def test_write_needs_the_markers(tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text("# no reference here\n")
    status, _, err = keys("--write", str(page), capsys=capsys)
    assert status == 2 and err.count("\n") == 1 and str(page) in err and reference.END in err
    with pytest.raises(UserError, match="no such page"):
        reference.write_reference(tmp_path / "missing.md")


def test_markdown_has_every_key_with_its_default_and_bounds():
    text = reference.render_markdown()
    for key, spec in walk(SCHEMA):
        if isinstance(spec, Section):
            assert f"### `{key}`" in text, key
            continue
        row = next((line for line in text.splitlines() if line.startswith(f"| `{key}` |")), None)
        assert row is not None, key
        if spec.low is not None:
            assert f"{spec.low:g}" in row.split(" | ")[3], key
    assert "| `optimizer.lr` | float | required | > 0 |" in text
    assert "| `mixup.prob` | float | `1.0` | >= 0 and <= 1 |" in text
    assert "| `data.root` | str or None | `None` |" in text


def test_a_section_a_key_or_everything(capsys):
    status, out, _ = keys("optimizer", capsys=capsys)
    lines = out.splitlines()
    assert status == 0 and lines[0].split()[:2] == ["optimizer", "section"]
    assert all(line.startswith("optimizer") for line in lines) and any(
        line.split()[:3] == ["optimizer.lr", "float", "required"] for line in lines
    )
    _, out, _ = keys("optimizer.lr", capsys=capsys)
    assert out.split()[:3] == ["optimizer.lr", "float", "required"] and len(out.splitlines()) == 1
    _, out, _ = keys("seed", capsys=capsys)
    assert out.split()[:3] == ["seed", "int", "0"]
    _, everything, _ = keys(capsys=capsys)
    assert len(everything.splitlines()) == len(list(walk(SCHEMA)))
    _, markdown, _ = keys("optimizer", "--markdown", capsys=capsys)
    assert markdown.startswith("### `optimizer`\n") and "### `data`" not in markdown
    _, markdown, _ = keys("seed", "--markdown", capsys=capsys)
    assert markdown.startswith("### Top-level keys\n") and "### `" not in markdown


@pytest.mark.parametrize(
    ("selector", "hint"), [("optimzer", "did you mean 'optimizer'?"), ("optimizer.lrr", "did you mean 'optimizer.lr'?"), ("zzz", "")]
)
def test_an_unknown_section_is_one_error_line_listing_the_sections(selector, hint, capsys):
    status, out, err = keys(selector, capsys=capsys)
    assert status == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: ")
    assert repr(selector) in err and hint in err
    sections = [name for name, spec in SCHEMA.fields.items() if isinstance(spec, Section)]
    assert f"sections: {', '.join(sections)}" in err


def test_field_kinds_render_as_the_schema_says():
    spec = Field(list, [], "x", items=float, nullable=True)
    section = Section({"values": spec, "inner": Section({"n": Field(int, 1, "n", low=0, low_open=True)}, "inner things")})
    text = reference.render_markdown(schema=section)
    assert "| `values` | list[float] or None | `[]` |  | x |" in text
    assert "### `inner`\n\n`inner`: inner things.\n" in text and "| `inner.n` | int | `1` | > 0 | n |" in text
