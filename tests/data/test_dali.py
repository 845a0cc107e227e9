"""One contract, two loaders: the DALI loader against the native one on the same shards."""

from __future__ import annotations

import builtins
import dataclasses

import pytest
import torch

from largebatch import data as data_mod
from largebatch.batching import BatchPlan
from largebatch.errors import UserError
from tests.data.conftest import data_cfg

try:
    import nvidia.dali  # noqa: F401

    HAVE_DALI = True
except ImportError:
    HAVE_DALI = False

CPU = torch.device("cpu")
SEED = 11
needs_dali = pytest.mark.skipif(not HAVE_DALI, reason="NVIDIA DALI not importable (pip install -e .[dali])")
pytestmark = pytest.mark.dali


def plan() -> BatchPlan:
    return BatchPlan.create(global_batch_size=16, micro_batch_size=4, world_size=2, num_samples=48)


@needs_dali
def test_same_samples_per_micro_batch_as_native(unique_shards):

    for rank, epoch in ((0, 1), (1, 2)):
        got = {}
        for name in ("native", "dali"):
            loader = data_mod.build_train_loader(data_cfg(unique_shards, 48, loader=name), plan(), rank=rank, seed=SEED, device=CPU)
            loader.set_epoch(epoch)
            batches = list(loader)
            assert len(batches) == len(loader) == plan().micro_batches_per_epoch
            for images, labels in batches:
                assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
                assert labels.dtype == torch.int64 and images.device == CPU
                assert -2.2 < float(images.min()) and float(images.max()) < 2.7
            got[name] = [sorted(labels.tolist()) for _, labels in batches]
        assert got["native"] == got["dali"]  # label = record number: same sample sets


@needs_dali
def test_eval_images_nearly_identical(unique_shards):

    cfg = data_cfg(unique_shards, 48)
    for rank in range(2):
        pairs = [
            list(data_mod.build_eval_loader(dataclasses.replace(cfg, loader=name), batch_size=3, rank=rank, world_size=2, device=CPU))
            for name in ("native", "dali")
        ]
        assert len(pairs[0]) == len(pairs[1]) == 4  # 10 records: 3 + 3 + 3 + 1
        for (a_img, a_lab), (b_img, b_lab) in zip(*pairs, strict=True):
            assert torch.equal(a_lab, b_lab)
            # normalised units (~1/0.226 per unit of 0..1 pixels): resampling filters differ slightly
            assert float((a_img - b_img).abs().mean()) < 0.2


@needs_dali
def test_grayscale_and_resume(fmnist_shards):

    cfg = data_cfg(
        fmnist_shards,
        10,
        channels=1,
        mean=(0.286,),
        std=(0.353,),
        label_offset=0,
        image_size=28,
        loader="dali",
    )
    p = BatchPlan.create(global_batch_size=16, micro_batch_size=8, world_size=1, num_samples=64)
    full = data_mod.build_train_loader(cfg, p, rank=0, seed=SEED, device=CPU)
    reference = [labels.tolist() for _, labels in full]
    first = data_mod.build_train_loader(cfg, p, rank=0, seed=SEED, device=CPU)
    iterator = iter(first)
    images, _ = next(iterator)
    assert images.shape == (8, 1, 28, 28)
    next(iterator)
    state = first.state_dict()
    del iterator
    resumed = data_mod.build_train_loader(cfg, p, rank=0, seed=SEED, device=CPU)
    resumed.load_state_dict(state)
    rest = [labels.tolist() for _, labels in resumed]
    assert [sorted(x) for x in rest] == [sorted(x) for x in reference[2:]]


def test_missing_dali_is_a_user_error(monkeypatch, unique_shards):

    real_import = builtins.__import__

    def no_dali(name, *args, **kwargs):
        if name.startswith("nvidia.dali"):
            raise ImportError("No module named 'nvidia.dali'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_dali)
    with pytest.raises(UserError, match=r"pip install -e \.\[dali\]"):
        data_mod.build_train_loader(data_cfg(unique_shards, 48, loader="dali"), plan(), rank=0, seed=0, device=CPU)


@needs_dali
@pytest.mark.parametrize(("scale", "ratio"), [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 1.0), (0.2, 5.0))])
def test_crop_boxes_are_the_native_loaders_boxes(scale, ratio):
    """The DALI graph's random-resized-crop boxes equal ``random_resized_crop_box`` exactly,
    on shapes that take every branch: a try fits; no try can fit (1000x50 and 30x400 at
    the default scale: every try is wider or taller than the image), so the centre crop
    clamped to the ratio range is taken."""
    import numpy as np
    import simplejpeg
    from nvidia.dali import fn, pipeline_def, types

    from largebatch.data.dali import crop_window
    from largebatch.data.decode import random_resized_crop_box
    from largebatch.randomness import augmentation_uniforms

    sizes = [(375, 500), (500, 375), (64, 64), (30, 400), (400, 30), (1000, 50), (17, 19), (480, 640)] * 4
    pixels = np.random.default_rng(0)
    jpegs = [np.frombuffer(simplejpeg.encode_jpeg(pixels.integers(0, 256, (h, w, 3), dtype=np.uint8)), np.uint8) for h, w in sizes]
    draws = augmentation_uniforms(SEED, 3, np.arange(len(sizes)))

    @pipeline_def(batch_size=len(sizes), num_threads=1, device_id=None)
    def boxes():
        encoded = fn.external_source(source=lambda: jpegs, batch=True)
        uniforms = fn.external_source(source=lambda: list(draws), batch=True, dtype=types.FLOAT64)
        return crop_window(encoded, uniforms, scale, ratio)

    pipe = boxes()
    pipe.build()
    outputs = pipe.run()
    for i, (height, width) in enumerate(sizes):
        got = tuple(float(np.asarray(out[i])) for out in outputs)
        want = random_resized_crop_box(height, width, draws[i], scale, ratio)
        assert got == tuple(float(v) for v in want), (height, width)
