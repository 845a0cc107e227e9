"""The layers of docs/architecture.md hold: every import of a largebatch module by another
(every import statement, those inside functions too, read with ``ast``; and the
``'largebatch.x:Name'`` strings that name a class to load) goes where the layer table
allows; the table here is the one in docs/architecture.md; and no module imports itself
back through others."""

from __future__ import annotations

import ast
import pathlib
import re
from collections.abc import Iterator, Sequence

import largebatch

PACKAGE = pathlib.Path(largebatch.__file__).parent
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"

# The layer table of docs/architecture.md, top to bottom: a layer's modules (paths in
# largebatch/: ``study/`` is the package and everything in it, ``config/__init__.py`` the
# package's own module only, whose submodules are another layer's) and what they may import:
# layers by name, or modules of another layer by path. Every path names modules that exist,
# and every module of largebatch is in a layer.
LAYERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "commands": (
        ("__main__.py", "cli.py"),
        ("commands", "studies", "importers", "shards", "recording", "launch", "resolve", "engine", "components", "runtime", "base"),
    ),
    "studies": (("study/",), ("studies", "launch", "resolve", "engine", "components", "runtime", "base")),
    "importers": (("importers/",), ("importers", "resolve", "base")),
    "shards": (("shards/",), ("shards", "data/", "runtime", "base")),
    "recording": (("record_signatures.py",), ("components", "base")),
    "launch": (
        ("start.py", "launch.py", "train_command.py", "export.py", "footprint.py"),
        ("launch", "resolve", "engine", "components", "runtime", "base"),
    ),
    "resolve": (("config/__init__.py",), ("components", "base")),
    "engine": (("engine/", "hooks/"), ("engine", "components", "runtime", "base")),
    "components": (("tasks/", "models.py", "optim/", "data/"), ("components", "runtime", "base")),
    "runtime": (
        (
            "backends/",
            "dist.py",
            "dtensors.py",
            "checkpoint.py",
            "checkpoint_writer.py",
            "rundir.py",
            "safe_load.py",
            "preemption.py",
            "randomness.py",
            "flops.py",
            "run_curves.py",
            "batch_curves.py",
            "host_copy.py",
        ),
        ("runtime", "base"),
    ),
    "base": (("__init__.py", "config/", "signatures.py", "vit.py", "batching.py", "batch_schedule.py", "errors.py"), ("base",)),
}

REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")  # 'package.module:Name', a class loaded by name


