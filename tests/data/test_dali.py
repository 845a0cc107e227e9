"""One contract, two loaders: the DALI loader against the native one on the same shards."""

from __future__ import annotations

import builtins

import pytest
import torch
from tests.data.conftest import data_cfg

from largebatch.batching import BatchPlan
from largebatch.data import native
from largebatch.errors import UserError

try:
    import nvidia.dali  # noqa: F401

    HAVE_DALI = True
except ImportError:
    HAVE_DALI = False

CPU = torch.device("cpu")
SEED = 11
needs_dali = pytest.mark.skipif(
    not HAVE_DALI, reason="NVIDIA DALI not importable (pip install -e .[dali])"
)
pytestmark = pytest.mark.dali


def plan() -> BatchPlan:
    return BatchPlan.create(
        global_batch_size=16, micro_batch_size=4, world_size=2, num_samples=48
    )


@needs_dali
def test_same_samples_per_micro_batch_as_native(unique_shards):
    from largebatch.data import dali

    cfg = data_cfg(unique_shards, 48)
    for rank, epoch in ((0, 1), (1, 2)):
        got = {}
        for name, module in (("native", native), ("dali", dali)):
            loader = module.build_train_loader(
                cfg, plan(), rank=rank, seed=SEED, device=CPU
            )
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
    from largebatch.data import dali

    cfg = data_cfg(unique_shards, 48)
    for rank in range(2):
        pairs = [
            list(
                m.build_eval_loader(
                    cfg, batch_size=3, rank=rank, world_size=2, device=CPU
                )
            )
            for m in (native, dali)
        ]
        assert len(pairs[0]) == len(pairs[1]) == 4  # 10 records: 3 + 3 + 3 + 1
        for (a_img, a_lab), (b_img, b_lab) in zip(*pairs, strict=True):
            assert torch.equal(a_lab, b_lab)
            # normalised units (~1/0.226 per unit of 0..1 pixels): resampling filters differ slightly
            assert float((a_img - b_img).abs().mean()) < 0.2


@needs_dali
def test_grayscale_and_resume(fmnist_shards):
    from largebatch.data import dali

    cfg = data_cfg(
        fmnist_shards,
        10,
        channels=1,
        mean=(0.286,),
        std=(0.353,),
        label_offset=0,
        image_size=28,
    )
    p = BatchPlan.create(
        global_batch_size=16, micro_batch_size=8, world_size=1, num_samples=64
    )
    full = dali.build_train_loader(cfg, p, rank=0, seed=SEED, device=CPU)
    reference = [labels.tolist() for _, labels in full]
    first = dali.build_train_loader(cfg, p, rank=0, seed=SEED, device=CPU)
    iterator = iter(first)
    images, _ = next(iterator)
    assert images.shape == (8, 1, 28, 28)
    next(iterator)
    state = first.state_dict()
    del iterator
    resumed = dali.build_train_loader(cfg, p, rank=0, seed=SEED, device=CPU)
    resumed.load_state_dict(state)
    rest = [labels.tolist() for _, labels in resumed]
    assert [sorted(x) for x in rest] == [sorted(x) for x in reference[2:]]


def test_missing_dali_is_a_user_error(monkeypatch, unique_shards):
    from largebatch.data import dali

    real_import = builtins.__import__

    def no_dali(name, *args, **kwargs):
        if name.startswith("nvidia.dali"):
            raise ImportError("No module named 'nvidia.dali'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_dali)
    with pytest.raises(UserError, match=r"pip install -e \.\[dali\]"):
        dali.build_train_loader(
            data_cfg(unique_shards, 48), plan(), rank=0, seed=0, device=CPU
        )
