"""User-facing errors.

A ``UserError`` is a mistake the user can fix (a bad config key, a missing file, batch
arithmetic that does not divide). The command line prints it as one line starting with
``error:`` and exits with status 2; the traceback is shown only with ``--debug``.
``assert`` stays for internal invariants. ``whole_number`` is the one test of a number
read back from a file that every reader refusing with these errors shares.
"""

from __future__ import annotations

import math


class UserError(Exception):
    """A mistake in the user's input, reported as one ``error:`` line.

    Args:
        message: a sentence naming what is wrong, the value received and the fix.
        key: the dotted config key involved, if any (prefixed to the message).
        path: the file involved, if any (prefixed to the message).
    """

    def __init__(self, message: str, *, key: str | None = None, path: str | None = None) -> None:
        self.message = message
        self.key = key
        self.path = path
        super().__init__(self.render())

    def render(self) -> str:
        """The message with the key or file it concerns in front."""
        where = []
        if self.path:
            where.append(str(self.path))
        if self.key:
            where.append(self.key)
        prefix = ": ".join(where)
        return f"{prefix}: {self.message}" if prefix else self.message


class ConfigError(UserError):
    """A config file or override that does not validate."""


class DataError(UserError):
    """Input data that is missing, corrupt or inconsistent: names file, record and offset."""


def whole_number(value: object) -> int | None:
    """A value read back from JSON (a metrics line, a report, a checkpoint's entry) as a
    whole number: an int, or a finite float with no fraction (JSON writers give 5120.0);
    None for anything else, a bool included, so that every reader refuses the same values."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value)
