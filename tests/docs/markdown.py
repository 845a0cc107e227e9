"""Reading the documentation pages: fenced blocks, the commands in them, links, headings.

Which lines are commands (the convention docs/README.md states):

- in a block fenced as ```bash, ```sh or ```shell, every line is a command, except blank
  lines and lines that start with ``#``; a line ending in ``\\`` goes on in the next, and a
  `` # comment`` after a command is not part of it;
- in a block with no language (or ```console), the lines starting with ``$ `` are
  commands, and the lines after one, up to the next ``$ `` line, are its output;
- every other block (```text, ```python, ```yaml, ...) holds no command.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]
COMMAND_LANGUAGES = ("bash", "sh", "shell")
PROMPT_LANGUAGES = ("", "console")
# An unprompted line starting with one of these in an untagged block looks like a command.
COMMAND_WORDS = ("python ", "python3 ", "largebatch ", "torchrun ", "srun ", "sbatch ", "mpirun ", "bash ", ".venv/", "make ")


def pages() -> list[pathlib.Path]:
    """README.md, then every page of docs/ in name order."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def name(page: pathlib.Path) -> str:
    return str(page.relative_to(REPO))


@dataclasses.dataclass(frozen=True)
class Block:
    language: str
    line: int  # 1-based line of the opening fence
    lines: tuple[str, ...]  # the content, with the fence's indentation removed


@dataclasses.dataclass(frozen=True)
class Command:
    page: str
    line: int  # 1-based line where the command starts
    text: str  # continuation lines joined, the trailing comment dropped, spaces collapsed
    output: str | None  # for a ``$ `` command: the output the page shows under it
    prompted: bool

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a markdown text, indented ones (inside list items) included."""
    found, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```\s*([\w+-]*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        indent, language, start, body = len(fence.group(1)), fence.group(2).lower(), i + 1, []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i].lstrip())
            i += 1
        found.append(Block(language, start, tuple(body)))
        i += 1
    return found


def strip_comment(line: str) -> str:
    """``line`` without a trailing shell comment (a ``#`` after a space, outside quotes)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _normal(text: str) -> str:
    return " ".join(text.split())


def commands(page: pathlib.Path) -> list[Command]:
    """Every command on a page, in order."""
    found = []
    for block in blocks(page.read_text()):
        if block.language in COMMAND_LANGUAGES:
            pending, first = [], 0
            for offset, raw in enumerate(block.lines):
                stripped = raw.strip()
                if not pending and (not stripped or stripped.startswith("#")):
                    continue
                if not pending:
                    first = block.line + 1 + offset
                line = strip_comment(raw) if not raw.rstrip().endswith("\\") else raw.rstrip()
                if line.endswith("\\"):
                    pending.append(line[:-1])
                    continue
                pending.append(line)
                found.append(Command(name(page), first, _normal(" ".join(pending)), None, False))
                pending = []
        elif block.language in PROMPT_LANGUAGES:
            current: list = []
            for offset, raw in enumerate(block.lines):
                if raw.startswith("$ "):
                    current.append([block.line + 1 + offset, raw[2:], []])
                elif current:
                    current[-1][2].append(raw.rstrip())
            for line, text, output in current:
                found.append(Command(name(page), line, _normal(strip_comment(text)), "\n".join(output).strip("\n"), True))
    return found


def stray_commands(page: pathlib.Path) -> list[str]:
    """``page:line: text`` of each line that looks like a command in an untagged block
    without ``$ `` prompts: it would escape the convention (tag the block bash, or text)."""
    stray = []
    for block in blocks(page.read_text()):
        if block.language not in PROMPT_LANGUAGES or any(line.startswith("$ ") for line in block.lines):
            continue
        for offset, line in enumerate(block.lines):
            if line.startswith(COMMAND_WORDS):
                stray.append(f"{name(page)}:{block.line + 1 + offset}: {line.strip()}")
    return stray


def anchors(text: str) -> set[str]:
    """The anchors GitHub makes for a page's headings (lowercase, punctuation dropped,
    spaces as hyphens, ``-1``, ``-2`` for repeats); headings inside fenced blocks excluded."""
    slugs, counts, inside = set(), {}, False
    for line in text.split("\n"):
        if re.match(r"^\s*```", line):
            inside = not inside
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if inside or not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        repeat = counts.get(slug, 0)
        counts[slug] = repeat + 1
        slugs.add(slug if repeat == 0 else f"{slug}-{repeat}")
    return slugs


def links(page: pathlib.Path) -> list[tuple[int, str]]:
    """``(line, target)`` of every markdown link and image outside fenced blocks and code spans."""
    found, inside = [], False
    for number, line in enumerate(page.read_text().split("\n"), 1):
        if re.match(r"^\s*```", line):
            inside = not inside
            continue
        if inside:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        found.extend((number, match.group(1)) for match in re.finditer(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line))
    return found
