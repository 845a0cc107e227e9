"""Load a config: Python or YAML files, ``_base_`` inheritance, ``--set`` overrides.

A Python config is a module whose lowercase module-level names hold dicts, lists and
scalars (the shape of Colossal-AI's ``vit-b16.py``). Uppercase names are the file's own
constants, and names starting with ``_`` (other than ``_base_``), modules, functions and
classes are ignored, so a config may compute its values::

    _base_ = ['_base_/vit.py']
    GLOBAL = 32 * 1024
    global_batch_size = GLOBAL
    optimizer = dict(type='lamb', lr=1.8e-2, weight_decay=0.1)

A file shaped like a Colossal-AI config (it imports ``colossalai``, or sets its keys
and constants) is recognised and refused with the command that converts it,
``largebatch config import colossalai`` (``largebatch.importers.colossalai``); a YAML file of
the same shape is accepted. ``_base_`` (a path or a list of paths,
relative to the file) is merged first, in order; this file's values are merged over it.
Dicts merge key by key; a dict holding ``_delete_=True`` replaces its base instead.
Lists and scalars replace.
"""

from __future__ import annotations

import ast
import copy
import pathlib
import runpy
import types
from typing import Any

import yaml

from largebatch.errors import ConfigError

SCALARS = (str, int, float, bool, type(None))
CONFIG_SUFFIXES = (".py", ".yaml", ".yml")


