"""The classes a config names, and building them with the config's keyword arguments.

Hooks (``hooks``) and the task (``task.type``) are named the same way:

* a built-in name (``'logger'``, ``'classification'``);
* ``'path/file.py:Class'``: a file of yours, read relative to the working directory,
  then to the config file's folder and its parents (for a resumed run, the ``--config``
  file the command names: the run directory that holds its saved ``config.yaml`` is data,
  and is never searched);
* ``'package.module:Class'``: a module on the Python path;
* a name an installed package registers under the entry-point group ``largebatch.hooks``
  (hooks) or ``largebatch.tasks`` (tasks), e.g. in its ``pyproject.toml``::

      [project.entry-points."largebatch.hooks"]
      grad_histogram = "mypkg.hooks:GradHistogram"

  A built-in name wins over a registered one.

Every mistake is a ``ConfigError`` naming the config key: an unknown name with a "did
you mean", a missing file or module, a class that is not of the expected kind, an
argument the class does not take or of the wrong type.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import pathlib
import sys
from types import ModuleType
from typing import Any

from largebatch.config.arguments import check_call
from largebatch.errors import ConfigError, UserError


def _search_paths(file: str, config_path: pathlib.Path | None) -> list[pathlib.Path]:
    path = pathlib.Path(file)
    if path.is_absolute():
        return [path]
    candidates = [pathlib.Path.cwd() / path]
    if config_path is not None:
        candidates += [parent / path for parent in pathlib.Path(config_path).resolve().parents]
    return candidates


def _is_file(location: str) -> bool:
    return location.endswith(".py") or "/" in location or "\\" in location


def _load_file(file: str, key: str, kind: str, config_path: pathlib.Path | None) -> ModuleType:
    found = next((p for p in _search_paths(file, config_path) if p.is_file()), None)
    if found is None:
        if config_path is None:  # a resumed run's saved config: its run directory is never searched
            raise ConfigError(
                f"{kind} file {file!r} not found in the working directory (a run directory is not searched: it is data); "
                "check the path, or give --config FILE to look beside that file too",
                key=key,
            )
        raise ConfigError(f"{kind} file {file!r} not found (looked in the working directory and above the config); check the path", key=key)
    module_name = f"largebatch_user_{kind}_{hashlib.sha1(str(found).encode()).hexdigest()[:12]}"
    module = sys.modules.get(module_name)
    if module is None:
        module_spec = importlib.util.spec_from_file_location(module_name, found)
        if module_spec is None or module_spec.loader is None:
            raise ConfigError(f"{kind} file {found} cannot be imported as Python; name a .py file", key=key)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module  # before running it, as an import does: dataclasses and pickle look it up
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[module_name]
            raise ConfigError(f"importing {found} raised {type(exc).__name__}: {exc}", key=key) from exc
    return module


def _load_module(name: str, key: str, kind: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except Exception as exc:
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if missing and (name == missing or name.startswith(f"{missing}.")):  # the module itself, not one it imports
            raise ConfigError(
                f"module {name!r} not found on the Python path; a custom {kind} is 'path/file.py:Class' or 'package.module:Class'",
                key=key,
            ) from exc
        raise ConfigError(f"importing module {name!r} raised {type(exc).__name__}: {exc}", key=key) from exc


ENTRY_POINT_GROUPS = {"hook": "largebatch.hooks", "task": "largebatch.tasks"}


def registered(kind: str) -> dict[str, importlib.metadata.EntryPoint]:
    """The names installed packages register for ``kind`` (``hook``, ``task``)."""
    group = ENTRY_POINT_GROUPS.get(kind)
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=group)} if group else {}


def _load_entry_point(entry: importlib.metadata.EntryPoint, key: str, kind: str) -> Any:
    where = f"{entry.value!r} (registered as {kind} {entry.name!r} by {entry.dist.name if entry.dist else 'a package'})"
    try:
        return entry.load()
    except Exception as exc:
        raise ConfigError(f"loading {where} raised {type(exc).__name__}: {exc}; reinstall or fix that package", key=key) from exc


def load_class(spec: str, *, key: str, kind: str, base: type, builtins: dict[str, str], config_path: pathlib.Path | None = None) -> type:
    """The class ``spec`` names: a key of ``builtins``, a name installed packages register
    (``ENTRY_POINT_GROUPS``), ``'path/file.py:Class'`` or ``'package.module:Class'``.

    Args:
        spec: the config's value.
        key: the config key it came from (``hooks[2]``, ``task.type``), for errors.
        kind: what is named (``hook``, ``task``), for errors.
        base: the class it must subclass (and not be).
        builtins: built-in names, each mapped to ``'package.module:Class'``.
        config_path: the config file the user named, whose folders are searched for relative
            paths; None searches the working directory only.

    Raises:
        ConfigError: unknown name, missing file, module or class, a class that is not a
            subclass of ``base``, or a file that fails to import.
    """
    if spec in builtins:
        module_name, _, class_name = builtins[spec].partition(":")
        return getattr(importlib.import_module(module_name), class_name)
    if ":" not in spec:
        entries = registered(kind)
        if spec in entries:
            return _checked(_load_entry_point(entries[spec], key, kind), f"{entries[spec].value}", key, base)
        close = difflib.get_close_matches(spec, [*builtins, *entries], n=1)
        hint = (
            f"did you mean {close[0]!r}?"
            if close
            else f"built-in {kind}s: {', '.join(builtins)}"
            + (f"; installed: {', '.join(sorted(entries))}" if entries else "")
            + f"; a custom {kind} is 'path/file.py:Class' or 'package.module:Class'"
        )
        raise ConfigError(f"unknown {kind} {spec!r}; {hint}", key=key)
    location, _, class_name = spec.rpartition(":")
    module = _load_file(location, key, kind, config_path) if _is_file(location) else _load_module(location, key, kind)
    cls = getattr(module, class_name, None)
    if cls is None:
        classes = [n for n, v in vars(module).items() if inspect.isclass(v) and issubclass(v, base) and v is not base]
        close = difflib.get_close_matches(class_name, classes, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"{kind} classes in it: {', '.join(classes) or 'none'}"
        raise ConfigError(f"{location} has no class {class_name!r}; {hint}", key=key)
    return _checked(cls, f"{location}:{class_name}", key, base)


def _checked(cls: Any, where: str, key: str, base: type) -> type:
    if not (inspect.isclass(cls) and issubclass(cls, base)):
        raise ConfigError(f"{where} is not a subclass of {base.__module__}.{base.__name__}; subclass {base.__name__}", key=key)
    if cls is base:
        raise ConfigError(f"{where} is the {base.__name__} base class itself; name your subclass of it", key=key)
    return cls


def check_arguments(cls: type, kwargs: dict[str, Any], key: str, *, untyped: tuple[str, ...] = ()) -> None:
    """Whether ``cls(**kwargs)`` binds, and each value fits its parameter's type
    (``largebatch.config.arguments``); ``untyped`` names parameters the caller checks.

    Raises:
        ConfigError: an argument ``cls`` does not take (listing those it does), or a
            value of the wrong type (naming ``key.argument``).
    """
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:
        accepted = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
        raise ConfigError(f"{cls.__name__} arguments: {exc}; it takes {', '.join(accepted) or 'none'}", key=key) from exc
    check_call(cls, kwargs, key, skip=untyped)


def construct(cls: type, kwargs: dict[str, Any], key: str) -> Any:
    """``cls(**kwargs)``, its failures reported as a ``ConfigError`` naming ``key``
    (call ``check_arguments`` first).

    Raises:
        ConfigError: the constructor raised: a ``UserError`` keeps its message (a
            missing package, say), a ``ValueError`` or ``TypeError`` is the config's
            mistake in a value; anything else is named with its type.
    """
    try:
        return cls(**kwargs)
    except UserError as exc:
        raise ConfigError(f"{cls.__name__}: {exc.message}", key=key, path=exc.path) from exc
    except (ValueError, TypeError) as exc:  # the class rejected a value: still the config's mistake
        raise ConfigError(f"{cls.__name__}: {exc}", key=key) from exc
    except Exception as exc:  # any other failure of its constructor: one line naming the entry (traceback with --debug)
        raise ConfigError(f"{cls.__name__}() raised {type(exc).__name__}: {exc}", key=key) from exc
