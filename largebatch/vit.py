"""timm's Vision Transformer sizes by name, and their parameter counts, without importing timm.

``largebatch config show`` needs a model's parameter count for its memory estimate, and
checking a config needs the keywords the model takes. For the names in ``NAMED_SIZES``
(the ViT sizes of Dosovitskiy et al. 2021 and Zhai et al. 2022 as
``timm.models.vision_transformer`` registers them) both are known without importing timm,
which takes seconds: the keywords and the defaults are timm's ``VisionTransformer``
signature as recorded in ``largebatch.signatures``, used only while the installed timm is
the recorded version, and ``parameter_counts`` writes the model's parameters out from
its architecture (``largebatch.footprint`` falls back to building the model on the meta
device for every other model).

The count covers the keywords in ``SHAPE_KEYWORDS`` (the architecture) and
``NEUTRAL_KEYWORDS`` (dropout rates and initialisation, which leave the count as it is),
with values timm builds without complaint. Any other keyword or value, a NaFlexViT build
(``TIMM_USE_NAFLEXVIT``) or a timm version other than the recorded one is not counted
here: the caller builds the model instead, so a count is never guessed and a value timm
rejects is reported by timm. ``tests/test_vit.py`` compares both ways of counting for
every shipped config and for every keyword covered here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from largebatch import signatures

# Each name's architecture: the arguments its entry point in the recorded timm passes to
# VisionTransformer (a test reads them there). Everything else is the constructor's default.
NAMED_SIZES: dict[str, dict[str, Any]] = {
    "vit_tiny_patch16_224": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
    "vit_small_patch16_224": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "vit_small_patch32_224": dict(patch_size=32, embed_dim=384, depth=12, num_heads=6),
    "vit_base_patch16_224": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
    "vit_base_patch32_224": dict(patch_size=32, embed_dim=768, depth=12, num_heads=12),
    "vit_large_patch16_224": dict(patch_size=16, embed_dim=1024, depth=24, num_heads=16),
    "vit_large_patch32_224": dict(patch_size=32, embed_dim=1024, depth=24, num_heads=16),
    "vit_huge_patch14_224": dict(patch_size=14, embed_dim=1280, depth=32, num_heads=16),
    "vit_giant_patch14_224": dict(patch_size=14, embed_dim=1408, mlp_ratio=48 / 11, depth=40, num_heads=16),
}

POOLS = ("", "avg", "avgmax", "max", "token")  # "map" and "prr" add an attention pool: not counted here
WEIGHT_INITS = ("skip", "reset", "jax", "jax_nlhb", "moco", "")


Check = Callable[[Any], bool]


def _int(low: int) -> Check:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _number(low: float, high: float | None = None, *, high_open: bool = False) -> Check:
    def check(v: Any) -> bool:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < low:
            return False
        return high is None or (v < high if high_open else v <= high)

    return check


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _optional(check: Check) -> Check:
    return lambda v: v is None or check(v)


def _one_of(*choices: str) -> Check:
    return lambda v: isinstance(v, str) and v in choices


# The values each keyword may take here: what timm builds without complaint.
SHAPE_KEYWORDS: dict[str, Check] = {
    "img_size": _int(1),
    "patch_size": _int(1),
    "in_chans": _int(1),
    "num_classes": _int(1),
    "embed_dim": _int(1),
    "depth": _int(1),
    "num_heads": _int(1),
    "mlp_ratio": _number(0.0),
    "qkv_bias": _bool,
    "qk_norm": _bool,
    "proj_bias": _bool,
    "init_values": _optional(_number(-math.inf)),
    "class_token": _bool,
    "pos_embed": _one_of("", "none", "learn"),
    "no_embed_class": _bool,
    "reg_tokens": _int(0),
    "pre_norm": _bool,
    "final_norm": _bool,
    "fc_norm": _optional(_bool),
    "global_pool": _one_of(*POOLS),
    "scale_attn_norm": _bool,
    "scale_mlp_norm": _bool,
}
NEUTRAL_KEYWORDS: dict[str, Check] = {
    "drop_rate": _number(0.0, 1.0),
    "pos_drop_rate": _number(0.0, 1.0),
    "proj_drop_rate": _number(0.0, 1.0),
    "attn_drop_rate": _number(0.0, 1.0),
    "drop_path_rate": _number(0.0, 1.0),
    "patch_drop_rate": _number(0.0, 1.0, high_open=True),
    "weight_init": _one_of(*WEIGHT_INITS),
    "fix_init": _bool,
}


def recorded(name: str) -> bool:
    """Whether ``name`` is one of ``NAMED_SIZES`` and the installed timm is the one
    ``largebatch.signatures`` was recorded from (so its keywords are known without timm)."""
    return name in NAMED_SIZES and signatures.TIMM.matches_installed()


def architecture(name: str, kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``VisionTransformer`` arguments of ``timm.create_model(name, **kwargs)``
    (``SHAPE_KEYWORDS``), or None when this module does not certainly know the model timm
    would build (see the module's docstring)."""
    if not recorded(name) or os.environ.get("TIMM_USE_NAFLEXVIT", "false").lower() == "true":
        return None
    rules = {**SHAPE_KEYWORDS, **NEUTRAL_KEYWORDS}
    if any(key not in rules for key in kwargs):
        return None
    model = signatures.VISION_TRANSFORMER
    defaults = {name: model.default(name) for name in model.names() if name in SHAPE_KEYWORDS}
    args = {**defaults, **NAMED_SIZES[name], **kwargs}
    if not all(rules[key](value) for key, value in args.items()):
        return None
    if (
        args["embed_dim"] % args["num_heads"]
        or args["patch_size"] > args["img_size"]
        or int(args["embed_dim"] * args["mlp_ratio"]) < 1
        or (args["global_pool"] == "token" and not args["class_token"])
    ):
        return None  # timm refuses these (an assertion) or builds what is not counted here
    return {key: args[key] for key in SHAPE_KEYWORDS}


