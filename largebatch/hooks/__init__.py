"""Built-in hooks by name, and custom hooks loaded from a file by path.

In a config::

    hooks = [
        'logger',                                              # a built-in, defaults
        dict(type='checkpoint', interval_steps=500),           # a built-in, with arguments
        dict(type='hooks/grad_stats.py:GradStatsHook', interval=50),  # a file of yours
    ]

Default hooks (``DEFAULT_HOOKS``) always run; listing one by name replaces its
arguments. A path is read relative to the working directory, then to the config file's
folder and its parents.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import pathlib
import sys
from typing import Any

from largebatch.config.signature import check_call
from largebatch.engine.hook import Hook, parse_priority
from largebatch.errors import ConfigError

BUILTIN_HOOKS = {
    "loss": "largebatch.hooks.loss_accuracy:LossAccuracyHook",
    "lr": "largebatch.hooks.lr:LearningRateHook",
    "throughput": "largebatch.hooks.throughput:ThroughputHook",
    "memory": "largebatch.hooks.memory:MemoryHook",
    "grad_norm": "largebatch.hooks.grad_norm:GradNormHook",
    "trust_ratio": "largebatch.hooks.trust_ratio:TrustRatioHook",
    "noise_scale": "largebatch.hooks.noise_scale:NoiseScaleHook",
    "nan_guard": "largebatch.hooks.nan_guard:NanGuardHook",
    "logger": "largebatch.hooks.logger:MetricsLogger",
    "progress": "largebatch.hooks.progress:ProgressBar",
    "csv": "largebatch.hooks.csv_sink:CsvSink",
    "tensorboard": "largebatch.hooks.tensorboard:TensorBoardSink",
    "checkpoint": "largebatch.hooks.checkpoint:CheckpointHook",
    "eval": "largebatch.hooks.eval:EvalHook",
    "stop": "largebatch.hooks.stop:StopHook",
    "hook_timer": "largebatch.hooks.hook_timer:HookTimerHook",
    "clip_grad_norm": "largebatch.hooks.clip:ClipGradNormHook",
    "preemption": "largebatch.hooks.preemption:PreemptionHook",
}
DEFAULT_HOOKS = ("loss", "lr", "throughput", "grad_norm", "nan_guard", "logger", "checkpoint", "preemption")


def _builtin_class(name: str) -> type[Hook]:
    module, _, cls = BUILTIN_HOOKS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def _search_paths(file: str, config_path: pathlib.Path | None) -> list[pathlib.Path]:
    path = pathlib.Path(file)
    if path.is_absolute():
        return [path]
    candidates = [pathlib.Path.cwd() / path]
    if config_path is not None:
        candidates += [parent / path for parent in pathlib.Path(config_path).resolve().parents]
    return candidates


def load_hook_class(spec: str, key: str, config_path: pathlib.Path | None = None) -> type[Hook]:
    """The class a hook ``type`` names: a built-in name or ``'path/file.py:Class'``.

    Raises:
        ConfigError: unknown name, missing file or class, a class that is not a ``Hook``.
    """
    if spec in BUILTIN_HOOKS:
        return _builtin_class(spec)
    if ":" not in spec:
        close = difflib.get_close_matches(spec, list(BUILTIN_HOOKS), n=1)
        hint = (
            f"did you mean {close[0]!r}?" if close else f"built-in hooks: {', '.join(BUILTIN_HOOKS)}; a custom hook is 'path/file.py:Class'"
        )
        raise ConfigError(f"unknown hook {spec!r}; {hint}", key=key)
    file, _, class_name = spec.rpartition(":")
    found = next((p for p in _search_paths(file, config_path) if p.is_file()), None)
    if found is None:
        raise ConfigError(f"hook file {file!r} not found (looked in the working directory and above the config); check the path", key=key)
    module_name = f"largebatch_user_hook_{hashlib.sha1(str(found).encode()).hexdigest()[:12]}"
    module = sys.modules.get(module_name)
    if module is None:
        module_spec = importlib.util.spec_from_file_location(module_name, found)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module  # before running it, as an import does: dataclasses and pickle look it up
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[module_name]
            raise ConfigError(f"importing {found} raised {type(exc).__name__}: {exc}", key=key) from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        classes = [n for n, v in vars(module).items() if inspect.isclass(v) and issubclass(v, Hook) and v is not Hook]
        close = difflib.get_close_matches(class_name, classes, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"hook classes in it: {', '.join(classes) or 'none'}"
        raise ConfigError(f"{file} has no class {class_name!r}; {hint}", key=key)
    if not (inspect.isclass(cls) and issubclass(cls, Hook)):
        raise ConfigError(f"{file}:{class_name} is not a subclass of largebatch.engine.hook.Hook; subclass Hook", key=key)
    if cls is Hook:
        raise ConfigError(f"{file}:{class_name} is the Hook base class itself; name your subclass of it", key=key)
    return cls


def instantiate(cls: type[Hook], kwargs: dict[str, Any], key: str) -> Hook:
    """``cls(**kwargs)`` with bad arguments reported as a ``ConfigError``."""
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:
        accepted = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
        raise ConfigError(f"{cls.__name__} arguments: {exc}; it takes {', '.join(accepted) or 'none'}", key=key) from exc
    if "priority" in kwargs:
        try:
            parse_priority(kwargs["priority"])
        except ValueError as exc:
            raise ConfigError(str(exc), key=f"{key}.priority") from exc
    check_call(cls, {k: v for k, v in kwargs.items() if k != "priority"}, key)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:  # the hook rejected a value: still the config's mistake
        raise ConfigError(f"{cls.__name__}: {exc}", key=key) from exc
    except Exception as exc:  # any other failure of its constructor: one line naming the entry (traceback with --debug)
        raise ConfigError(f"{cls.__name__}() raised {type(exc).__name__}: {exc}", key=key) from exc


def build_hooks(cfg: dict[str, Any], config_path: pathlib.Path | None = None) -> list[Hook]:
    """The run's hooks: the defaults (with any arguments the config gives them), the
    clipping hook when ``clip_grad_norm`` is set, then the config's other hooks in order."""
    specs: list[tuple[str, dict[str, Any], str]] = []
    for i, entry in enumerate(cfg["hooks"]):
        key = f"hooks[{i}]"
        if isinstance(entry, str):
            specs.append((entry, {}, key))
        else:
            specs.append((entry["type"], {k: v for k, v in entry.items() if k != "type"}, key))
    defaults: dict[str, tuple[dict[str, Any], str]] = {name: ({}, f"hooks ({name}, a default)") for name in DEFAULT_HOOKS}
    defaults["checkpoint"] = (dict(cfg["checkpoint"]), "checkpoint")
    defaults["logger"] = ({"console": cfg["log"]["console"]}, "log")
    extra = []
    for type_name, kwargs, key in specs:
        if type_name in defaults:
            defaults[type_name] = ({**defaults[type_name][0], **kwargs}, key)
        else:
            extra.append((type_name, kwargs, key))
    hooks = [instantiate(_builtin_class(name), kwargs, key) for name, (kwargs, key) in defaults.items()]
    if cfg["clip_grad_norm"]:
        hooks.append(_builtin_class("clip_grad_norm")(cfg["clip_grad_norm"]))
    for type_name, kwargs, key in extra:
        hooks.append(instantiate(load_hook_class(type_name, key, config_path), kwargs, key))
    return hooks
