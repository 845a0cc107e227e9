"""``largebatch.config`` is the bottom layer: its modules import nothing of largebatch
but each other, ``errors`` and ``batching`` (every import statement, those inside
functions too, read with ``ast``)."""

from __future__ import annotations

import ast
import pathlib

import largebatch.config

CONFIG = pathlib.Path(largebatch.config.__file__).parent
ALLOWED = ("largebatch.config", "largebatch.errors", "largebatch.batching")


def imported_modules(path: pathlib.Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``, relative ones made absolute; for
    ``from package import name`` the module is ``package.name``."""
    package = ["largebatch", "config"]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (
                ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else [])) if node.level else node.module
            )
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def test_config_imports_nothing_above_it():
    modules = sorted(CONFIG.rglob("*.py"))
    assert CONFIG / "schema.py" in modules and CONFIG / "resolve.py" in modules
    wrong = [
        f"{path.relative_to(CONFIG.parent.parent)}:{line} imports {name}"
        for path in modules
        for line, name in imported_modules(path)
        if name.split(".")[0] == "largebatch" and not any(name == a or name.startswith(f"{a}.") for a in ALLOWED)
    ]
    assert not wrong, "largebatch/config/ must not depend on the layers above it:\n" + "\n".join(wrong)


def test_the_check_sees_every_kind_of_import(tmp_path):
    path = tmp_path / "module.py"
    path.write_text(
        "import largebatch.optim\nfrom largebatch import engine\nfrom ..hooks import logger\nfrom . import schema\n"
        "def f():\n    from largebatch.optim.param_groups import DEFAULT\n"
    )
    assert [name for _, name in imported_modules(path)] == [
        "largebatch.optim",
        "largebatch.engine",
        "largebatch.hooks.logger",
        "largebatch.config.schema",
        "largebatch.optim.param_groups.DEFAULT",
    ]
