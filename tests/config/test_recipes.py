"""The ImageNet recipes: Colossal-AI's values, the batch arithmetic at several world sizes,
and the models they build, against ViT-B/16, B/32 and L/32 as the ViT paper defines them."""

from __future__ import annotations

import pytest
import torch
import yaml

from largebatch import cli
from largebatch.config import derive
from largebatch.config.typed import typed
from largebatch.errors import UserError
from tests.conftest import REPO, derived_of, load_and_validate, model_of

RECIPES = {
    # config: (timm model, patch, width, depth, micro-batch)
    "vit-b16": ("vit_base_patch16_224", 16, 768, 12, 256),
    "vit-b32": ("vit_base_patch32_224", 32, 768, 12, 512),
    "vit-l32": ("vit_large_patch32_224", 32, 1024, 24, 128),
}
IMAGENET_TRAIN = 1281167


def load(name: str) -> dict:
    return load_and_validate(str(REPO / "configs" / f"{name}.py"))


def vit_parameters(patch: int, width: int, depth: int, classes: int = 1000, image: int = 224, mlp_ratio: int = 4) -> int:
    """ViT's parameter count written out (Dosovitskiy et al. 2021, with qkv biases, as timm)."""
    tokens = (image // patch) ** 2 + 1
    embed = 3 * patch * patch * width + width + width + tokens * width  # patch conv, class token, positions
    hidden = mlp_ratio * width
    block = 2 * 2 * width + (3 * width * width + 3 * width) + (width * width + width)  # two norms, qkv, proj
    block += width * hidden + hidden + hidden * width + width  # MLP
    return embed + depth * block + 2 * width + width * classes + classes


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_values_are_colossal_ai(name):
    cfg = load(name)
    model, _, _, _, micro = RECIPES[name]
    assert cfg["model"] == {
        "name": model,
        "drop_rate": 0.0,
        "pos_drop_rate": 0.1,
        "proj_drop_rate": 0.1,
        "pretrained": False,
        "init_from": None,
    }
    assert (cfg["global_batch_size"], cfg["micro_batch_size"], cfg["epochs"]) == (32768, micro, 300)
    assert cfg["optimizer"]["type"] == "lamb"
    assert cfg["optimizer"]["lr"] == pytest.approx(1.8e-2)
    assert cfg["optimizer"]["weight_decay"] == pytest.approx(0.1)
    assert cfg["lr_schedule"]["type"] == "linear"
    assert cfg["lr_schedule"]["warmup_epochs"] == 150
    assert cfg["lr_schedule"]["scaling"] == "none"
    assert cfg["clip_grad_norm"] == 1.0
    assert cfg["mixup"]["mixup_alpha"] == pytest.approx(0.2)
    assert cfg["mixup"]["cutmix_alpha"] == 0.0
    assert cfg["mixup"]["label_smoothing"] == 0.0
    assert (cfg["data"]["loader"], cfg["data"]["image_size"], cfg["data"]["num_classes"]) == ("dali", 224, 1000)


@pytest.mark.parametrize("world_size, accumulation", [(8, 16), (4, 32), (128, 1)])
def test_vit_b16_config_show_accumulation(world_size, accumulation, capsys):
    assert cli.main(["config", "show", str(REPO / "configs/vit-b16.py"), "--world-size", str(world_size)]) == 0
    derived = yaml.safe_load(capsys.readouterr().out)["derived"]
    assert derived["accumulation"] == accumulation
    assert derived["micro_batch_size"] * derived["accumulation"] * world_size == 32768


@pytest.mark.parametrize("name", sorted(RECIPES))
@pytest.mark.parametrize("world_size", [1, 4, 8, 16, 64, 128])
def test_recipe_batch_arithmetic(name, world_size):
    cfg = load(name)
    micro = RECIPES[name][4]
    if micro * world_size > 32768:
        with pytest.raises(UserError, match="not divisible"):
            derive(typed(cfg), world_size, IMAGENET_TRAIN)
        return
    derived = derived_of(cfg, world_size, IMAGENET_TRAIN)
    assert derived["accumulation"] == 32768 // (micro * world_size)
    assert derived["steps_per_epoch"] == IMAGENET_TRAIN // 32768  # 39 steps an epoch, 11,700 in all
    assert derived["total_steps"] == 39 * 300
    assert derived["warmup_steps"] == 39 * 150


def test_vit_b32_at_128_devices_needs_a_smaller_micro_batch():
    # 512 x 128 is twice the global batch; the recipe's comment names the fix.
    cfg = load_and_validate(str(REPO / "configs/vit-b32.py"), ["micro_batch_size=256"])
    assert derived_of(cfg, 128, IMAGENET_TRAIN)["accumulation"] == 1


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_models_match_vit_parameter_count(name):
    _, patch, width, depth, _ = RECIPES[name]
    with torch.device("meta"):  # shapes only: no 1.2 GB of ViT-L weights to initialise
        model = model_of(load(name))
    assert sum(p.numel() for p in model.parameters()) == vit_parameters(patch, width, depth)
    dropouts = sorted(m.p for m in model.modules() if isinstance(m, torch.nn.Dropout))
    # as timm 0.4's drop_rate placed them: after the position embedding, then per block
    # after the attention projection and twice in the MLP (after the activation, after fc2);
    # none before the head
    assert dropouts.count(0.1) == 1 + 3 * depth
    assert model.head_drop.p == 0.0


def test_vit_parameter_formula_matches_timm_counts():
    assert vit_parameters(16, 768, 12) == 86_567_656
    assert vit_parameters(32, 768, 12) == 88_224_232
    assert vit_parameters(32, 1024, 24) == 306_535_400


SHARDED = {
    # config: (timm model, width, depth, MLP width, micro-batch, parameters)
    "vit-h14": ("vit_huge_patch14_224", 1280, 32, 5120, 32, 632_045_800),
    "vit-g14": ("vit_giant_patch14_224", 1408, 40, 6144, 16, 1_012_611_432),
}


@pytest.mark.parametrize("name", sorted(SHARDED))
def test_sharded_recipes_batch_arithmetic_and_memory_estimate(name):
    from largebatch.footprint import GIB, estimate_memory, model_sizes

    model, width, depth, mlp, micro, count = SHARDED[name]
    cfg = load_and_validate(str(REPO / "configs" / f"{name}.py"), ["precision=bf16"])
    assert cfg["model"]["name"] == model and cfg["dist"]["strategy"] == "fsdp"
    assert (cfg["global_batch_size"], cfg["micro_batch_size"], cfg["optimizer"]["type"]) == (32768, micro, "lamb")
    total, block, root = model_sizes(typed(cfg))
    # the model as Zhai et al. define it, written out: 224 px, 14 px patches
    tokens = (224 // 14) ** 2 + 1
    per_block = 4 * width + 3 * width * width + 3 * width + width * width + width + width * mlp + mlp + mlp * width + width
    assert block == per_block
    assert root == 3 * 14 * 14 * width + 2 * width + tokens * width + 2 * width + width * 1000 + 1000
    assert total == depth * per_block + root == count
    header = (REPO / "configs" / f"{name}.py").read_text()
    for world, accumulation in ((8, 32768 // (micro * 8)), (64, 32768 // (micro * 64)), (256, 32768 // (micro * 256))):
        derived = derive(typed(cfg), world, IMAGENET_TRAIN)
        assert derived.accumulation == accumulation and f"{world} devices: accumulation {accumulation}" in header
        fsdp = estimate_memory(typed(cfg), derived, (total, block, root))
        # backward: sharded fp32 weights and two moments, the unsharded fp32 gradient, two
        # gathered blocks (bf16 weights and gradients) and the root's bf16 weights; the step
        # (weights, gradients, two moments, the update) is smaller at 8 devices and more
        backward = total * 4 * 3 / world + total * 4 + 2 * block * 4 + root * 2
        assert fsdp["total_gib"] == pytest.approx(max(backward, total * 4 * 5 / world) / GIB, abs=1e-3)
        ddp_cfg = typed({**cfg, "dist": {**cfg["dist"], "strategy": "ddp"}})
        ddp = estimate_memory(ddp_cfg, derive(ddp_cfg, world, IMAGENET_TRAIN))
        # fp32 weights, two moments, the gradient twice (DDP's buckets while accumulating)
        assert ddp["total_gib"] == pytest.approx(total * 20 / GIB, abs=1e-3)
        row = f"#     {world:<9} {ddp['total_gib']:<22.2f} {fsdp['total_gib']:<20.2f}"
        assert row in header, row


def test_deit_b16_is_the_papers_recipe():
    """configs/deit-b16.py against Touvron et al. 2021, Table 9 (DeiT-B, no distillation)."""
    cfg = load("deit-b16")
    assert cfg["model"]["name"] == "vit_base_patch16_224"
    assert (cfg["model"]["drop_rate"], cfg["model"]["drop_path_rate"]) == (0.0, 0.1)
    assert (cfg["epochs"], cfg["global_batch_size"], cfg["clip_grad_norm"]) == (300, 1024, None)
    opt, sched = cfg["optimizer"], cfg["lr_schedule"]
    assert (opt["type"], opt["lr"], opt["weight_decay"], opt["eps"]) == ("adamw", 5e-4, 0.05, 1e-8)
    assert (sched["type"], sched["warmup_epochs"], sched["warmup_init_lr"], sched["min_lr"]) == ("cosine", 5, 1e-6, 1e-5)
    derived = derived_of(cfg, 16, IMAGENET_TRAIN)
    assert derived["peak_lr"] == pytest.approx(1e-3)  # 5e-4 x 1024 / 512
    data = cfg["data"]
    assert (data["loader"], data["auto_augment"], data["repeated_aug"]) == ("native", "rand-m9-mstd0.5-inc1", 3)
    assert (data["reprob"], data["remode"], data["recount"], data["color_jitter"]) == (0.25, "pixel", 1, None)
    mix = cfg["mixup"]
    assert (mix["mixup_alpha"], mix["cutmix_alpha"], mix["prob"], mix["switch_prob"], mix["label_smoothing"]) == (0.8, 1.0, 1.0, 0.5, 0.1)
    model = model_of(cfg)
    assert sum(p.numel() for p in model.parameters()) == vit_parameters(16, 768, 12)  # 86.6 M, DeiT-B's count


@pytest.mark.parametrize("world_size, micro", [(8, 256), (16, 128), (128, 16)])
def test_vit_b16_adaptive_config_show_prints_the_schedule(world_size, micro, capsys):
    """configs/vit-b16-adaptive.py: vit-b16.py with a batch from 4,096 doubling to at most
    32,768, at the world sizes and micro-batches its header names (accumulation 2 at the start)."""
    path = str(REPO / "configs/vit-b16-adaptive.py")
    assert cli.main(["config", "show", path, "--world-size", str(world_size), "--set", f"micro_batch_size={micro}"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    schedule = shown["derived"]["batch_schedule"]
    assert (schedule["type"], schedule["lr_rule"]) == ("adaptive", "sqrt")
    batches = [4096, 8192, 16384, 32768]
    assert [s["global_batch"] for s in schedule["stages"]] == batches
    assert [s["accumulation"] for s in schedule["stages"]] == [b // (micro * world_size) for b in batches] == [2, 4, 8, 16]
    # LAMB's sqrt rule: optimizer.lr is the rate at 32,768
    assert [s["lr_multiplier"] for s in schedule["stages"]] == pytest.approx([(b / 32768) ** 0.5 for b in batches])
    assert 1.8e-2 * schedule["stages"][0]["lr_multiplier"] == pytest.approx(6.4e-3, abs=5e-5)  # the header's 6.4e-3
    # the steps if the batch never grew: a fixed run at 4,096
    fixed = derived_of(load_and_validate(path, [f"micro_batch_size={micro}", "global_batch_size=4096"]), world_size, IMAGENET_TRAIN)
    assert schedule["run_steps"] == schedule["stages"][0]["steps"] == fixed["total_steps"] == 93_600  # the header's
    assert [s["steps"] for s in schedule["stages"][1:]] == [None] * 3  # the criterion decides them
    section = shown["batch_schedule"]
    assert (section["criterion"], section["factor"], section["check_every_samples"]) == ("noise_scale", 1.5, 40 * 32768)


def test_vit_b16_adaptive_is_vit_b16_with_a_batch_schedule():
    adaptive, fixed = load("vit-b16-adaptive"), load("vit-b16")
    assert adaptive["hooks"] == [{"type": "noise_scale", "beta": 0.99}]
    assert fixed["batch_schedule"]["type"] == "fixed"
    same = {k: v for k, v in adaptive.items() if k not in ("hooks", "batch_schedule")}
    assert same == {k: v for k, v in fixed.items() if k not in ("hooks", "batch_schedule")}
