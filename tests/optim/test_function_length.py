"""Every function in largebatch/optim stays short enough to read whole."""

from __future__ import annotations

import ast
import pathlib

import largebatch.optim

LIMIT = 60  # lines from ``def`` to the last line of the body, docstring included


def test_no_function_in_optim_is_longer_than_the_limit():
    folder = pathlib.Path(largebatch.optim.__file__).parent
    files = sorted(folder.glob("*.py"))
    assert len(files) >= 5  # the package was found
    long = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LIMIT:
                    long.append(f"{path.name}:{node.lineno} {node.name} has {lines} lines")
    assert not long, f"split these functions (at most {LIMIT} lines each): " + "; ".join(long)
