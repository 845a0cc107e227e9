"""ViT parameter counts written out (largebatch.vit) against the model timm builds: for
every shipped config, every named size and every keyword the count covers; what it does
not cover is left to the build."""

from __future__ import annotations

import pathlib

import pytest
import timm
import torch

from largebatch import footprint, models, signatures, vit
from largebatch.config import resolve_config
from largebatch.config.arguments import RecordedFrom
from tests.conftest import REPO

SHIPPED = sorted(p for p in (REPO / "configs").rglob("*.py") if "_base_" not in p.parts)
TINY = str(REPO / "configs/demo/vit-tiny-synthetic.py")  # vit_tiny_patch16_224 at 16 px, 2 blocks


def timm_sizes(name: str, kwargs: dict) -> tuple[int, int, int]:
    """``(parameters, one block's, outside the blocks)`` of the model timm builds on the meta device."""
    with torch.device("meta"):
        model = timm.create_model(name, **kwargs)
    per_block = [sum(p.numel() for p in block.parameters()) for block in model.blocks]
    total = sum(p.numel() for p in model.parameters())
    assert len(set(per_block)) == 1
    return total, per_block[0], total - sum(per_block)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_shipped_configs_count_as_timm_builds(path: pathlib.Path):
    cfg = resolve_config(path)
    counted = vit.parameter_counts(cfg.model.name, models.model_kwargs(cfg.model, cfg.data))
    assert counted is not None, f"{path.name}: not counted without timm"
    assert counted == footprint.built_model_sizes(cfg) == footprint.model_sizes(cfg)


@pytest.mark.parametrize("name", sorted(vit.NAMED_SIZES))
def test_named_sizes_are_what_timms_entry_points_pass(name, monkeypatch):
    from timm.models import vision_transformer

    passed = {}

    def record(variant, pretrained=False, **kwargs):
        passed.update(kwargs)

    monkeypatch.setattr(vision_transformer, "_create_vision_transformer", record)
    timm.models.model_entrypoint(name)()
    assert passed == vit.NAMED_SIZES[name]
    assert timm.models.get_pretrained_cfg(name).to_dict().get("global_pool") is None  # it would be a default too


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(vit.NAMED_SIZES))
def test_named_sizes_count_as_timm_builds(name):
    kwargs = {"num_classes": 1000, "img_size": 224, "in_chans": 3}
    assert vit.parameter_counts(name, kwargs) == timm_sizes(name, kwargs)


# Each keyword the count covers, on a small ViT (16 px, 2 blocks) so the builds are quick.
COVERED = [
    {},
    {"depth": 3},
    {"embed_dim": 96, "num_heads": 4},
    {"num_heads": 1},
    {"mlp_ratio": 2.5},
    {"mlp_ratio": 3},
    {"mlp_ratio": 48 / 11},
    {"patch_size": 8},
    {"patch_size": 5},  # 16 px is not a multiple: timm floors the grid
    {"patch_size": 16},
    {"img_size": 24},
    {"in_chans": 1},
    {"num_classes": 3},
    {"qkv_bias": False},
    {"qk_norm": True},
    {"proj_bias": False},
    {"init_values": 1e-5},
    {"init_values": 0.0},
    {"class_token": False, "global_pool": "avg"},
    {"class_token": False, "global_pool": ""},
    {"global_pool": "avgmax"},
    {"global_pool": "max"},
    {"global_pool": "token"},
    {"reg_tokens": 4},
    {"reg_tokens": 4, "no_embed_class": True},
    {"no_embed_class": True},
    {"pos_embed": "none"},
    {"pos_embed": ""},
    {"pre_norm": True},
    {"final_norm": False},
    {"fc_norm": True},
    {"fc_norm": False, "global_pool": "avg"},
    {"fc_norm": True, "final_norm": False},
    {"scale_attn_norm": True},
    {"scale_mlp_norm": True},
    {"drop_rate": 0.1, "pos_drop_rate": 0.1, "proj_drop_rate": 0.1, "attn_drop_rate": 0.1, "drop_path_rate": 0.2},
    {"drop_rate": 1.0, "patch_drop_rate": 0.5},
    *({"weight_init": mode} for mode in vit.WEIGHT_INITS),
    {"fix_init": True},
    {
        "class_token": False,
        "global_pool": "avg",
        "reg_tokens": 2,
        "qkv_bias": False,
        "qk_norm": True,
        "init_values": 0.1,
        "pre_norm": True,
        "scale_attn_norm": True,
        "scale_mlp_norm": True,
        "proj_bias": False,
        "embed_dim": 48,
        "num_heads": 3,
        "mlp_ratio": 1.5,
    },
]


