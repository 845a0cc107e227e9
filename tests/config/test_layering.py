"""``largebatch.config`` is the bottom layer: its modules import nothing of largebatch
but each other, ``errors`` and ``batching``; and no module of largebatch imports itself
back through others (every import statement, those inside functions too, read with
``ast``)."""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Sequence

import largebatch.config

CONFIG = pathlib.Path(largebatch.config.__file__).parent
PACKAGE = CONFIG.parent
ALLOWED = ("largebatch.config", "largebatch.errors", "largebatch.batching")


def imported_modules(path: pathlib.Path, package: Sequence[str] | None = None) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``, relative ones made absolute against
    ``package`` (default: the package ``path`` is in, or ``largebatch`` for a file outside
    it); for ``from package import name`` the module is ``package.name``."""
    inside = path.is_relative_to(PACKAGE.parent)
    package = list(package or (path.relative_to(PACKAGE.parent).parent.parts if inside else ["largebatch"]))
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
    assert [name for _, name in imported_modules(path, ["largebatch", "config"])] == [
        "largebatch.optim",
        "largebatch.engine",
        "largebatch.hooks.logger",
        "largebatch.config.schema",
        "largebatch.optim.param_groups.DEFAULT",
    ]


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports in ``graph`` (module -> the modules it imports), as the modules
    along it with the first repeated at the end; None when there is none."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        for imported in sorted(graph[module]):
            found = visit(imported, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    return next((circle for module in sorted(graph) if (circle := visit(module, []))), None)


def test_no_module_imports_itself_back_through_others():
    # Trials of a study once started through largebatch.cli: cli -> study.cli -> study.worker
    # -> study.runner -> cli. They start through largebatch.train_command now.
    paths = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}

    def owner(name: str) -> str | None:  # ``largebatch.study.runner.Base`` -> ``largebatch.study.runner``
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {
        module: {m for _, name in imported_modules(path) if (m := owner(name)) not in (None, module, "largebatch")}
        for module, path in paths.items()
    }
    assert {"largebatch.cli", "largebatch.study.runner", "largebatch.train_command"} <= graph.keys()
    assert "largebatch.train_command" in graph["largebatch.study.runner"]
    circle = import_circle(graph)
    assert circle is None, "an import circle: " + " -> ".join(circle)


def test_the_circle_check_finds_a_circle():
    assert import_circle({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == ["a", "b", "c", "a"]
    assert import_circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
