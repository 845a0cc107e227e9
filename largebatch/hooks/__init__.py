"""Built-in hooks by name, and custom hooks loaded from a file by path.

In a config::

    hooks = [
        'logger',                                              # a built-in, defaults
        dict(type='checkpoint', interval_steps=500),           # a built-in, with arguments
        dict(type='hooks/grad_stats.py:GradStatsHook', interval=50),  # a file of yours
    ]

Default hooks (``DEFAULT_HOOKS``) always run; listing one by name replaces its
arguments. A path is read relative to the working directory, then to the config file's
folder and its parents; ``'package.module:Class'`` names a hook in an importable module.

Clipping and the non-finite check are not hooks: every update does them inline
(``largebatch.engine.update``), set by ``clip_grad_norm`` and the ``nan_guard`` section.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from largebatch.config.classes import check_arguments, construct, load_class
from largebatch.config.frozen import thaw
from largebatch.config.schema import check_argument
from largebatch.config.sections import CheckpointConfig, EmaConfig, LogConfig
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
    "logger": "largebatch.hooks.logger:MetricsLogger",
    "progress": "largebatch.hooks.progress:ProgressBar",
    "csv": "largebatch.hooks.csv_sink:CsvSink",
    "tensorboard": "largebatch.hooks.tensorboard:TensorBoardSink",
    "mlflow": "largebatch.hooks.trackers:MlflowHook",
    "wandb": "largebatch.hooks.trackers:WandbHook",
    "checkpoint": "largebatch.hooks.checkpoint:CheckpointHook",
    "eval": "largebatch.hooks.eval:EvalHook",
    "stop": "largebatch.hooks.stop:StopHook",
    "hook_timer": "largebatch.hooks.hook_timer:HookTimerHook",
    "ema": "largebatch.hooks.ema:ModelEmaHook",
    "preemption": "largebatch.hooks.preemption:PreemptionHook",
}
DEFAULT_HOOKS = ("loss", "lr", "throughput", "grad_norm", "logger", "checkpoint", "preemption")


def _builtin_class(name: str) -> type[Hook]:
    return load_hook_class(name, f"hooks ({name})")


def load_hook_class(spec: str, key: str, config_path: pathlib.Path | None = None) -> type[Hook]:
    """The class a hook ``type`` names: a built-in name, ``'path/file.py:Class'`` or
    ``'package.module:Class'`` (``largebatch.config.classes``).

    Raises:
        ConfigError: unknown name, missing file, module or class, a class that is not a ``Hook``.
    """
    return load_class(spec, key=key, kind="hook", base=Hook, builtins=BUILTIN_HOOKS, config_path=config_path)


def instantiate(cls: type[Hook], kwargs: dict[str, Any], key: str) -> Hook:
    """``cls(**kwargs)`` with bad arguments reported as a ``ConfigError``: each value is
    checked against the class's signature, and a built-in hook's against its
    ``argument_checks`` (the config key it mirrors, ``checkpoint.keep``, or a schema
    ``Field``), so ``hooks=[dict(type='checkpoint', keep=-1)]`` is refused as
    ``checkpoint.keep=-1`` is."""
    check_arguments(cls, kwargs, key, untyped=("priority",))
    for name, rule in getattr(cls, "argument_checks", {}).items():
        if name in kwargs:
            check_argument(rule, kwargs[name], f"{key}.{name}")
    if "priority" in kwargs:
        try:
            parse_priority(kwargs["priority"])
        except ValueError as exc:
            raise ConfigError(str(exc), key=f"{key}.priority") from exc
    return construct(cls, kwargs, key)


@dataclasses.dataclass(frozen=True)
class HookEntry:
    """One entry of the config's ``hooks`` list, read.

    Attributes:
        type: a built-in name, ``'path/file.py:Class'`` or ``'package.module:Class'``.
        arguments: the hook's keyword arguments, as plain values (lists, dicts).
        key: where it stands, for error lines (``hooks[2]``).
    """

    type: str
    arguments: Mapping[str, Any]
    key: str

    @classmethod
    def read(cls, entries: Sequence[str | Mapping[str, Any]]) -> list[HookEntry]:
        """The config's entries (``'logger'`` or ``dict(type='logger', **arguments)``, as
        validated) in order."""
        read = []
        for i, entry in enumerate(entries):
            key = f"hooks[{i}]"
            if isinstance(entry, str):
                read.append(cls(entry, {}, key))
            else:
                read.append(cls(entry["type"], {k: thaw(v) for k, v in entry.items() if k != "type"}, key))
        return read


def build_hooks(
    entries: Sequence[str | Mapping[str, Any]],
    *,
    checkpoint: CheckpointConfig,
    log: LogConfig,
    ema: EmaConfig,
    config_path: pathlib.Path | None = None,
) -> list[Hook]:
    """The run's hooks: the defaults (with any arguments the config gives them), the
    ``ema`` hook when ``ema.decay`` is set, then the config's other hooks in order.

    Args:
        entries: the config's ``hooks`` (``cfg.hooks``).
        checkpoint, log, ema: the config's sections that set the ``checkpoint``, ``logger``
            and ``ema`` hooks' arguments (an entry's arguments win).
        config_path: the config file (a hook file's path may be relative to its folders).

    Raises:
        ConfigError: an entry that cannot be built (naming ``hooks[i]``).
    """
    defaults: dict[str, tuple[dict[str, Any], str]] = {name: ({}, f"hooks ({name}, a default)") for name in DEFAULT_HOOKS}
    # every field of the section is one of the hook's arguments (a field added to the schema reaches it)
    defaults["checkpoint"] = ({f.name: getattr(checkpoint, f.name) for f in dataclasses.fields(checkpoint)}, "checkpoint")
    defaults["logger"] = ({"console": log.console}, "log")
    ema_args = None if ema.decay is None else ({"decay": ema.decay, "warmup": ema.warmup, "evaluate": ema.eval}, "ema")
    extra = []
    for entry in HookEntry.read(entries):
        if entry.type in defaults:
            defaults[entry.type] = ({**defaults[entry.type][0], **entry.arguments}, entry.key)
        elif entry.type == "ema" and ema_args is not None:  # one EMA: the section's, with the entry's arguments
            ema_args = ({**ema_args[0], **entry.arguments}, entry.key)
        else:
            extra.append(entry)
    hooks = [instantiate(_builtin_class(name), kwargs, key) for name, (kwargs, key) in defaults.items()]
    if ema_args is not None:
        hooks.append(instantiate(_builtin_class("ema"), *ema_args))
    for entry in extra:
        hooks.append(instantiate(load_hook_class(entry.type, entry.key, config_path), dict(entry.arguments), entry.key))
    return hooks
