"""Habana's FusedLamb (``habana_frameworks.torch.hpex.optimizers.FusedLamb``) on a Gaudi.

It is not one of LAMB's kernels (``largebatch.optim.lamb.choose``) but a whole optimizer
with its own state, which replaces ``Lamb``: the HPU backend supplies the class
(``Backend.fused_lamb``, with ``hpu.fused_optimizer`` on) and ``largebatch.optim.build_optimizer``
sets it up here as the paper's LAMB, for parameters of which none is sharded (its kernels see
whole tensors: FSDP2's slices take ``Lamb``'s sharded step); settings it cannot reproduce are
refused. It has never run on a Gaudi: it is tested against a recording stand-in for
Habana's packages (``tests/backends/fake_habana``).
"""

from __future__ import annotations

import torch

from largebatch import dtensors
from largebatch.config.frozen import thaw
from largebatch.config.sections import OptimizerConfig
from largebatch.errors import UserError

# LAMB settings of ``optimizer`` that Habana's FusedLamb can reproduce, by our name.
_SAME = ("betas", "eps", "bias_correction")  # besides lr and weight_decay
# Defaults of largebatch's Lamb that FusedLamb cannot change; any other value is refused.
_FIXED = {"decoupled_weight_decay": False, "adapt": True, "max_trust_ratio": None, "min_trust_ratio": None, "adam": False}


def applies(model: torch.nn.Module) -> bool:
    """Whether FusedLamb can take ``model``'s parameters: none of them is sharded."""
    return not any(dtensors.is_sharded(p) for p in model.parameters())


def fused_lamb_optimizer(
    fused_class: type[torch.optim.Optimizer], section: OptimizerConfig, model: torch.nn.Module
) -> torch.optim.Optimizer:
    """FusedLamb over the config's parameter groups: ``adam_w_mode=True`` is the paper's
    ``u = r + wd * x``; ``use_lamb=True`` adapts groups without weight decay too, as Lamb
    does by default (``optimizer.no_decay_adapt=False`` maps to ``use_lamb=False``);
    ``max_grad_norm=None`` leaves clipping to the backend, once per step.

    Args:
        fused_class: Habana's ``FusedLamb`` (``Backend.fused_lamb``).
        section: the ``optimizer`` section (``type='lamb'``).
        model: the model, none of its parameters sharded (``applies``).

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

    class LargebatchFusedLamb(fused_class):  # type: ignore[valid-type,misc]
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
