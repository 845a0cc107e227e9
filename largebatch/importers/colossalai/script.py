"""Read a Colossal-AI train script statically: the calls it makes and the values they get.

Colossal-AI's legacy ViT examples set much of a run in the train script, not the config:
``colossalai.nn.Lamb(model.parameters(), lr=1.8e-2, weight_decay=0.1)``,
``LinearWarmupLR(optimizer, warmup_steps=1, total_steps=gpc.config.NUM_EPOCHS)`` stepped
by ``hooks.LRSchedulerHook(lr_scheduler, by_epoch=True)``, ``vit_base_patch16_224(drop_rate=0.1)``,
``MixupLoss``, ``CrossEntropyLoss(label_smoothing=0.1)``. The script is parsed, never run:
each call's arguments are evaluated where they are literals, arithmetic on literals,
names assigned such values, or ``gpc.config.NAME`` (looked up in the config read with
``largebatch.importers.colossalai.reader``); anything else (``args.lr``,
``os.environ['DATA']``) stays ``Unknown`` with its source text.
"""

from __future__ import annotations

import ast
import dataclasses
import operator
import pathlib
from collections.abc import Callable
from typing import Any

from largebatch.importers.colossalai.reader import ColossalConfig, parse_python

_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
}


@dataclasses.dataclass(frozen=True)
class Found:
    """A value the script gives, with where it comes from beyond the call's own text
    (``LEARNING_RATE (config.py:4)`` for ``gpc.config.LEARNING_RATE``; empty for a literal)."""

    value: Any
    origin: str = ""


@dataclasses.dataclass(frozen=True)
class Unknown:
    """A value only known when the script runs (``args.lr``), as its source text."""

    text: str


Argument = Found | Unknown


@dataclasses.dataclass(frozen=True)
class Call:
    """One call in the script.

    Attributes:
        name: the callee's last name (``Lamb`` for ``colossalai.nn.Lamb``).
        text: the callee as written (``colossalai.nn.Lamb``).
        module: the module the callee's first name was imported from, if it was.
        line: its line.
        args: positional arguments.
        kwargs: keyword arguments, a ``**name`` of a dict assigned in the script expanded.
        sources: each argument's source text (positional ones as ``0``, ``1``, ...).
        assigned_to: the name the call's result is assigned to, if one.
        loop_depth: how many ``for``/``while`` loops hold the call.
    """

    name: str
    text: str
    module: str | None
    line: int
    args: tuple[Argument, ...]
    kwargs: dict[str, Argument]
    sources: dict[str, str]
    assigned_to: str | None
    loop_depth: int

    def argument(self, name: str, position: int | None = None) -> Argument | None:
        """The argument passed as ``name=`` or, failing that, at ``position``."""
        if name in self.kwargs:
            return self.kwargs[name]
        if position is not None and position < len(self.args):
            return self.args[position]
        return None

    def source(self, name: str, position: int | None = None) -> str:
        """The argument's source text, e.g. ``lr=1.8e-2``."""
        text = self.sources.get(name, self.sources.get(str(position)))
        return f"{name}={text}" if text is not None else name


@dataclasses.dataclass(frozen=True)
class TrainScript:
    """What a train script calls, and which ``gpc.config`` names it reads."""

    path: pathlib.Path
    calls: tuple[Call, ...]
    config_reads: frozenset[str]

    def first(self, *names: str) -> Call | None:
        """The first call of any of ``names`` (the callee's last name)."""
        return next((call for call in self.calls if call.name in names), None)

    def where(self, call: Call) -> str:
        return f"{self.path.name}:{call.line}"

    def origin(self, call: Call, name: str, position: int | None = None) -> str:
        """An argument as written, with its call and line: ``Lamb(lr=1.8e-2) at train.py:38``."""
        return f"{call.text}({call.source(name, position)}) at {self.where(call)}"