def test_every_covered_keyword_is_compared_with_timm():
    assert set().union(*COVERED) == set(vit.SHAPE_KEYWORDS) | set(vit.NEUTRAL_KEYWORDS)


@pytest.mark.parametrize("changes", COVERED, ids=str)
def test_each_covered_keyword_counts_as_timm_builds(changes):
    kwargs = {"patch_size": 4, "embed_dim": 64, "depth": 2, "num_heads": 2, "num_classes": 10, "img_size": 16, "in_chans": 3, **changes}
    counted = vit.parameter_counts("vit_tiny_patch16_224", kwargs)
    assert counted is not None
    assert counted == timm_sizes("vit_tiny_patch16_224", kwargs)


@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("vit_tiny_patch16_224", {"global_pool": "map"}),  # an attention pool: parameters not counted here
        ("vit_tiny_patch16_224", {"global_pool": "prr"}),
        ("vit_tiny_patch16_224", {"class_token": False}),  # token pooling without the token: timm refuses
        ("vit_tiny_patch16_224", {"embed_dim": 65}),  # not a multiple of 2 heads: timm refuses
        ("vit_tiny_patch16_224", {"patch_size": 32}),  # larger than the 16 px image
        ("vit_tiny_patch16_224", {"patch_size": [4, 4]}),
        ("vit_tiny_patch16_224", {"drop_rate": 1.5}),
        ("vit_tiny_patch16_224", {"patch_drop_rate": 1.0}),
        ("vit_tiny_patch16_224", {"weight_init": "bogus"}),
        ("vit_tiny_patch16_224", {"pos_embed": "sincos"}),
        ("vit_tiny_patch16_224", {"depth": 0}),
        ("vit_tiny_patch16_224", {"depth": 2.0}),
        ("vit_tiny_patch16_224", {"qkv_bias": 1}),
        ("vit_tiny_patch16_224", {"dynamic_img_size": True}),  # a keyword not covered
        ("vit_tiny_patch16_224", {"norm_layer": "rmsnorm"}),
        ("vit_tiny_patch16_224", {"checkpoint_path": "weights.pth"}),
        ("deit_tiny_patch16_224", {}),  # not a named size
        ("vit_tiny_patch16_224.augreg_in21k", {}),
        ("resnet18", {}),
    ],
    ids=str,
)
def test_what_is_not_covered_is_left_to_the_build(name, changes):
    kwargs = {"patch_size": 4, "embed_dim": 64, "depth": 2, "num_heads": 2, "num_classes": 10, "img_size": 16, "in_chans": 3, **changes}
    assert vit.parameter_counts(name, kwargs) is None


def test_a_config_the_count_does_not_cover_is_built(monkeypatch):
    cfg = resolve_config(TINY, ["model.global_pool=map"])
    built = []
    monkeypatch.setattr(footprint, "built_model_sizes", lambda cfg: built.append(cfg) or (1, 1, 1))
    assert footprint.model_sizes(cfg) == (1, 1, 1) and built == [cfg]


def test_another_timm_version_is_read_from_timm(monkeypatch):
    cfg = resolve_config(TINY)
    kwargs = models.model_kwargs(cfg.model, cfg.data)
    assert vit.recorded("vit_tiny_patch16_224")
    monkeypatch.setattr(signatures, "TIMM", RecordedFrom("timm", "0.0.1"))
    assert not vit.recorded("vit_tiny_patch16_224")
    assert vit.parameter_counts("vit_tiny_patch16_224", kwargs) is None
    keywords, signature = models.model_arguments("vit_tiny_patch16_224")
    assert (keywords, signature) == models.read_model_arguments(timm, "vit_tiny_patch16_224")
    assert (keywords, signature) == (signatures.VISION_TRANSFORMER_KEYWORDS, signatures.VISION_TRANSFORMER)


def test_a_naflex_build_is_not_counted(monkeypatch):
    cfg = resolve_config(TINY)
    kwargs = models.model_kwargs(cfg.model, cfg.data)
    assert vit.parameter_counts(cfg.model.name, kwargs) is not None
    monkeypatch.setenv("TIMM_USE_NAFLEXVIT", "true")  # timm then builds NaFlexVit
    assert vit.parameter_counts(cfg.model.name, kwargs) is None
