"""Tell a Colossal-AI config given where a largebatch config is expected.

A largebatch config reads only lower-case names; upper-case ones are the file's own
constants. Given to ``train.py --config`` as it is, a Colossal-AI config would fail on
``from colossalai.amp import AMP_TYPE`` (Colossal-AI is not installed), and without that
import its ``BATCH_SIZE`` and ``NUM_EPOCHS`` would be ignored while ``fp16`` and
``gradient_accumulation`` are rejected one at a time. So a file that imports
``colossalai``, or that sets Colossal-AI's keys together with its constants (or a
constant of its vocabulary the file never reads, standing for a key the config lacks),
gets one error naming the file and the command that converts it. A largebatch config
with its own upper-case constants (``GLOBAL = 32 * 1024``) is unaffected: constants it
reads, or whose key it sets, are not a sign.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Any

from largebatch.config.colossal.reader import assignment_lines, colossalai_import_lines
from largebatch.config.colossal.vocabulary import COLOSSALAI_KEYS, CONSTANT_KEYS
from largebatch.errors import ConfigError


def import_command(path: pathlib.Path) -> str:
    """The command that writes a largebatch config from the Colossal-AI config ``path``."""
    return f"largebatch config import colossalai {path} --out {path.with_name(path.stem + '-largebatch.py')}"


def refuse_colossalai_imports(path: pathlib.Path, tree: ast.Module) -> None:
    """Before a config file runs: one error if it imports ``colossalai``.

    Raises:
        ConfigError: naming the file, the line and the import command.
    """
    lines = colossalai_import_lines(tree)
    if lines:
        raise ConfigError(
            f"a Colossal-AI config (it imports colossalai at line {lines[0]}), which is not a largebatch config; write one "
            f"from it with `{import_command(path)}` (add --train-script for the optimizer, schedule and model set there)",
            path=str(path),
        )


def _sets(config: dict[str, Any], dotted: str) -> bool:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def refuse_colossalai_shape(path: pathlib.Path, config: dict[str, Any]) -> None:
    """After a Python config file has loaded (with its bases and overrides into
    ``config``): one error if it is shaped like a Colossal-AI config.

    Raises:
        ConfigError: naming the file, the Colossal-AI keys, the ignored upper-case
            names, and the fix.
    """
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return
    assigned = assignment_lines(tree)
    read = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    keys = [key for key in COLOSSALAI_KEYS if key in assigned]
    ignored = [name for name in assigned if name in CONSTANT_KEYS and name not in read]
    missing = [name for name in ignored if not _sets(config, CONSTANT_KEYS[name])]
    if len(keys) >= 2 or (keys and ignored):
        constants = (
            f" and {', '.join(ignored)}, upper-case names a largebatch config does not read (they are the file's own constants)"
            if ignored
            else ""
        )
        raise ConfigError(
            f"looks like a Colossal-AI config: it sets {', '.join(keys)} (Colossal-AI's keys){constants}; write a largebatch "
            f"config from it with `{import_command(path)}`",
            path=str(path),
        )
    if missing:
        stands = ", ".join(f"{name} -> {CONSTANT_KEYS[name]}" for name in missing)
        raise ConfigError(
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} upper-case, so the config does not read "
            f"{'it' if len(missing) == 1 else 'them'} (upper-case names are the file's own constants), and "
            f"{'its key is' if len(missing) == 1 else 'their keys are'} not set ({stands}); set the lower-case key, or, for "
            f"a Colossal-AI config, run `{import_command(path)}`",
            path=str(path),
        )
