"""Model EMA: an exponential moving average of the weights (the DeiT recipe's), kept by
timm's ``ModelEmaV3``.

Added by ``build_hooks`` when the config's ``ema.decay`` is set. In ``before_run`` it
copies the model (on every rank: each rank averages the same weights, so the averages
stay identical without communication) and registers the copy as
``state.extra_models['ema']``: evaluation then reports ``eval_ema/...`` beside
``eval/...`` (unless ``ema.eval`` is off) and the end of the run writes
``model_ema.safetensors``. After every optimizer step that was taken (not one a hook
skipped, ``state.current.skipped``) it updates the average with ``step`` = the optimizer steps
completed, the count timm's training script passes: the first update copies the
weights, later ones use ``ema.decay`` (or, with ``ema.warmup``, timm's ramp
``1 - step^(-2/3)`` capped at ``ema.decay``).

With a ``batch_schedule`` other than fixed, the decay follows samples, not steps: a step
at global batch ``B`` uses ``decay^(B / global_batch_size)`` (the same decay per sample at
every batch), and the warmup's count is the position in steps at the config's global
batch, ``samples_seen / global_batch_size`` (``largebatch.batch_schedule``).

The averaged weights (parameters and buffers) are the hook's checkpoint state, so a
resumed run continues the same average bit for bit. Not available with sharded
parameters (``dist.strategy`` fsdp/hsdp on more than one rank): the run stops at the
start with an ``error:`` line.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from largebatch.engine.hook import Hook, Priority
from largebatch.errors import UserError

NAME = "ema"


class ModelEmaHook(Hook):
    """Keep timm's ``ModelEmaV3`` of the model, updated after each optimizer step.

    Args:
        decay: the decay per optimizer step (0 < decay < 1).
        warmup: timm's ``use_warmup``: ramp the decay up from 0 early in training.
        evaluate: evaluate the average beside the model (``eval_ema/...``).
    """

    priority = Priority.NORMAL
    argument_checks: ClassVar[dict[str, str]] = {"decay": "ema.decay", "warmup": "ema.warmup", "evaluate": "ema.eval"}

    def __init__(self, decay: float, warmup: bool = False, evaluate: bool = True, priority: int | str | None = None) -> None:
        super().__init__(priority)
        if not 0 < float(decay) < 1:
            raise UserError(f"ema decay must be in (0, 1), got {decay!r}")
        self.decay = float(decay)
        self.warmup = bool(warmup)
        self.evaluate = bool(evaluate)
        self.ema: Any = None  # timm's ModelEmaV3, built in before_run
        self._loaded: dict[str, Any] | None = None

    def before_run(self, state) -> None:
        from timm.utils import ModelEmaV3

        if state.run.sharded:
            raise UserError(
                f"model EMA (ema.decay) is not available with sharded parameters yet (dist.strategy "
                f"{state.run.config.dist.strategy!r}); use dist.strategy 'ddp' or set ema.decay to null"
            )
        self.ema = ModelEmaV3(state.run.model, decay=self.decay, use_warmup=self.warmup)
        if self._loaded is not None:
            self._restore(self._loaded)
            self._loaded = None
        state.register_model(NAME, self.ema.module, evaluate=self.evaluate)

    def after_optimizer_step(self, state) -> None:
        if state.current.skipped:
            return
        schedule = state.run.batch.schedule
        if schedule.fixed:
            self.ema.update(state.run.model, step=state.step + 1)  # optimizer steps completed, this one included
            return
        position = schedule.position(state.samples_seen, state.step + 1)
        decay = self.ema.get_decay(position) ** (state.current.global_batch / schedule.reference_batch)
        with torch.no_grad():
            if self.ema.exclude_buffers:
                self.ema.apply_update_no_buffers_(state.run.model, decay)
            else:
                self.ema.apply_update_(state.run.model, decay)

    def state_dict(self) -> dict[str, Any]:
        if self.ema is None:
            return dict(self._loaded or {})
        return {
            "weights": {k: v.detach().clone() for k, v in self.ema.module.state_dict().items()},
            "rounding_generator": generator.get_state() if (generator := _rounding_generator(self.ema)) is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        if self.ema is None:  # a resume loads checkpoints before before_run builds the average
            self._loaded = dict(state)
        else:
            self._restore(state)

    def _restore(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            self.ema.module.load_state_dict(state["weights"])
        generator = _rounding_generator(self.ema)
        if generator is not None and state.get("rounding_generator") is not None:
            generator.set_state(state["rounding_generator"])


def _rounding_generator(ema: Any) -> torch.Generator | None:
    """The random generator of the average's stochastic rounding (bfloat16 weights), which a
    resume must carry on from; timm keeps it private (``_sr_generator``), and a
    timm without it rounds without one."""
    generator = getattr(ema, "_sr_generator", None)
    return generator if isinstance(generator, torch.Generator) else None
