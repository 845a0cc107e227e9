"""The DeiT recipe's augmentations on the native loader against timm's and torchvision's
own transforms, run with the same seeds; repeated augmentation against DeiT's sampler
rule; exactness across worker counts and a resume; clear errors where a loader lacks them."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch
from PIL import Image

from largebatch import data as data_mod
from largebatch.batching import BatchPlan
from largebatch.config.typed import section
from largebatch.data.base import MicroBatches
from largebatch.data.sharding import rank_train_indices
from largebatch.errors import ConfigError
from largebatch.randomness import augmentation_seeds
from tests.data.conftest import data_cfg

CPU = torch.device("cpu")
PLAN = BatchPlan.create(global_batch_size=16, micro_batch_size=4, world_size=1, num_samples=48)
POLICY = "rand-m9-mstd0.5-inc1"  # DeiT's


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def epoch_batches(cfg: dict, epoch: int = 1, plan: BatchPlan = PLAN) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader = data_mod.build_train_loader(cfg, plan, rank=0, seed=3, device=CPU)
    try:
        loader.set_epoch(epoch)
        return [(images.clone(), labels.clone()) for images, labels in loader]
    finally:
        loader.close()


def to_uint8(images: torch.Tensor, cfg: dict) -> np.ndarray:
    """Normalised NCHW back to the uint8 the loader decoded (exact: it is integer-valued)."""
    mean = torch.tensor(cfg.mean).view(1, -1, 1, 1) * 255
    std = torch.tensor(cfg.std).view(1, -1, 1, 1) * 255
    return (images * std + mean).round().clamp(0, 255).to(torch.uint8).numpy()


def normalise(pixels: np.ndarray, cfg: dict) -> torch.Tensor:
    mean = torch.tensor([m * 255 for m in cfg.mean], dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor([s * 255 for s in cfg.std], dtype=torch.float32).view(1, -1, 1, 1)
    return torch.from_numpy(pixels).float().sub_(mean).div_(std)


def plan_seeds(epoch: int = 1, plan: BatchPlan = PLAN) -> list[np.ndarray]:
    return [augmentation_seeds(3, epoch, b) for b in MicroBatches.for_training(plan, 0, 3)(epoch)]


def timm_policy(cfg: dict):
    """The RandAugment op list timm's own create_transform builds for this config."""
    from timm.data import create_transform
    from timm.data.auto_augment import RandAugment

    pipeline = create_transform(cfg.image_size, is_training=True, auto_augment=POLICY, interpolation="bicubic", mean=cfg.mean, std=cfg.std)
    (policy,) = [t for t in pipeline.transforms if isinstance(t, RandAugment)]
    return policy


def test_randaugment_is_timms_policy_applied_to_each_crop_with_its_own_seed(unique_shards):
    plain_cfg = data_cfg(unique_shards, 48)
    cfg = data_cfg(unique_shards, 48, auto_augment=POLICY)
    plain, augmented = epoch_batches(plain_cfg), epoch_batches(cfg)
    policy = timm_policy(cfg)
    changed = 0
    for (crops, labels), (images, got_labels), seeds in zip(plain, augmented, plan_seeds()):
        assert torch.equal(labels, got_labels)
        pixels = to_uint8(crops, cfg)
        for j, seed in enumerate(seeds.tolist()):
            seed_everything(seed)
            out = np.asarray(policy(Image.fromarray(np.ascontiguousarray(pixels[j].transpose(1, 2, 0)))))
            pixels[j] = out.transpose(2, 0, 1)
        expected = normalise(pixels, cfg)
        assert torch.equal(images, expected)
        changed += int(not torch.equal(images, crops))
    assert changed == len(plain)  # the policy did change the images


def test_colour_jitter_is_torchvisions_with_each_images_seed(unique_shards):
    from torchvision.transforms import ColorJitter

    plain_cfg = data_cfg(unique_shards, 48)
    cfg = data_cfg(unique_shards, 48, color_jitter=0.4)
    jitter = ColorJitter(0.4, 0.4, 0.4)
    for (crops, _), (images, _), seeds in zip(epoch_batches(plain_cfg), epoch_batches(cfg), plan_seeds()):
        pixels = to_uint8(crops, cfg)
        for j, seed in enumerate(seeds.tolist()):
            seed_everything(seed)
            pixels[j] = np.asarray(jitter(Image.fromarray(np.ascontiguousarray(pixels[j].transpose(1, 2, 0))))).transpose(2, 0, 1)
        assert torch.equal(images, normalise(pixels, cfg))


def test_random_erasing_is_timms_on_the_normalised_images(unique_shards):
    from timm.data.random_erasing import RandomErasing

    plain_cfg = data_cfg(unique_shards, 48)
    cfg = data_cfg(unique_shards, 48, reprob=0.5, remode="pixel", recount=2)
    eraser = RandomErasing(0.5, mode="pixel", max_count=2, device="cpu")
    erased = 0
    for (crops, _), (images, _), seeds in zip(epoch_batches(plain_cfg), epoch_batches(cfg), plan_seeds()):
        expected = crops.clone()
        for j, seed in enumerate(seeds.tolist()):
            seed_everything(seed)
            eraser(expected[j])
        assert torch.equal(images, expected)
        erased += int((images != crops).flatten(1).any(1).sum())
    assert 0 < erased < 48  # about half of the images