def load_config(path: str | pathlib.Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """Read a config file with its bases and apply ``key.path=value`` overrides.

    Args:
        path: a ``.py``, ``.yaml`` or ``.yml`` config file.
        overrides: ``--set`` strings, each ``dotted.key=value``; values parse as YAML
            (``0.02`` is a float, ``true`` a bool, ``[1, 2]`` a list, ``null`` None).

    Returns:
        The merged, overridden config as plain dicts, lists and scalars (not yet
        validated: see ``largebatch.config.schema.validate``).

    Raises:
        ConfigError: the file is missing or unreadable, a value is not plain data, a
            ``_base_`` cycles, an override is malformed, or the file is a Colossal-AI
            config (naming the command that converts it).
    """
    config = _load_file(pathlib.Path(path), chain=())
    for override in overrides or []:
        apply_override(config, override)
    if pathlib.Path(path).suffix == ".py":
        refuse_colossalai_shape(pathlib.Path(path), config)
    return config


def read_plain_file(path: str | pathlib.Path) -> dict[str, Any]:
    """A ``.py`` or ``.yaml`` file of a config's shape (with its ``_base_`` files) as plain
    dicts, for files that are not configs: nothing checks it against the schema
    (``largebatch.study`` reads study files with it).

    Raises:
        ConfigError: as ``load_config`` for the file itself.
    """
    return _load_file(pathlib.Path(path), chain=())


def read_yaml_data(path: str | pathlib.Path) -> dict[str, Any]:
    """A YAML config file as plain data, read once and nothing else: a ``_base_`` it names
    is kept as a key, not followed, and no other file is opened (a run's saved
    ``config.yaml`` is read this way: ``largebatch.config.resolve_saved_config``).

    Raises:
        ConfigError: the file is missing, not valid YAML, or not a mapping of plain values.
    """
    path = pathlib.Path(path)
    _check_exists(path)
    return _read_yaml(path)


def _check_exists(path: pathlib.Path) -> None:
    if not path.is_file():
        hint = "check the path" if path.suffix in CONFIG_SUFFIXES else f"a config file ends in {', '.join(CONFIG_SUFFIXES)}"
        raise ConfigError(f"config file not found; {hint}", path=str(path))


def _load_file(path: pathlib.Path, chain: tuple[pathlib.Path, ...]) -> dict[str, Any]:
    _check_exists(path)
    resolved = path.resolve()
    if resolved in chain:
        cycle = " -> ".join(str(p) for p in (*chain, resolved))
        raise ConfigError(f"_base_ files include each other in a cycle: {cycle}", path=str(path))
    if path.suffix == ".py":
        raw = _read_python(path)
    elif path.suffix in (".yaml", ".yml"):
        raw = _read_yaml(path)
    else:
        raise ConfigError(f"unknown config file type {path.suffix!r}; use one of {', '.join(CONFIG_SUFFIXES)}", path=str(path))

    bases = raw.pop("_base_", [])
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError("_base_ must be a path or a list of paths", path=str(path))
    merged: dict[str, Any] = {}
    for base in bases:
        merge_into(merged, _load_file(path.parent / base, (*chain, resolved)))
    merge_into(merged, raw)
    return merged


def _read_python(path: pathlib.Path) -> dict[str, Any]:
    try:
        refuse_colossalai_imports(path, ast.parse(path.read_text(), filename=str(path)))
    except SyntaxError:
        pass  # running it names the line
    try:
        namespace = runpy.run_path(str(path), run_name="largebatch_config")
    except Exception as exc:  # a config that raises is the user's to fix: show where
        raise ConfigError(f"the config raised {type(exc).__name__}: {exc}", path=str(path)) from exc
    config: dict[str, Any] = {}
    for name, value in namespace.items():
        if name == "_base_":
            config[name] = value
            continue
        if name.startswith("_") or not name.islower():
            continue
        if isinstance(value, (types.ModuleType, types.FunctionType, type)):
            continue
        config[name] = _plain(value, name, path)
    return config


def _yaml_problem(exc: yaml.YAMLError, *, where: bool = True) -> str:
    """A YAML error in one line: what is wrong and, for a file, the 1-based line and column."""
    problem = " ".join(str(getattr(exc, "problem", None) or str(exc).splitlines()[0]).split())
    mark = getattr(exc, "problem_mark", None)
    if where and mark is not None:
        problem += f" at line {mark.line + 1}, column {mark.column + 1}"
    return problem


def _read_yaml(path: pathlib.Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {_yaml_problem(exc)}", path=str(path)) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("a YAML config must be a mapping of names to values", path=str(path))
    return {k: (v if k == "_base_" else _plain(v, k, path)) for k, v in data.items()}


def _plain(value: Any, key: str, path: pathlib.Path) -> Any:
    """Copy ``value`` as dicts, lists and scalars; tuples become lists."""
    if isinstance(value, SCALARS):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{key}[{i}]", path) for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f"dict keys must be strings, got {k!r}", key=key, path=str(path))
            out[k] = _plain(v, f"{key}.{k}", path)
        return out
    raise ConfigError(
        f"values must be dicts, lists, strings, numbers, booleans or None, got {type(value).__name__}",
        key=key,
        path=str(path),
    )


def merge_into(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Merge ``update`` into ``base`` in place (dicts recursively) and return ``base``."""
    for key, value in update.items():
        if isinstance(value, dict) and value.get("_delete_"):
            base[key] = {k: copy.deepcopy(v) for k, v in value.items() if k != "_delete_"}
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            merge_into(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def _number_or_text(text: str) -> int | float | str:
    """YAML 1.1 reads ``2e-3`` as a string; a command line means the number."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def apply_override(config: dict[str, Any], override: str) -> None:
    """Apply one ``dotted.key=value`` override in place.

    Raises:
        ConfigError: no ``=``, an empty key, or a path through a non-dict value.
    """
    key, sep, text = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set expects key.path=value, got {override!r}", key="--set")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError as exc:
        problem = _yaml_problem(exc, where=False)
        raise ConfigError(
            f"--set {override!r}: the value is not valid YAML ({problem}); close the brackets, or quote a string with ':' or '#'",
            key=key,
        ) from exc
    if isinstance(value, str):
        value = _number_or_text(value)
    if isinstance(value, dict):
        value = _plain(value, key, pathlib.Path("--set"))
    parts = key.split(".")
    node = config
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise ConfigError(f"cannot set {key!r}: {where} is {child!r}, not a dict", key="--set")
        node = child
    node[parts[-1]] = value


# A Colossal-AI config given where a largebatch config is expected: recognised, never read.
# Its ViT examples' upper-case constants -> the largebatch key each stands for (which the
# importer maps), and the lower-case names only Colossal-AI's engine reads.
CONSTANT_KEYS = {
    "BATCH_SIZE": "micro_batch_size",
    "TOTAL_BATCH_SIZE": "global_batch_size",
    "NUM_EPOCHS": "epochs",
    "LEARNING_RATE": "optimizer.lr",
    "WEIGHT_DECAY": "optimizer.weight_decay",
    "WARMUP_EPOCHS": "lr_schedule.warmup_epochs",
    "IMG_SIZE": "data.image_size",
    "NUM_CLASSES": "data.num_classes",
    "DROP_RATE": "model.drop_rate",
    "PATCH_SIZE": "model.patch_size",
    "HIDDEN_SIZE": "model.embed_dim",
    "DEPTH": "model.depth",
    "NUM_HEADS": "model.num_heads",
    "MLP_RATIO": "model.mlp_ratio",
}
COLOSSALAI_KEYS = (
    "fp16",
    "gradient_accumulation",
    "dali",
    "parallel",
    "zero",
    "cudnn_benchmark",
    "cudnn_deterministic",
    "gradient_handler",
)


def colossalai_import_lines(tree: ast.Module) -> tuple[int, ...]:
    """The lines of ``import colossalai...`` and ``from colossalai... import ...``."""
    names = {node.lineno: [a.name for a in node.names] for node in ast.walk(tree) if isinstance(node, ast.Import)}
    names |= {node.lineno: [node.module or ""] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0}
    return tuple(sorted(line for line, found in names.items() if any(n.split(".")[0] == "colossalai" for n in found)))


def assignment_lines(tree: ast.Module) -> dict[str, int]:
    """Each module-level name with the line of its last top-level assignment."""
    targets: list[tuple[ast.stmt, ast.expr]] = [(node, t) for node in tree.body if isinstance(node, ast.Assign) for t in node.targets]
    targets += [(node, node.target) for node in tree.body if isinstance(node, ast.AnnAssign | ast.AugAssign)]
    found = sorted((node.lineno, name.id) for node, target in targets for name in ast.walk(target) if isinstance(name, ast.Name))
    return {name: line for line, name in found}


def _import_command(path: pathlib.Path) -> str:
    return f"largebatch config import colossalai {path} --out {path.with_name(path.stem + '-largebatch.py')}"


def refuse_colossalai_imports(path: pathlib.Path, tree: ast.Module) -> None:
    """Before a config file runs: one ``ConfigError`` (the file, the line, the import command) if it imports ``colossalai``."""
    if lines := colossalai_import_lines(tree):
        raise ConfigError(
            f"a Colossal-AI config (it imports colossalai at line {lines[0]}), which is not a largebatch config; write one "
            f"from it with `{_import_command(path)}` (add --train-script for the optimizer, schedule and model set there)",
            path=str(path),
        )


def refuse_colossalai_shape(path: pathlib.Path, config: dict[str, Any]) -> None:
    """After a Python config has loaded into ``config``: one ``ConfigError`` if it sets
    Colossal-AI's keys with its constants, or an upper-case constant stands for a key it lacks."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return
    assigned = assignment_lines(tree)
    read = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    keys = [key for key in COLOSSALAI_KEYS if key in assigned]
    ignored = [name for name in assigned if name in CONSTANT_KEYS and name not in read]
    missing = [name for name in ignored if not _sets(config, CONSTANT_KEYS[name])]
    if len(keys) >= 2 or (keys and ignored):
        constants = f" and {', '.join(ignored)}, upper-case names a largebatch config does not read (they are the file's own constants)"
        raise ConfigError(
            f"looks like a Colossal-AI config: it sets {', '.join(keys)} (Colossal-AI's keys){constants if ignored else ''}; "
            f"write a largebatch config from it with `{_import_command(path)}`",
            path=str(path),
        )
    if missing:
        one = len(missing) == 1
        stands = ", ".join(f"{name} -> {CONSTANT_KEYS[name]}" for name in missing)
        raise ConfigError(
            f"{', '.join(missing)} {'is' if one else 'are'} upper-case, so the config does not read {'it' if one else 'them'} "
            f"(upper-case names are the file's own constants), and {'its key is' if one else 'their keys are'} not set "
            f"({stands}); set the lower-case key, or, for a Colossal-AI config, run `{_import_command(path)}`",
            path=str(path),
        )


def _sets(config: dict[str, Any], dotted: str) -> bool:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True
