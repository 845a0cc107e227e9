"""Values the config passes to a constructor, checked against the constructor's signature.

The config hands some sections straight to a class: ``optimizer`` to the optimizer,
``model`` to ``timm.create_model``'s model class, a hook's entry to the hook. A value of
the wrong type would otherwise surface as a ``TypeError`` deep inside the callee, after
the data and the model were built. ``check_call`` compares each value with the
parameter's annotation (``float``, ``int``, ``bool``, ``str``, ``X | None``,
``tuple[float, float]``, ``list[str]``, ...) or, without a usable annotation, with the type
of its default; an int is accepted where a float is expected, a list where a tuple is.
Parameters it cannot judge (no annotation, default ``None``, other types) are accepted.
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

from largebatch.errors import ConfigError

_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", tuple: "a list", dict: "a dict"}


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _fits(value: Any, expected: Any) -> bool | None:
    """Whether ``value`` fits ``expected`` (a type or a typing form); None: cannot tell."""
    origin = typing.get_origin(expected)
    if expected is Any or expected is inspect.Parameter.empty:
        return None
    if origin in (typing.Union, types.UnionType):
        results = [_fits(value, arg) for arg in typing.get_args(expected)]
        if any(r is True for r in results):
            return True
        return False if all(r is False for r in results) else None
    if expected is type(None):
        return value is None
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            return False
        args = [a for a in typing.get_args(expected) if a is not Ellipsis]
        if origin is tuple and args and Ellipsis not in typing.get_args(expected) and len(args) != len(value):
            return False
        element_types = args if origin is tuple and Ellipsis not in typing.get_args(expected) else args[:1] * len(value)
        results = [_fits(v, t) for v, t in zip(value, element_types)]
        return False if any(r is False for r in results) else True
    if origin is not None:
        return isinstance(value, origin) if isinstance(origin, type) else None
    if not isinstance(expected, type):
        return None
    if expected is bool:
        return isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected in (tuple, list):
        return isinstance(value, (list, tuple))
    if expected in (str, dict):
        return isinstance(value, expected)
    return None


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


def check_call(func: Any, kwargs: dict[str, Any], key_prefix: str, *, skip: tuple[str, ...] = ()) -> None:
    """Check ``kwargs`` against ``func``'s parameters (a class: its ``__init__``).

    Raises:
        ConfigError: a value whose type does not fit, naming ``key_prefix.name``, what
            was expected and what was given.
    """
    target = typing.cast(Any, func).__init__ if isinstance(func, type) else func
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return
    hints = _hints(target)
    for name, value in kwargs.items():
        param = params.get(name)
        if param is None or name in skip:
            continue
        expected = hints.get(name, inspect.Parameter.empty)
        if expected is inspect.Parameter.empty or isinstance(expected, str):
            expected = _expected_from_default(param.default)
        if param.default is None and expected is not inspect.Parameter.empty:
            expected = expected | None
        if _fits(value, expected) is False:
            raise ConfigError(
                f"expected {_expected_name(expected)}, got {_describe(value)}; {func.__name__ if isinstance(func, type) else 'it'} "
                f"takes {name}={param.default!r} by default",
                key=f"{key_prefix}.{name}",
            )
