"""The imported config as it is built: every value with where it came from.

Each value the import writes is one of three kinds, and the written file's header lists
all three: **mapped** (from a Colossal-AI setting, with its file and line), **filled in**
(not in the source but needed, with why), and the Colossal-AI settings left **unmapped**
(with why).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from largebatch.importers.colossalai.script import Argument, Found, Unknown

_ABSENT = object()


@dataclasses.dataclass(frozen=True)
class Entry:
    """One line of the header: a largebatch key (or a Colossal-AI setting) and its story."""

    name: str
    value: Any
    why: str


@dataclasses.dataclass
class Builder:
    """A largebatch config being written, with the story of each value.

    Attributes:
        config: the config so far, nested dicts keyed as in the schema.
        mapped: largebatch key, value, the Colossal-AI setting it comes from.
        filled: largebatch key, value, why it is not from the source.
        unmapped: the Colossal-AI setting as written, its value's text, why it has no key here.
        used: the config's names the mapping has read (the rest are listed as unmapped).
    """

    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    mapped: list[Entry] = dataclasses.field(default_factory=list)
    filled: list[Entry] = dataclasses.field(default_factory=list)
    unmapped: list[Entry] = dataclasses.field(default_factory=list)
    used: set[str] = dataclasses.field(default_factory=set)

    def set(self, key: str, value: Any, origin: str) -> None:
        """Map ``value`` to the dotted ``key``; a later value for a key replaces the earlier."""
        self._put(key, value)
        self.mapped = [entry for entry in self.mapped if entry.name != key] + [Entry(key, value, origin)]
        self.filled = [entry for entry in self.filled if entry.name != key]

    def fill(self, key: str, value: Any, why: str) -> None:
        """Write ``value`` for ``key``, not found in the source, unless something set it."""
        if self.has(key):
            return
        self._put(key, value)
        self.filled.append(Entry(key, value, why))

    def take(self, key: str, argument: Argument | None, origin: str, convert: Callable[[Any], Any] = lambda v: v) -> bool:
        """Map a train-script argument to ``key`` when its value is known (True), list it
        as known only at run time when not, and do nothing when it is absent."""
        if isinstance(argument, Found):
            self.set(key, convert(argument.value), origin + (f"; {argument.origin}" if argument.origin else ""))
            return True
        if isinstance(argument, Unknown):
            self.skip(origin, "", f"known only when the script runs; give it with --set {key}=VALUE")
        return False

    def skip(self, setting: str, value: Any, why: str) -> None:
        """List a Colossal-AI setting that has no key here."""
        self.unmapped.append(Entry(setting, value, why))

    def has(self, key: str) -> bool:
        return self.get(key, _ABSENT) is not _ABSENT

    def get(self, key: str, default: Any = None) -> Any:
        node: Any = self.config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def _put(self, key: str, value: Any) -> None:
        *sections, last = key.split(".")
        node = self.config
        for part in sections:
            node = node.setdefault(part, {})
        node[last] = value