def imported_modules(
    path: pathlib.Path, package: Sequence[str] | None = None, root: pathlib.Path = PACKAGE, *, type_checking: bool = True
) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``, relative ones made absolute against
    ``package`` (default: the package ``path`` is in under ``root``'s parent, or ``root``'s
    name for a file outside it); for ``from package import name`` the module is
    ``package.name``. A string ``'package.module:Name'`` (a class to load, as the config's
    ``'largebatch.hooks.lr:LearningRateHook'``) counts as an import of ``package.module.Name``.
    With ``type_checking=False``, imports under ``if TYPE_CHECKING:`` (for annotations only,
    never run) are left out."""
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = set()
    if not type_checking:
        for node in ast.walk(tree):
            test = node.test if isinstance(node, ast.If) else None
            if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
            ):
                typing_only |= {id(inner) for child in node.body for inner in ast.walk(child)}
    inside = path.is_relative_to(root.parent)
    package = list(package or (path.relative_to(root.parent).parent.parts if inside else [root.name]))
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (
                ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else [])) if node.level else node.module
            )
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and REFERENCE.match(node.value):
            found.append((node.lineno, node.value.replace(":", ".")))
    return found


def module_name(path: pathlib.Path, root: pathlib.Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Every module of the package at ``root``, by name."""
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def owner(name: str, modules: dict[str, pathlib.Path]) -> str | None:
    """The module ``name`` is in (``largebatch.study.runner.Base`` -> ``largebatch.study.runner``);
    None when it names none of ``modules``."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def layer_of(module: str, layers: dict[str, tuple[tuple[str, ...], tuple[str, ...]]], top: str) -> str | None:
    """The layer whose paths hold ``module`` (a file's path before its package's); None when none does."""
    best: tuple[int, str] | None = None
    for name, (paths, _) in layers.items():
        for path in paths:
            stem = path.removesuffix("/").removesuffix(".py").removesuffix("__init__").removesuffix("/")
            target = ".".join([top, *filter(None, stem.split("/"))])
            if module == target or (path.endswith("/") and module.startswith(target + ".")):
                rank = (2 if not path.endswith("/") else 1) * 1000 + len(target)  # a file, then the longest package
                if best is None or rank > best[0]:
                    best = (rank, name)
    return best[1] if best else None


def allowed(importer: str, imported: str, layers: dict[str, tuple[tuple[str, ...], tuple[str, ...]]], top: str) -> bool:
    """Whether module ``importer`` may import module ``imported`` by ``layers``."""
    mine, theirs = layer_of(importer, layers, top), layer_of(imported, layers, top)
    assert mine is not None and theirs is not None, (importer, imported)
    may = layers[mine][1]
    return theirs in may or any(layer_of(imported, {"path": ((path,), ())}, top) for path in may if path not in layers)


def wrong_edges(root: pathlib.Path, layers: dict[str, tuple[tuple[str, ...], tuple[str, ...]]]) -> list[str]:
    """``file:line: module imports module (layer -> layer)`` for each import ``layers`` does
    not allow in the package at ``root``, and ``module: in no layer`` for each module the
    table leaves out."""
    modules, top = modules_of(root), root.name
    homeless = [f"{module}: in no layer of the table" for module in modules if layer_of(module, layers, top) is None]
    if homeless:
        return homeless
    found = []
    for module, path in modules.items():
        for line, name in imported_modules(path, root=root):
            imported = owner(name, modules) if name.split(".")[0] == top else None
            if imported is not None and imported != module and not allowed(module, imported, layers, top):
                found.append(
                    f"{path.relative_to(root.parent)}:{line}: {module} imports {imported} "
                    f"({layer_of(module, layers, top)} -> {layer_of(imported, layers, top)})"
                )
    return found


def test_every_import_goes_where_the_layer_table_allows():
    wrong = wrong_edges(PACKAGE, LAYERS)
    assert not wrong, "imports against the layers of docs/architecture.md:\n" + "\n".join(wrong)


def documented_layers(text: str) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """The rows of the layer table (``| layer | modules | may import |``) in ``text``."""
    rows = iter(text.splitlines())
    for line in rows:
        if re.match(r"\|\s*layer\s*\|\s*modules\s*\|\s*may import\s*\|", line):
            break
    next(rows, None)  # the |---| line
    table = {}
    for line in rows:
        if not line.startswith("|"):
            break
        name, paths, may = (cell.strip() for cell in line.strip().strip("|").split("|"))
        table[name] = (tuple(re.findall(r"`([^`]+)`", paths)), tuple(re.findall(r"`([^`]+)`|(\w+)", may)))
    return {name: (paths, tuple(a or b for a, b in may)) for name, (paths, may) in table.items()}


def test_the_table_is_the_one_in_docs_architecture():
    assert documented_layers(ARCHITECTURE.read_text()) == LAYERS, "docs/architecture.md's layer table and LAYERS differ"


def test_every_path_of_the_table_names_modules():
    named = {path for paths, _ in LAYERS.values() for path in paths}
    missing = {p for p in named if not (PACKAGE / p).exists()}
    assert not missing, missing


def write_tree(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


SYNTHETIC = {
    "top": (("cli.py",), ("top", "middle", "bottom")),
    "middle": (("engine/", "config/__init__.py"), ("middle", "bottom", "tools/reader.py")),
    "bottom": (("config/", "errors.py"), ("bottom",)),
    "tools": (("tools/", "later/"), ("bottom",)),
}


def test_the_check_finds_each_edge_against_the_table(tmp_path):
    root = write_tree(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "cli.py": "import pkg.engine.loop\nfrom pkg import tools\n",
            "engine/__init__.py": "",
            "engine/loop.py": "from ..config import schema\nfrom pkg.tools.reader import read\nfrom pkg.tools import writer\n",
            "config/__init__.py": "def resolve():\n    from pkg.engine import loop\n",
            "config/schema.py": "from . import types\nfrom pkg.errors import Error\nHOOK = 'pkg.engine.loop:Hook'\n",
            "config/types.py": "def f():\n    from pkg.config import resolve\n",
            "errors.py": "",
            "tools/__init__.py": "",
            "tools/reader.py": "",
            "tools/writer.py": "from pkg.engine import loop\n",
        },
    )
    layers = {**SYNTHETIC, "bottom": (("__init__.py", *SYNTHETIC["bottom"][0]), ("bottom",))}
    assert wrong_edges(root, layers) == [
        "pkg/cli.py:2: pkg.cli imports pkg.tools (top -> tools)",
        "pkg/config/schema.py:3: pkg.config.schema imports pkg.engine.loop (bottom -> middle)",  # a class named by a string
        "pkg/config/types.py:2: pkg.config.types imports pkg.config (bottom -> middle)",  # inside a function
        "pkg/engine/loop.py:3: pkg.engine.loop imports pkg.tools.writer (middle -> tools)",  # one module of a layer, not another
        "pkg/tools/writer.py:1: pkg.tools.writer imports pkg.engine.loop (tools -> middle)",
    ]
    assert wrong_edges(root, SYNTHETIC) == ["pkg: in no layer of the table"]


def test_the_check_sees_every_kind_of_import(tmp_path):
    path = tmp_path / "module.py"
    path.write_text(
        "import largebatch.optim\nfrom largebatch import engine\nfrom ..hooks import logger\nfrom . import schema\n"
        "def f():\n    from largebatch.optim.param_groups import DEFAULT\n"
        "CHECK = 'largebatch.models:check_model_config'\nTEXT = 'not: a reference'\n"
    )
    assert [name for _, name in imported_modules(path, ["largebatch", "config"])] == [
        "largebatch.optim",
        "largebatch.engine",
        "largebatch.hooks.logger",
        "largebatch.config.schema",
        "largebatch.optim.param_groups.DEFAULT",
        "largebatch.models.check_model_config",
    ]


def test_the_table_reads_from_markdown():
    text = (
        "intro\n\n| layer | modules | may import |\n|---|---|---|\n"
        "| top | `cli.py` `study/` | top, `config/__init__.py`, bottom |\n| bottom | `config/` | bottom |\n\nafter\n"
    )
    assert documented_layers(text) == {
        "top": (("cli.py", "study/"), ("top", "config/__init__.py", "bottom")),
        "bottom": (("config/",), ("bottom",)),
    }


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


def import_graph(root: pathlib.Path = PACKAGE) -> Iterator[tuple[str, set[str]]]:
    modules = modules_of(root)
    for module, path in modules.items():
        imports = imported_modules(path, root=root, type_checking=False)  # a circle is one that runs
        yield module, {m for _, name in imports if (m := owner(name, modules)) not in (None, module, root.name)}


def test_no_module_imports_itself_back_through_others():
    # Trials of a study once started through largebatch.cli: cli -> study.cli -> study.worker
    # -> study.runner -> cli. They start through largebatch.train_command now.
    graph = dict(import_graph())
    assert {"largebatch.cli", "largebatch.study.runner", "largebatch.train_command"} <= graph.keys()
    assert "largebatch.train_command" in graph["largebatch.study.runner"]
    circle = import_circle(graph)
    assert circle is None, "an import circle: " + " -> ".join(circle)


def test_the_circle_check_finds_a_circle():
    assert import_circle({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == ["a", "b", "c", "a"]
    assert import_circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_an_import_for_annotations_only_makes_no_circle_but_counts_against_the_layers(tmp_path):
    root = write_tree(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "a.py": "from pkg import b\n",
            "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n",
            "c.py": "import typing\nif typing.TYPE_CHECKING:\n    import pkg.a\nelse:\n    import pkg.b\n",
        },
    )
    assert import_circle(dict(import_graph(root))) is None
    assert import_circle({**dict(import_graph(root)), "pkg.b": {"pkg.a"}}) == ["pkg.a", "pkg.b", "pkg.a"]
    assert [m for _, m in imported_modules(root / "b.py", root=root)] == ["typing.TYPE_CHECKING", "pkg.a"]
    assert [m for _, m in imported_modules(root / "c.py", root=root, type_checking=False)] == ["typing", "pkg.b"]
