"""Weight-decay exclusion and layer-wise learning-rate decay on timm ViTs."""

from __future__ import annotations

import pytest
import timm
import torch

from largebatch.errors import UserError
from largebatch.optim.param_groups import build_param_groups


def small_vit(depth: int = 2) -> torch.nn.Module:
    return timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=8,
        patch_size=2,
        in_chans=1,
        num_classes=10,
        depth=depth,
        embed_dim=32,
        num_heads=2,
    )


def test_vit_base_exclusion_groups():
    with torch.device("meta"):
        model = timm.create_model("vit_base_patch16_224", pretrained=False)
    groups = {g["name"]: g for g in build_param_groups(model, weight_decay=0.05)}
    assert set(groups) == {"decay", "no_decay"}
    decay, no_decay = groups["decay"], groups["no_decay"]
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    names = dict(model.named_parameters())
    expected_no_decay = {n for n in names if n.endswith(".bias") or "norm" in n} | {
        "pos_embed",
        "cls_token",
    }
    expected_decay = {f"blocks.{i}.{m}.weight" for i in range(12) for m in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")}
    expected_decay |= {"patch_embed.proj.weight", "head.weight"}
    assert set(no_decay["param_names"]) == expected_no_decay
    assert set(decay["param_names"]) == expected_decay
    # 12 blocks x 8 (2 norms x 2, 4 biases) + patch bias, final norm x 2, head bias, pos, cls
    assert len(no_decay["params"]) == 102 and len(decay["params"]) == 50
    assert all(p is names[n] for g in groups.values() for p, n in zip(g["params"], g["param_names"]))
    assert all(names[n].ndim >= 2 for n in decay["param_names"])


def test_patterns_and_1d_switch():
    model = small_vit()
    groups = build_param_groups(
        model,
        weight_decay=0.1,
        no_weight_decay=["head.*"],
        exclude_1d=False,
        use_model_no_weight_decay=False,
    )
    no_decay = next(g for g in groups if g["name"] == "no_decay")
    assert no_decay["param_names"] == ["head.weight", "head.bias"]


def test_layer_decay_scales_small_vit():
    model = small_vit(depth=2)
    groups = build_param_groups(model, weight_decay=0.05, layer_decay=0.5)
    scale = {n: g["lr_scale"] for g in groups for n in g["param_names"]}
    # num_layers = depth + 1 = 3, scale = 0.5 ** (3 - layer_id)
    assert scale["cls_token"] == scale["pos_embed"] == scale["patch_embed.proj.weight"] == 0.125
    assert scale["blocks.0.attn.qkv.weight"] == scale["blocks.0.norm1.bias"] == 0.25
    assert scale["blocks.1.mlp.fc2.weight"] == 0.5
    assert scale["norm.weight"] == scale["head.weight"] == scale["head.bias"] == 1.0
    names = [g["name"] for g in groups]
    assert names == [
        "layer0_no_decay",
        "layer0_decay",
        "layer1_no_decay",
        "layer1_decay",
        "layer2_no_decay",
        "layer2_decay",
        "layer3_no_decay",
        "layer3_decay",
    ]
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_frozen_params_left_out():
    model = small_vit()
    model.patch_embed.requires_grad_(False)
    names = [n for g in build_param_groups(model, weight_decay=0.1) for n in g["param_names"]]
    assert not any(n.startswith("patch_embed") for n in names)


@pytest.mark.parametrize(
    "options,match",
    [
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"weight_decay": 0.1, "no_weight_decay": "*.bias"}, "no_weight_decay"),
        ({"weight_decay": 0.1, "no_weight_decay": ["*.bias", ""]}, "no_weight_decay"),
        ({"weight_decay": 0.1, "layer_decay": 1.5}, "layer_decay"),
    ],
)
def test_bad_values_are_user_errors(options, match):
    with pytest.raises(UserError, match=match):
        build_param_groups(small_vit(), **options)


def test_layer_decay_needs_blocks():
    with pytest.raises(UserError, match="layer_decay"):
        build_param_groups(torch.nn.Linear(2, 2), weight_decay=0.1, layer_decay=0.75)
