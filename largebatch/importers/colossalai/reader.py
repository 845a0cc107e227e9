"""Read a Colossal-AI legacy config file without Colossal-AI.

Colossal-AI's legacy ``colossalai.launch(config=...)`` runs the config file as a module
and keeps every module-level name that does not start with ``__`` and is not a module or
a class, upper-case constants (``BATCH_SIZE``) and lower-case settings (``fp16``,
``gradient_accumulation``) alike; its train scripts then read ``gpc.config.BATCH_SIZE``.
Here the file runs the same way, with the ``colossalai`` package stood in for while it
runs: ``colossalai.amp.AMP_TYPE`` is an enum with Colossal-AI's members (``APEX``,
``TORCH``, ``NAIVE``), and every other name under ``colossalai`` is a ``StandIn`` that
records how it was reached and called (``colossalai.zero.shard_utils.TensorShardStrategy()``)
and runs nothing. The stand-ins are installed only while the file runs; a ``colossalai``
imported before is put back afterwards.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import enum
import importlib.abc
import importlib.machinery
import importlib.util
import pathlib
import runpy
import sys
import types
from collections.abc import Iterator
from typing import Any

from largebatch.config.loader import assignment_lines, colossalai_import_lines
from largebatch.errors import ConfigError

PACKAGE = "colossalai"


class AmpType(enum.Enum):
    """``colossalai.amp.AMP_TYPE``: the mixed-precision modes of ``fp16=dict(mode=...)``."""

    APEX = "apex"
    TORCH = "torch"
    NAIVE = "naive"

    def __repr__(self) -> str:
        return f"AMP_TYPE.{self.name}"


class StandIn:
    """A name under ``colossalai`` (or a call of one), kept as the text that reached it."""

    def __init__(self, text: str) -> None:
        self._text = text

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return resolve(f"{self._text}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> StandIn:
        arguments = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
        return StandIn(f"{self._text}({', '.join(arguments)})")

    def __repr__(self) -> str:
        return self._text


def resolve(dotted: str) -> Any:
    """What a dotted name under ``colossalai`` stands for while a config is read."""
    return AmpType if dotted.rsplit(".", 1)[-1] == "AMP_TYPE" else StandIn(dotted)


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return resolve(f"{self.__name__}.{name}")


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers every import of ``colossalai`` and its submodules with a stand-in module."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != PACKAGE and not fullname.startswith(PACKAGE + "."):
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StandInModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing runs: the module's names are stand-ins."""


def _ours(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


@contextlib.contextmanager
def colossalai_stood_in() -> Iterator[None]:
    """``import colossalai...`` gives stand-ins inside this block, and nothing after it."""
    saved = {name: module for name, module in sys.modules.items() if _ours(name)}
    for name in saved:
        del sys.modules[name]
    finder = _StandInFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [name for name in sys.modules if _ours(name)]:
            del sys.modules[name]
        sys.modules.update(saved)


@dataclasses.dataclass(frozen=True)
class ColossalConfig:
    """A Colossal-AI config as its legacy launcher sees it.

    Attributes:
        path: the file.
        values: every name the launcher keeps (``gpc.config``), in file order; AMP modes
            are ``AmpType`` members, other Colossal-AI objects ``StandIn``s.
        lines: the line of each name's last top-level assignment.
        colossalai_imports: the lines that import ``colossalai``.
    """

    path: pathlib.Path
    values: dict[str, Any]
    lines: dict[str, int]
    colossalai_imports: tuple[int, ...]

    def where(self, name: str) -> str:
        """``name`` with the file and line it is set at, e.g. ``BATCH_SIZE (config.py:4)``."""
        line = self.lines.get(name.split(".")[0])
        return f"{name} ({self.path.name}:{line})" if line else name

    def stated(self, name: str) -> str:
        """``name``, its value and where it is set, e.g. ``BATCH_SIZE 256 (config.py:4)``."""
        line = self.lines.get(name)
        return f"{name} {self.values[name]!r}" + (f" ({self.path.name}:{line})" if line else "")


def parse_python(path: pathlib.Path, what: str) -> ast.Module:
    """``path`` parsed, or a ``ConfigError`` naming the file and the line."""
    if not path.is_file():
        raise ConfigError(f"{what} does not exist; check the path", path=str(path))
    if path.suffix != ".py":
        raise ConfigError(f"{what} must be a Python file (.py)", path=str(path))
    try:
        return ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as exc:
        raise ConfigError(f"{what} is not valid Python: {exc.msg} at line {exc.lineno}", path=str(path)) from exc


def _imported_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def read_colossalai_config(path: str | pathlib.Path) -> ColossalConfig:
    """Run a Colossal-AI config file with ``colossalai`` stood in, and keep what its
    legacy launcher keeps.

    Raises:
        ConfigError: the file is missing, not Python, or raises while it runs (an import
            of a package that is not installed included).
    """
    path = pathlib.Path(path)
    tree = parse_python(path, "the Colossal-AI config")
    try:
        with colossalai_stood_in():
            namespace = runpy.run_path(str(path), run_name="colossalai_config")
    except ImportError as exc:
        raise ConfigError(
            f"the config imports {exc.name or exc}, which is not installed here (only colossalai is stood in for); "
            "remove that import or install the package",
            path=str(path),
        ) from exc
    except Exception as exc:  # the file is the user's: say what it raised, and where
        raise ConfigError(f"the config raised {type(exc).__name__}: {exc}", path=str(path)) from exc
    imported = _imported_names(tree)
    values = {
        name: value
        for name, value in namespace.items()
        if not name.startswith("__")
        and name not in imported
        and not isinstance(value, types.ModuleType | type)
        and not isinstance(value, types.FunctionType)
    }
    return ColossalConfig(path, values, assignment_lines(tree), colossalai_import_lines(tree))
