"""Write a largebatch config from a Colossal-AI config: read, map, override, render, check
that it loads."""

from __future__ import annotations

import pathlib
import tempfile
from collections.abc import Sequence

from largebatch.config.loader import apply_override
from largebatch.errors import ConfigError, UserError
from largebatch.importers.colossalai.builder import Builder
from largebatch.importers.colossalai.mapping import map_colossalai
from largebatch.importers.colossalai.reader import ColossalConfig, read_colossalai_config
from largebatch.importers.colossalai.render import render
from largebatch.importers.colossalai.script import read_train_script

__all__ = ["import_colossalai"]

# Keys a config cannot do without, and how to give each when the source does not.
NEEDED = {
    "epochs": "no NUM_EPOCHS in the config: --set epochs=N",
    "global_batch_size": "no BATCH_SIZE in the config: --set global_batch_size=N",
    "micro_batch_size": "no BATCH_SIZE in the config: --set micro_batch_size=N",
    "model.name": "not found: the model is built in the train script; give --train-script, or --set model.name=NAME (a timm model)",
    "optimizer.lr": "not found in the config or the train script, or known only when the script runs; give --train-script, or "
    "--set optimizer.lr=X",
}


def _override(b: Builder, override: str) -> None:
    key = override.partition("=")[0].strip()
    apply_override(b.config, override)
    b.set(key, b.get(key), f"--set {override}")


def _check_loads(text: str, cfg: ColossalConfig, world_size: int | None) -> None:
    from largebatch.config import derive, resolve_config

    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "imported.py"
        path.write_text(text)
        try:
            resolved = resolve_config(path)
            if world_size is not None:
                derive(resolved, world_size, resolved.data.train_samples)
        except UserError as exc:
            where = f"{exc.key}: " if exc.key else ""
            raise ConfigError(
                f"the config it would write does not load ({where}{exc.message}); correct it with --set", path=str(cfg.path)
            ) from exc


def import_colossalai(
    config: str | pathlib.Path,
    train_script: str | pathlib.Path | None = None,
    world_size: int | None = None,
    overrides: Sequence[str] = (),
    out: str | None = None,
) -> str:
    """The text of a largebatch config written from a Colossal-AI config.

    Args:
        config: the Colossal-AI config file (``colossalai`` need not be installed).
        train_script: its train script, read for the optimizer, the schedule, the model
            and the loss (never run).
        world_size: the number of devices the config ran on (the global batch needs it
            unless ``parallel.data`` or ``TOTAL_BATCH_SIZE`` gives it).
        overrides: ``key.path=value`` strings applied to the result, as ``--set``.
        out: the file it will be written to, named in its header's check command.

    Raises:
        ConfigError: a file is missing or unreadable, the world size is needed, a key
            the config needs is not in the source, or the result does not validate.
    """
    cfg = read_colossalai_config(config)
    script = read_train_script(train_script, cfg) if train_script is not None else None
    if world_size is not None and world_size < 1:
        raise ConfigError(f"got {world_size}; give the number of devices, at least 1", key="--world-size")
    b, world = map_colossalai(cfg, script, world_size)
    for override in overrides:
        _override(b, override)
    missing = [f"{key} ({how})" for key, how in NEEDED.items() if not b.has(key)]
    if missing:
        raise ConfigError(f"the config it would write lacks {'; '.join(missing)}", path=str(cfg.path))
    stood_in = f" (imports colossalai at line {cfg.colossalai_imports[0]}: stood in for while read)" if cfg.colossalai_imports else ""
    sources = [("config", f"{cfg.path}{stood_in}"), ("train script", str(script.path) if script else "none given (--train-script)")]
    if world is not None:
        sources.append(("world size", f"{world} devices"))
    check = f"largebatch config show {out or 'FILE'}" + (f" --world-size {world}" if world else "")
    text = render(b, sources, check)
    _check_loads(text, cfg, world)
    return text