class _Reader(ast.NodeVisitor):
    def __init__(self, tree: ast.Module, config: ColossalConfig | None) -> None:
        self.config = config
        self.assigned: dict[str, ast.expr] = {}
        self.imports: dict[str, str] = {}
        self.config_reads: set[str] = set()
        self.calls: list[Call] = []
        self._depth = 0
        self._targets: dict[int, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.assigned[node.targets[0].id] = node.value
                self._targets[id(node.value)] = node.targets[0].id
            elif isinstance(node, ast.ImportFrom) and node.module:
                self.imports.update({alias.asname or alias.name: node.module for alias in node.names})
            elif isinstance(node, ast.Import):
                self.imports.update({(alias.asname or alias.name).split(".")[0]: alias.name for alias in node.names})

    def visit_For(self, node: ast.For | ast.While) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_While = visit_For

    def visit_Call(self, node: ast.Call) -> None:
        text = ast.unparse(node.func)
        first = text.split(".")[0]
        args = tuple(self.evaluate(arg) for arg in node.args)
        sources = {str(i): ast.unparse(arg) for i, arg in enumerate(node.args)}
        kwargs: dict[str, Argument] = {}
        for keyword in node.keywords:
            if keyword.arg is not None:
                kwargs[keyword.arg] = self.evaluate(keyword.value)
                sources[keyword.arg] = ast.unparse(keyword.value)
                continue
            for key, value in self._dict_items(keyword.value):
                kwargs[key] = self.evaluate(value)
                sources[key] = ast.unparse(value)
        name = text.rsplit(".", 1)[-1]
        self.calls.append(
            Call(name, text, self.imports.get(first), node.lineno, args, kwargs, sources, self._targets.get(id(node)), self._depth)
        )
        self.generic_visit(node)

    def _dict_items(self, node: ast.expr) -> list[tuple[str, ast.expr]]:
        """The items of ``**node`` when it is (a name assigned) ``dict(k=...)`` or ``{'k': ...}``."""
        if isinstance(node, ast.Name) and node.id in self.assigned:
            node = self.assigned[node.id]
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "dict":
            return [(k.arg, k.value) for k in node.keywords if k.arg is not None]
        if isinstance(node, ast.Dict):
            return [
                (k.value, v)
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            ]
        return []

    def _config_name(self, node: ast.expr) -> str | None:
        """``NAME`` for ``gpc.config.NAME``, ``gpc.config['NAME']``, ``gpc.config.get('NAME')``
        and ``getattr(gpc.config, 'NAME')``."""
        if isinstance(node, ast.Attribute) and _is_config(node.value):
            return node.attr
        if isinstance(node, ast.Subscript) and _is_config(node.value) and isinstance(node.slice, ast.Constant):
            return str(node.slice.value)
        if not isinstance(node, ast.Call):
            return None
        func, args = node.func, node.args
        if isinstance(func, ast.Attribute) and func.attr == "get" and _is_config(func.value) and args:
            name = args[0]
        elif isinstance(func, ast.Name) and func.id == "getattr" and len(args) > 1 and _is_config(args[0]):
            name = args[1]
        else:
            return None
        return str(name.value) if isinstance(name, ast.Constant) else None

    def evaluate(self, node: ast.expr, seen: frozenset[str] = frozenset()) -> Argument:
        """The value of an expression when it can be known without running the script."""
        name = self._config_name(node)
        if name is not None:
            self.config_reads.add(name)
            if self.config is not None and name in self.config.values:
                return Found(self.config.values[name], self.config.where(name))
            default = _config_default(node)
            return self.evaluate(default, seen) if default is not None else Unknown(ast.unparse(node))
        if isinstance(node, ast.Constant):
            return Found(node.value)
        if isinstance(node, ast.Name) and node.id in self.assigned and node.id not in seen:
            return self.evaluate(self.assigned[node.id], seen | {node.id})
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = self.evaluate(node.operand, seen)
            if isinstance(inner, Found) and isinstance(inner.value, int | float):
                return Found(-inner.value, inner.origin)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = self.evaluate(node.left, seen), self.evaluate(node.right, seen)
            if isinstance(left, Found) and isinstance(right, Found):
                try:
                    value = _OPERATORS[type(node.op)](left.value, right.value)
                except (TypeError, ZeroDivisionError, OverflowError):
                    return Unknown(ast.unparse(node))
                return Found(value, ", ".join(o for o in (left.origin, right.origin) if o))
        if isinstance(node, ast.Tuple | ast.List):
            items = [self.evaluate(item, seen) for item in node.elts]
            if all(isinstance(item, Found) for item in items):
                return Found(tuple(item.value for item in items if isinstance(item, Found)))
        if isinstance(node, ast.Attribute):
            base = self.evaluate(node.value, seen)
            if isinstance(base, Found) and isinstance(base.value, dict) and node.attr in base.value:
                section = self._config_name(node.value)
                origin = self.config.where(f"{section}.{node.attr}") if section and self.config else base.origin
                return Found(base.value[node.attr], origin)
        return Unknown(ast.unparse(node))


def _config_default(node: ast.expr) -> ast.expr | None:
    """The default of ``gpc.config.get('NAME', default)`` or ``getattr(gpc.config, 'NAME', default)``."""
    if not isinstance(node, ast.Call):
        return None
    position = 1 if isinstance(node.func, ast.Attribute) else 2
    return node.args[position] if len(node.args) > position else None


def _is_config(node: ast.expr) -> bool:
    """``gpc.config`` (whatever the global context is imported as)."""
    return isinstance(node, ast.Attribute) and node.attr == "config" and isinstance(node.value, ast.Name)


def read_train_script(path: str | pathlib.Path, config: ColossalConfig | None = None) -> TrainScript:
    """Parse a Colossal-AI train script (without running it) and evaluate its calls'
    arguments against ``config``.

    Raises:
        ConfigError: the file is missing, not a ``.py`` file, or not valid Python.
    """
    path = pathlib.Path(path)
    tree = parse_python(path, "the train script")
    reader = _Reader(tree, config)
    reader.visit(tree)
    return TrainScript(path, tuple(reader.calls), frozenset(reader.config_reads))
