"""Parameter groups: weight-decay exclusion and layer-wise learning-rate decay.

Weight decay is not applied to biases, normalisation weights, position embeddings and
class tokens: the usual practice for ViTs (timm's ``param_groups_weight_decay``, which
excludes every tensor with ``ndim <= 1`` plus ``model.no_weight_decay()``; You et al.
2019 exclude LayerNorm and bias from decay for BERT in the same way).

Layer-wise learning-rate decay follows BEiT (Bao et al., arXiv:2106.08254) and MAE
fine-tuning (He et al., arXiv:2111.06377), as in timm's ``param_groups_layer_decay``:
for a ViT of depth ``D``, ``patch_embed`` / ``cls_token`` / ``pos_embed`` are layer 0,
``blocks.i`` is layer ``i + 1`` and everything after the blocks (``norm``, ``head``) is
layer ``D + 1``; a group's ``lr_scale`` is ``layer_decay ** (D + 1 - layer_id)``. The
learning-rate schedule sets ``group['lr'] = lr * group.get('lr_scale', 1.0)``.

Patterns are shell-style globs (``fnmatch.fnmatchcase``) matched against the full
parameter name from ``model.named_parameters()``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from largebatch.config.schema import DEFAULT_NO_WEIGHT_DECAY
from largebatch.config.sections import OptimizerConfig
from largebatch.errors import UserError

_EMBEDDING_PREFIXES = ("patch_embed", "cls_token", "pos_embed", "reg_token", "dist_token")
_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def vit_layer_id(name: str, depth: int) -> int:
    """Layer index of a timm ViT parameter for layer-wise learning-rate decay.

    Args:
        name: the parameter name, e.g. ``blocks.3.attn.qkv.weight``.
        depth: the number of transformer blocks.

    Returns:
        0 for the embeddings, ``i + 1`` for ``blocks.i``, ``depth + 1`` for the rest.
    """
    if name.split(".")[0] in _EMBEDDING_PREFIXES:
        return 0
    match = _BLOCK.match(name)
    if match:
        return int(match.group(1)) + 1
    return depth + 1


def build_param_groups(
    model: nn.Module,
    *,
    weight_decay: float,
    no_weight_decay: Sequence[str] = DEFAULT_NO_WEIGHT_DECAY,
    exclude_1d: bool = True,
    use_model_no_weight_decay: bool = True,
    layer_decay: float | None = None,
    layer_id: Callable[[str], int] | None = None,
    num_layers: int | None = None,
) -> list[dict[str, Any]]:
    """Split a model's trainable parameters into optimizer groups.

    Args:
        model: the model; frozen parameters (``requires_grad=False``) are left out.
        weight_decay: decay for the decayed group; excluded tensors get 0.
        no_weight_decay: glob patterns (``fnmatch``) of names excluded from decay.
        exclude_1d: also exclude every tensor with ``ndim <= 1`` (biases, norm scales).
        use_model_no_weight_decay: also exclude the names returned by
            ``model.no_weight_decay()`` when the model has it (timm models do).
        layer_decay: layer-wise learning-rate decay factor in (0, 1], or ``None`` for
            none (every group gets ``lr_scale`` 1.0).
        layer_id: maps a parameter name to its layer; defaults to ``vit_layer_id`` with
            ``len(model.blocks)`` as the depth.
        num_layers: the largest layer id; defaults to ``len(model.blocks) + 1``.

    Returns:
        Groups with keys ``params``, ``param_names``, ``weight_decay``, ``lr_scale`` and
        ``name`` (``decay`` / ``no_decay``, prefixed ``layer<i>_`` with layer decay), in
        order of first appearance; empty groups are omitted.

    Raises:
        UserError: a bad ``weight_decay``, ``no_weight_decay`` pattern or
            ``layer_decay``, or layer decay on a model without ``blocks``.
    """
    _check_decay_options(weight_decay, no_weight_decay)
    use_model_names = use_model_no_weight_decay and hasattr(model, "no_weight_decay")
    excluded_names = set(model.no_weight_decay()) if use_model_names else set()
    layer_of = _layer_function(model, layer_decay, layer_id, num_layers)

    groups: dict[str, dict[str, Any]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        excluded = (
            (exclude_1d and param.ndim <= 1)
            or name in excluded_names
            or any(fnmatch.fnmatchcase(name, pattern) for pattern in no_weight_decay)
        )
        key = "no_decay" if excluded else "decay"
        lr_scale = 1.0
        if layer_of is not None:
            layer, scale = layer_of(name)
            key, lr_scale = f"layer{layer}_{key}", scale
        group = groups.get(key)
        if group is None:
            group = groups[key] = _new_group(key, 0.0 if excluded else float(weight_decay), lr_scale)
        group["params"].append(param)
        group["param_names"].append(name)
    return list(groups.values())


def section_param_groups(section: OptimizerConfig, model: nn.Module) -> list[dict[str, Any]]:
    """``build_param_groups`` with the ``optimizer`` section's settings."""
    return build_param_groups(
        model,
        weight_decay=section.weight_decay,
        no_weight_decay=list(section.no_weight_decay),
        exclude_1d=section.exclude_1d,
        layer_decay=section.layer_decay,
    )


def _check_decay_options(weight_decay: float, no_weight_decay: Sequence[str]) -> None:
    if isinstance(weight_decay, bool) or not isinstance(weight_decay, (int, float)) or weight_decay < 0:
        raise UserError(f"weight_decay must be a number >= 0, got {weight_decay!r}")
    if isinstance(no_weight_decay, str):
        raise UserError(f"no_weight_decay must be a list of glob patterns, got the string {no_weight_decay!r}; write [{no_weight_decay!r}]")
    for pattern in no_weight_decay:
        if not isinstance(pattern, str) or not pattern:
            raise UserError(f"no_weight_decay patterns must be non-empty glob strings (fnmatch), got {pattern!r}")


def _new_group(key: str, weight_decay: float, lr_scale: float) -> dict[str, Any]:
    return {"params": [], "param_names": [], "weight_decay": weight_decay, "lr_scale": lr_scale, "name": key}


def _layer_function(
    model: nn.Module,
    layer_decay: float | None,
    layer_id: Callable[[str], int] | None,
    num_layers: int | None,
) -> Callable[[str], tuple[int, float]] | None:
    """``name -> (layer, lr_scale)`` for layer decay, or None without it."""
    if layer_decay is None:
        return None
    if isinstance(layer_decay, bool) or not isinstance(layer_decay, (int, float)) or not 0 < layer_decay <= 1:
        raise UserError(f"layer_decay must be in (0, 1] or None, got {layer_decay!r}")
    if layer_id is None or num_layers is None:
        blocks = getattr(model, "blocks", None)
        if blocks is None:
            raise UserError(
                f"layer_decay={layer_decay} needs a timm-style ViT with `blocks`, but "
                f"{type(model).__name__} has none; pass layer_id and num_layers, or set "
                "layer_decay to None"
            )
        depth = len(blocks)
        layer_id = layer_id or (lambda name: vit_layer_id(name, depth))
        num_layers = depth + 1 if num_layers is None else num_layers

    def layer_of(name: str) -> tuple[int, float]:
        layer = layer_id(name)
        return layer, float(layer_decay) ** (num_layers - layer)

    return layer_of
