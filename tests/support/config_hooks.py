"""The hooks a typed config asks for, built as ``largebatch.launch`` builds them."""

from __future__ import annotations

from largebatch.config.sections import Config
from largebatch.engine.hook import Hook
from largebatch.hooks import build_hooks


def config_hooks(cfg: Config) -> list[Hook]:
    return build_hooks(cfg.hooks, checkpoint=cfg.checkpoint, log=cfg.log, ema=cfg.ema)
