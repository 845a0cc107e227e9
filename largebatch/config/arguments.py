"""Values the config passes to a constructor, checked against the constructor's signature.

The config hands some sections straight to a class: ``optimizer`` to the optimizer,
``model`` to ``timm.create_model``'s model class, a hook's entry to the hook. A value of
the wrong type would otherwise surface as a ``TypeError`` deep inside the callee, after
the data and the model were built. ``check_call`` compares each value with the
parameter's annotation (``float``, ``int``, ``bool``, ``str``, ``X | None``,
``tuple[float, float]``, ``list[str]``, ...) or, without a usable annotation, with the type
of its default; an int is accepted where a float is expected, a list where a tuple is.
Parameters it cannot judge (no annotation, default ``None``, other types) are accepted.

A signature is read into a ``Signature``: per parameter what a value must be
(``Expected``, which names a class by its import path, never holds it), how an error
says it and the default an error shows. A ``Signature`` is plain data, so a library's
constructors can be recorded once and a config checked against them without importing
the library (``largebatch.signatures``: the optimizers and timm's ViT); a recorded one
is used only with the library version it was read from (``RecordedFrom``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.metadata
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from largebatch.config.redact import redact
from largebatch.errors import ConfigError

_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", tuple: "a list", dict: "a dict"}


@dataclasses.dataclass(frozen=True)
class Expected:
    """What a value must be, as far as ``check_call`` can tell.

    Attributes:
        kind: ``any`` (cannot tell: accepted), ``none`` (None), ``int`` (an int, not a
            bool), ``float`` (an int or a float, not a bool), ``instance`` (of the class
            ``of`` names as ``module:qualname``), ``sequence`` (a list or a tuple: one
            item per entry of ``items`` when ``fixed``, else each item ``items[0]`` if
            given) or ``union`` (any of ``items``).
    """

    kind: str
    items: tuple[Expected, ...] = ()
    fixed: bool = False
    of: str = ""

    def fits(self, value: Any) -> bool | None:
        """Whether ``value`` fits; None: cannot tell."""
        if self.kind == "any":
            return None
        if self.kind == "union":
            results = [item.fits(value) for item in self.items]
            if any(r is True for r in results):
                return True
            return False if all(r is False for r in results) else None
        if self.kind == "none":
            return value is None
        if self.kind == "int":
            return isinstance(value, int) and not isinstance(value, bool)
        if self.kind == "float":
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        if self.kind == "instance":
            cls = _named_class(self.of)
            return None if cls is None else isinstance(value, cls)
        if self.kind == "sequence":
            if not isinstance(value, (list, tuple)):
                return False
            if self.fixed and self.items and len(self.items) != len(value):
                return False
            element_types = self.items if self.fixed else self.items[:1] * len(value)
            results = [expected.fits(v) for v, expected in zip(value, element_types)]
            return False if any(r is False for r in results) else True
        raise AssertionError(f"unknown kind {self.kind!r}")


ANY = Expected("any")


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One parameter as ``check_call`` judges it.

    Attributes:
        name: the keyword.
        expected: what a value must be.
        described: how an error names it ("a number (or null)"; empty where ``expected``
            accepts anything).
        default: the default as an error shows it (its ``repr``).
    """

    name: str
    expected: Expected
    described: str
    default: str


@dataclasses.dataclass(frozen=True)
class Signature:
    """The parameters of a callable the config hands values to.

    Attributes:
        owner: how errors name the callable: its class name, or ``it`` for a function.
        parameters: in the signature's order.
    """

    owner: str
    parameters: tuple[Parameter, ...]

    def names(self) -> list[str]:
        return [p.name for p in self.parameters]

    def default(self, name: str) -> Any:
        """Parameter ``name``'s default as a value (its recorded ``repr`` read back).

        Raises:
            KeyError: no parameter ``name``.
            ValueError: a default that is not a plain value (an object, a class).
        """
        param = next((p for p in self.parameters if p.name == name), None)
        if param is None:
            raise KeyError(name)
        try:
            return ast.literal_eval(param.default)
        except SyntaxError as exc:
            raise ValueError(f"{self.owner}'s {name} defaults to {param.default}, not a plain value") from exc

    def check(self, kwargs: Mapping[str, Any], key_prefix: str, *, skip: tuple[str, ...] = ()) -> None:
        """Check ``kwargs`` against the parameters (a name it lacks is the caller's to judge).

        Raises:
            ConfigError: a value whose type does not fit, naming ``key_prefix.name``, what
                was expected and what was given.
        """
        params = {p.name: p for p in self.parameters}
        for name, value in kwargs.items():
            param = params.get(name)
            if param is None or name in skip:
                continue
            if param.expected.fits(value) is False:
                raise ConfigError(
                    f"expected {param.described}, got {_describe(value, name)}; {self.owner} takes {name}={param.default} by default",
                    key=f"{key_prefix}.{name}",
                )


@dataclasses.dataclass(frozen=True)
class RecordedFrom:
    """Where recorded signatures were read: a library at a version, or largebatch's own
    code (``library`` None: recorded beside it, so always current)."""

    library: str | None = None
    version: str | None = None

    def matches_installed(self) -> bool:
        """Whether the installed library is this version (nothing is imported)."""
        return self.library is None or installed_version(self.library) == self.version


