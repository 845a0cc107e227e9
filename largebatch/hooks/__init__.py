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

import pathlib
from typing import Any

from largebatch.config.classes import check_arguments, construct, load_class
from largebatch.config.frozen import thaw
from largebatch.config.schema import check_argument
from largebatch.config.sections import Config
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


def build_hooks(cfg: Config, config_path: pathlib.Path | None = None) -> list[Hook]:
    """The run's hooks: the defaults (with any arguments the config gives them), the
    ``ema`` hook when ``ema.decay`` is set, then the config's other hooks in order.

    Raises:
        ConfigError: an entry that cannot be built (naming ``hooks[i]``).
    """
    specs: list[tuple[str, dict[str, Any], str]] = []
    for i, entry in enumerate(thaw(cfg.hooks)):
        key = f"hooks[{i}]"
        if isinstance(entry, str):
            specs.append((entry, {}, key))
        else:
            specs.append((entry["type"], {k: v for k, v in entry.items() if k != "type"}, key))
    defaults: dict[str, tuple[dict[str, Any], str]] = {name: ({}, f"hooks ({name}, a default)") for name in DEFAULT_HOOKS}
    defaults["checkpoint"] = (cfg.checkpoint.to_dict(), "checkpoint")
    defaults["logger"] = ({"console": cfg.log.console}, "log")
    ema = cfg.ema
    ema_args = None if ema.decay is None else ({"decay": ema.decay, "warmup": ema.warmup, "evaluate": ema.eval}, "ema")
    extra = []
    for type_name, kwargs, key in specs:
        if type_name in defaults:
            defaults[type_name] = ({**defaults[type_name][0], **kwargs}, key)
        elif type_name == "ema" and ema_args is not None:  # one EMA: the section's, with the entry's arguments
            ema_args = ({**ema_args[0], **kwargs}, key)
        else:
            extra.append((type_name, kwargs, key))
    hooks = [instantiate(_builtin_class(name), kwargs, key) for name, (kwargs, key) in defaults.items()]
    if ema_args is not None:
        hooks.append(instantiate(_builtin_class("ema"), *ema_args))
    for type_name, kwargs, key in extra:
        hooks.append(instantiate(load_hook_class(type_name, key, config_path), kwargs, key))
    return hooks
