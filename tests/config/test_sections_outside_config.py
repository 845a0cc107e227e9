"""Outside ``largebatch/config/`` the config is read through its sections: a section or the
whole config goes back to a plain dict only where a file is written (``config.yaml``,
checkpoints, reports), and there through ``largebatch.config.redact``."""

from __future__ import annotations

import ast
import pathlib

import largebatch

PACKAGE = pathlib.Path(largebatch.__file__).parent
# The writers of files whose objects are not the config: a study's trial record and its report.
WRITERS = {("study/branch_report.py", "build")}


def to_dict_calls(path: pathlib.Path, root: pathlib.Path = PACKAGE) -> list[str]:
    """``file:line: call (in function)`` of each ``X.to_dict()`` outside the allowed writers."""
    tree = ast.parse(path.read_text())
    functions = {n: f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to_dict":
            where = (str(path.relative_to(root)), functions.get(node, ""))
            if where not in WRITERS:
                found.append(f"{where[0]}:{node.lineno}: {ast.unparse(node)} (in {where[1] or 'the module'})")
    return found


def test_no_section_becomes_a_dict_outside_config():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if PACKAGE / "config" not in path.parents for hit in to_dict_calls(path)]
    assert not found, "read the config's sections (cfg.optimizer.lr), or write it through largebatch.config.redact:\n" + "\n".join(found)


def test_the_scan_finds_a_to_dict_call(tmp_path):
    (tmp_path / "consumer.py").write_text("def build(cfg):\n    return cfg.checkpoint.to_dict()\n")
    assert to_dict_calls(tmp_path / "consumer.py", tmp_path) == ["consumer.py:2: cfg.checkpoint.to_dict() (in build)"]