def test_policies_do_not_depend_on_workers_and_resume_mid_epoch(unique_shards):
    cfg = data_cfg(unique_shards, 48, auto_augment=POLICY, reprob=0.25, repeated_aug=3)
    reference = epoch_batches(cfg)
    with_workers = epoch_batches(dataclasses.replace(cfg, num_workers=2))
    for (a, la), (b, lb) in zip(reference, with_workers, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    loader = data_mod.build_train_loader(cfg, PLAN, rank=0, seed=3, device=CPU)
    loader.load_state_dict({"epoch": 1, "micro_batch": 5})
    loader.set_epoch(1)
    resumed = list(loader)
    loader.close()
    assert len(resumed) == len(reference) - 5
    for (a, _), (b, _) in zip(reference[5:], resumed, strict=True):
        assert torch.equal(a, b)


def test_repeated_augmentation_spreads_copies_over_ranks_and_augments_each_differently(unique_shards):
    plan = BatchPlan.create(global_batch_size=12, micro_batch_size=3, world_size=4, num_samples=48)
    per_rank = [rank_train_indices(plan, rank, seed=3, epoch=2, repeats=3) for rank in range(4)]
    everything = np.concatenate(per_rank)
    assert len(everything) == 48 and len(np.unique(everything)) == 48  # the epoch's length; each copy once
    real = everything % 48
    assert sorted(np.bincount(real, minlength=48)[np.unique(real)].tolist()) == [3] * 16  # 16 samples, thrice each
    for step in range(plan.steps_per_epoch):  # DeiT: the copies of a sample go to different ranks
        window = [indices[step * 3 : step * 3 + 3] % 48 for indices in per_rank]
        flat = np.concatenate(window)
        counts = np.bincount(flat, minlength=48)
        for sample in np.flatnonzero(counts):
            ranks = [rank for rank, rows in enumerate(window) if sample in rows]
            assert len(ranks) == counts[sample], "two copies of one sample on one rank"
    assert np.array_equal(rank_train_indices(plan, 1, 3, 2), rank_train_indices(plan, 1, 3, 2, repeats=1))

    cfg = data_cfg(unique_shards, 48, repeated_aug=3)
    one_rank = BatchPlan.create(global_batch_size=6, micro_batch_size=3, world_size=1, num_samples=48)
    images, labels = epoch_batches(cfg, plan=one_rank)[0]
    assert labels.tolist()[:3] == [labels[0].item()] * 3  # one sample thrice in a row on one rank (DeiT's order)
    assert not torch.equal(images[0], images[1]) and not torch.equal(images[1], images[2])  # three different crops


def test_the_native_loader_resizes_with_the_configured_filter(unique_shards):
    # The same crops (same seeds) resized bicubic: every image a little different from the
    # bilinear one, never a different crop (tests/data/test_decode.py checks the filter
    # against Pillow's bicubic).
    bilinear = data_cfg(unique_shards, 48)
    bicubic = data_cfg(unique_shards, 48, interpolation="bicubic")
    for (a, labels_a), (b, labels_b) in zip(epoch_batches(bilinear), epoch_batches(bicubic)):
        assert torch.equal(labels_a, labels_b)
        diff = np.abs(to_uint8(a, bilinear).astype(int) - to_uint8(b, bicubic).astype(int)).mean(axis=(1, 2, 3))
        assert (diff > 0).all() and (diff < 8).all()


@pytest.mark.parametrize("loader", ["dali", "mediapipe", "synthetic"])
@pytest.mark.parametrize(
    "key,value", [("auto_augment", POLICY), ("color_jitter", 0.4), ("reprob", 0.25), ("repeated_aug", 3), ("interpolation", "bicubic")]
)
def test_a_loader_without_a_policy_refuses_it_naming_the_key(unique_shards, loader, key, value):
    if loader == "synthetic" and key == "repeated_aug":
        return  # the synthetic loader repeats samples (it has no augmentation to vary)
    cfg = data_cfg(unique_shards, 48, loader=loader, **{key: value})
    with pytest.raises(ConfigError, match=rf"data\.{key}: .*data\.loader='native'"):
        data_mod.build_train_loader(cfg, PLAN, rank=0, seed=0, device=CPU)


def test_bad_policy_strings_and_jitter_under_a_policy_are_config_errors(unique_shards):
    with pytest.raises(ConfigError, match=r"data\.auto_augment: timm does not parse the policy 'rand-q9'"):
        data_mod.build_train_loader(data_cfg(unique_shards, 48, auto_augment="rand-q9"), PLAN, rank=0, seed=0, device=CPU)
    with pytest.raises(ConfigError, match=r"data\.color_jitter: .*auto_augment"):
        data_mod.build_train_loader(data_cfg(unique_shards, 48, auto_augment=POLICY, color_jitter=0.3), PLAN, rank=0, seed=0, device=CPU)


def test_zero_bit_posterize_gives_a_black_image_where_pillow_refuses_it(unique_shards):
    """timm's increasing posterize asks for 0 bits at high magnitudes; Pillow 11+ refuses
    that, so the policy's posterize ops keep 0 bits as older Pillow did (a black image)."""
    from largebatch.data.policies import apply_policy, image_policy, posterize_any_bits

    gray = Image.fromarray(np.arange(28 * 28, dtype=np.uint8).reshape(28, 28))
    assert np.asarray(posterize_any_bits(gray, 0)).max() == 0
    assert np.array_equal(np.asarray(posterize_any_bits(gray, 3)), np.asarray(gray) & 0b11100000)
    cfg = section("data", data_cfg(unique_shards, 48, auto_augment=POLICY))
    policy = image_policy(cfg)
    assert [op.aug_fn for op in policy.ops if op.name == "PosterizeIncreasing"] == [posterize_any_bits]
    rng = np.random.default_rng(0)
    for seed in range(3000):  # magnitude noise (mstd 0.5) reaches 0 bits in some of these
        apply_policy(policy, rng.integers(0, 256, (3, 16, 16), dtype=np.uint8), seed)
