"""Habana's FusedLamb (``habana_frameworks.torch.hpex.optimizers.FusedLamb``) on a Gaudi.

Unlike the other kernels it is a whole optimizer with its own state, which replaces
``Lamb`` where ``largebatch.optim.lamb.choose`` picks it (the HPU backend asks, with
``hpu.fused_optimizer`` on), set up as the paper's LAMB; settings it cannot reproduce are
refused. It has never run on a Gaudi: it is tested against a recording stand-in for
Habana's packages (``tests/backends/fake_habana``).
"""

from __future__ import annotations

import torch

from largebatch.config.frozen import thaw
from largebatch.config.sections import OptimizerConfig
from largebatch.errors import UserError
from largebatch.optim import sharded
from largebatch.optim.lamb_update import Kernel, Tensors

# LAMB settings of ``optimizer`` that Habana's FusedLamb can reproduce, by our name.
_SAME = ("betas", "eps", "bias_correction")  # besides lr and weight_decay
# Defaults of largebatch's Lamb that FusedLamb cannot change; any other value is refused.
_FIXED = {"decoupled_weight_decay": False, "adapt": True, "max_trust_ratio": None, "min_trust_ratio": None, "adam": False}


class FusedLamb(Kernel):
    """``fused_class``, Habana's, for parameters of which none is sharded (its kernels see
    whole tensors: FSDP2's slices take ``Lamb``'s sharded step)."""

    def __init__(self, fused_class: type) -> None:
        self.fused_class = fused_class

    def applies(self, tensors: Tensors) -> bool:
        return not any(sharded.is_sharded(p) for p in tensors[0])

    def optimizer(self, section: OptimizerConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
        """FusedLamb over the config's parameter groups: ``adam_w_mode=True`` is the paper's
        ``u = r + wd * x``; ``use_lamb=True`` adapts groups without weight decay too, as Lamb
        does by default (``optimizer.no_decay_adapt=False`` maps to ``use_lamb=False``);
        ``max_grad_norm=None`` leaves clipping to the backend, once per step.

        Raises:
            UserError: an ``optimizer`` setting FusedLamb cannot reproduce.
        """
        from largebatch.optim.param_groups import section_param_groups

        extra = thaw(section.extra)  # Lamb's own arguments
        for key, default in _FIXED.items():
            if key in extra and extra[key] != default:
                raise UserError(
                    f"Habana's FusedLamb cannot reproduce optimizer.{key}={extra[key]!r}; "
                    f"set hpu.fused_optimizer=False to use largebatch's Lamb",
                    key=f"optimizer.{key}",
                )
        kwargs = {"lr": section.lr, "weight_decay": section.weight_decay, "max_grad_norm": extra.get("max_grad_norm")}
        kwargs.update((key, tuple(extra[key]) if key == "betas" else extra[key]) for key in _SAME if key in extra)
        groups = section_param_groups(section, model)

        class LargebatchFusedLamb(self.fused_class):  # type: ignore[name-defined]
            # Some FusedLamb releases define zero_grad() without set_to_none; the engine passes it.
            def zero_grad(self, set_to_none: bool = True) -> None:
                for group in self.param_groups:
                    for param in group["params"]:
                        if set_to_none:
                            param.grad = None
                        elif param.grad is not None:
                            param.grad.detach_().zero_()

        use_lamb = bool(extra.get("no_decay_adapt", True))  # Lamb's default
        return LargebatchFusedLamb(groups, adam_w_mode=True, use_lamb=use_lamb, **kwargs)