@functools.cache  # read once a process: each read searches the path's distributions
def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` from its metadata, without a local build
    tag (``2.14.1`` for ``2.14.1+cu130``: the same source), or None when it is not installed."""
    try:
        return importlib.metadata.version(distribution).partition("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def _named_class(path: str) -> type | None:
    """The class ``module:qualname`` names (its module is imported), or None when there is none (a local class)."""
    module, _, qualname = path.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) else None


def _describe(value: Any, key: str) -> str:
    """``value`` for an error line, redacted under a credential's name (``api_token=...``)."""
    return f"{redact(value, key)!r} ({type(value).__name__})"


def _reduce(expected: Any) -> Expected:
    """``expected`` (a type or a typing form) as an ``Expected``."""
    origin = typing.get_origin(expected)
    if expected is Any or expected is inspect.Parameter.empty:
        return ANY
    if origin in (typing.Union, types.UnionType):
        return Expected("union", tuple(_reduce(arg) for arg in typing.get_args(expected)))
    if expected is type(None):
        return Expected("none")
    if origin in (tuple, list):
        args = typing.get_args(expected)
        items = tuple(_reduce(a) for a in args if a is not Ellipsis)
        return Expected("sequence", items, fixed=origin is tuple and Ellipsis not in args)
    if origin is not None:
        return _instance(origin) if isinstance(origin, type) else ANY
    if not isinstance(expected, type):
        return ANY
    if expected is float:
        return Expected("float")
    if expected is int:
        return Expected("int")
    if expected in (tuple, list):
        return Expected("sequence")
    if expected in (bool, str, dict):
        return _instance(expected)
    return ANY


def _instance(cls: type) -> Expected:
    return Expected("instance", of=f"{cls.__module__}:{cls.__qualname__}")


def _expected_from_default(default: Any) -> Any:
    if default is inspect.Parameter.empty or default is None:
        return inspect.Parameter.empty
    if isinstance(default, (tuple, list)):
        kinds = {type(v) for v in default}
        element = kinds.pop() if len(kinds) == 1 else Any
        if element is int:
            element = float  # (0.9, 0.999)-style defaults written as ints elsewhere still mean numbers
        return types.GenericAlias(tuple, (element, ...)) if isinstance(default, tuple) else types.GenericAlias(list, (element,))
    if type(default) is int:
        return float  # an un-annotated 0 is as often a float's default as an int's: accept either
    if type(default) in (bool, float, str):
        return type(default)
    return inspect.Parameter.empty


def _hints(func: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(func)
    except Exception:  # unresolvable string annotations: fall back to the defaults
        return {}


def _expected_name(expected: Any) -> str:
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(expected) if a is not type(None)]
        plain = [a for a in args if typing.get_origin(a) is not None or a in _NAMES]
        names = [_expected_name(a) for a in plain or args]  # "a number", not "a number or Tensor"
        optional = type(None) in typing.get_args(expected)
        return " or ".join(names) + (" (or null)" if optional else "")
    if origin in (tuple, list):
        args = [a for a in typing.get_args(expected) if a is not Ellipsis]
        if origin is tuple and args and Ellipsis not in typing.get_args(expected):
            return f"a list of {len(args)} ({', '.join(_expected_name(a).removeprefix('a ').removeprefix('an ') for a in args)})"
        return f"a list of {_expected_name(args[0]).removeprefix('a ').removeprefix('an ')}s" if args else "a list"
    return _NAMES.get(expected, getattr(expected, "__name__", str(expected)))


def read_signature(func: Callable[..., Any]) -> Signature | None:
    """``func``'s parameters (a class: its ``__init__``'s, ``self`` left out) as a
    ``Signature``; None when ``inspect`` cannot read them."""
    is_class = isinstance(func, type)
    target = typing.cast(Any, func).__init__ if is_class else func
    try:
        params = list(inspect.signature(target).parameters.items())
    except (TypeError, ValueError):
        return None
    hints = _hints(target)
    read = []
    for name, param in params[1:] if is_class else params:
        expected = hints.get(name, inspect.Parameter.empty)
        if expected is inspect.Parameter.empty or isinstance(expected, str):
            expected = _expected_from_default(param.default)
        if param.default is None and expected is not inspect.Parameter.empty:
            expected = expected | None
        reduced = _reduce(expected)
        read.append(Parameter(name, reduced, "" if reduced == ANY else _expected_name(expected), repr(param.default)))
    return Signature(func.__name__ if is_class else "it", tuple(read))


def check_call(func: Callable[..., Any], kwargs: dict[str, Any], key_prefix: str, *, skip: tuple[str, ...] = ()) -> None:
    """Check ``kwargs`` against ``func``'s parameters (a class: its ``__init__``).

    Raises:
        ConfigError: a value whose type does not fit, naming ``key_prefix.name``, what
            was expected and what was given.
    """
    signature = read_signature(func)
    if signature is not None:
        signature.check(kwargs, key_prefix, skip=skip)