def parameter_counts(name: str, kwargs: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """``(parameters, one block's parameters, parameters outside the blocks)`` of
    ``timm.create_model(name, **kwargs)``, or None when ``architecture`` does not know it.

    Every LayerNorm has a weight and a bias; the patch embedding is a convolution whose
    bias ``pre_norm`` turns off; ``proj_bias`` is the bias of the attention's output
    projection and of both MLP layers.
    """
    a = architecture(name, kwargs)
    if a is None:
        return None
    width, patch = a["embed_dim"], a["patch_size"]
    hidden = int(width * a["mlp_ratio"])
    norm = 2 * width
    prefix = int(a["class_token"]) + a["reg_tokens"]
    patches = (a["img_size"] // patch) ** 2

    root = a["in_chans"] * patch * patch * width + (0 if a["pre_norm"] else width)  # patch embedding
    root += prefix * width  # class and register tokens
    if a["pos_embed"] not in ("", "none"):
        root += (patches if a["no_embed_class"] else patches + prefix) * width
    root += norm * a["pre_norm"]
    root += norm * a["final_norm"]  # the final norm: before the pool, or after it (fc_norm, global_pool)
    root += width * a["num_classes"] + a["num_classes"]  # the head

    bias = int(a["proj_bias"])
    block = 2 * norm  # norm1, norm2
    block += 3 * width * width + 3 * width * a["qkv_bias"]  # qkv
    block += 2 * 2 * (width // a["num_heads"]) * a["qk_norm"]  # q_norm, k_norm over a head's width
    block += norm * a["scale_attn_norm"]
    block += width * width + width * bias  # the attention's output projection
    block += 2 * width * bool(a["init_values"])  # layer scale, ls1 and ls2
    block += width * hidden + hidden * bias + 2 * hidden * a["scale_mlp_norm"] + hidden * width + width * bias  # MLP
    return root + a["depth"] * block, block, root
