"""The native loader against the shared sharding plan."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from largebatch import data as data_mod
from largebatch.batching import BatchPlan
from largebatch.config.typed import section
from largebatch.data import native
from largebatch.data.sharding import rank_train_indices
from largebatch.errors import UserError
from tests.data.conftest import data_cfg

CPU = torch.device("cpu")
SEED = 7


def plan(world: int = 2, micro: int = 4, global_batch: int = 16) -> BatchPlan:
    return BatchPlan.create(
        global_batch_size=global_batch,
        micro_batch_size=micro,
        world_size=world,
        num_samples=48,
    )


def epoch_labels(root, p: BatchPlan, rank: int, epoch: int, **cfg) -> list[list[int]]:
    loader = data_mod.build_train_loader(data_cfg(root, 48, **cfg), p, rank=rank, seed=SEED, device=CPU)
    loader.set_epoch(epoch)
    return [labels.tolist() for _, labels in loader]


def test_contract_shapes_and_ranges(unique_shards):
    loader = data_mod.build_train_loader(data_cfg(unique_shards, 48), plan(), rank=0, seed=SEED, device=CPU)
    assert len(loader) == plan().micro_batches_per_epoch == 6
    assert loader.num_samples == 48 and loader.num_classes == 48
    batches = list(loader)
    assert len(batches) == 6
    images, labels = batches[0]
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
    assert images.is_contiguous()  # NCHW, not a channels-last view (DDP bucket strides)
    assert labels.dtype == torch.int64 and int(labels.min()) >= 0 and int(labels.max()) < 48
    assert -2.2 < float(images.min()) and float(images.max()) < 2.7  # normalised 0..1 pixels


def test_same_samples_per_step_as_the_sharding_plan(unique_shards):
    p = plan()
    for rank in range(2):
        got = epoch_labels(unique_shards, p, rank, epoch=3)
        expected = rank_train_indices(p, rank, SEED, 3).reshape(-1, 4).tolist()  # label = record number
        assert got == expected


def test_disjoint_equal_shares_reshuffled_per_epoch(unique_shards):
    p = plan()
    shares = {}
    for epoch in (0, 1):
        per_rank = [[x for batch in epoch_labels(unique_shards, p, rank, epoch) for x in batch] for rank in range(2)]
        assert len(per_rank[0]) == len(per_rank[1]) == 24
        assert not set(per_rank[0]) & set(per_rank[1])
        shares[epoch] = per_rank
    assert shares[0][0] != shares[1][0]


def test_independent_of_worker_count(unique_shards):
    p = plan()
    loaders = [data_mod.build_train_loader(data_cfg(unique_shards, 48, num_workers=w), p, rank=1, seed=SEED, device=CPU) for w in (0, 2)]
    for loader in loaders:
        loader.set_epoch(2)
    for (a_img, a_lab), (b_img, b_lab) in zip(*loaders, strict=True):
        assert torch.equal(a_lab, b_lab) and torch.equal(a_img, b_img)
        assert b_img.is_contiguous()  # also after the trip through worker processes


def test_eval_covers_every_record_once(unique_shards):
    seen = []
    for rank in range(3):
        loader = data_mod.build_eval_loader(
            data_cfg(unique_shards, 48),
            batch_size=3,
            rank=rank,
            world_size=3,
            device=CPU,
        )
        batches = list(loader)
        assert len(batches) == len(loader)
        seen += [label for _, labels in batches for label in labels.tolist()]
    assert sorted(seen) == list(range(20))


def count_decodes(monkeypatch) -> list[int]:
    """The sample indices the native loader decodes from now on, in order."""
    decoded = []
    original = native._MicroBatchDataset._load

    def counting(self, index, draws, out):
        decoded.append(index)
        return original(self, index, draws, out)

    monkeypatch.setattr(native._MicroBatchDataset, "_load", counting)
    return decoded


def test_resume_continues_at_next_micro_batch_without_decoding_skipped(unique_shards, monkeypatch):
    p = plan()
    cfg = data_cfg(unique_shards, 48)
    full = data_mod.build_train_loader(cfg, p, rank=0, seed=SEED, device=CPU)
    full.set_epoch(1)
    reference = list(full)

    first = data_mod.build_train_loader(cfg, p, rank=0, seed=SEED, device=CPU)
    first.set_epoch(1)
    iterator = iter(first)
    for _ in range(2):
        next(iterator)
    state = first.state_dict()
    assert state == {"epoch": 1, "micro_batch": 2}

    decoded = count_decodes(monkeypatch)
    resumed = data_mod.build_train_loader(cfg, p, rank=0, seed=SEED, device=CPU)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    rest = list(resumed)
    assert len(rest) == 4 and len(decoded) == 16
    for (a_img, a_lab), (b_img, b_lab) in zip(rest, reference[2:], strict=True):
        assert torch.equal(a_lab, b_lab) and torch.equal(a_img, b_img)
    resumed.set_epoch(2)
    assert len(list(resumed)) == 6  # the next epoch starts from the beginning


def test_augmentation_is_random_across_epochs_and_flips(unique_shards):
    cfg = data_cfg(unique_shards, 48, hflip=1.0, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    p = BatchPlan.create(global_batch_size=48, micro_batch_size=48, world_size=1, num_samples=48)
    a = data_mod.build_train_loader(cfg, p, rank=0, seed=SEED, device=CPU)
    b = data_mod.build_train_loader(dataclasses.replace(cfg, hflip=0.0), p, rank=0, seed=SEED, device=CPU)
    (img_a, lab_a), (img_b, lab_b) = next(iter(a)), next(iter(b))
    assert torch.equal(lab_a, lab_b)
    assert img_a.shape == img_b.shape
    # The flip is applied after the resize, so it mirrors the unflipped image exactly.
    assert torch.equal(img_a, img_b.flip(-1)) and not torch.equal(img_a, img_b)


@pytest.mark.slow
def test_plan_for_wrong_sample_count_is_a_user_error(unique_shards):
    wrong = BatchPlan.create(global_batch_size=16, micro_batch_size=4, world_size=2, num_samples=64)
    with pytest.raises(UserError, match="48"):
        data_mod.build_train_loader(data_cfg(unique_shards, 48), wrong, rank=0, seed=0, device=CPU)


def test_count_samples_counts_the_training_and_the_evaluation_split(unique_shards):
    cfg = data_cfg(unique_shards, 48)
    assert data_mod.count_samples(cfg, "train") == 48 and data_mod.count_samples(cfg, "eval") == 20
    assert data_mod.count_samples(dataclasses.replace(cfg, eval_split="train"), "eval") == 48
    synthetic = section("data", {"loader": "synthetic", "train_samples": 40, "eval_samples": 8, "num_classes": 3})
    assert data_mod.count_samples(synthetic, "train") == 40 and data_mod.count_samples(synthetic, "eval") == 8


def test_grayscale_fashion_mnist(fmnist_shards):
    cfg = data_cfg(
        fmnist_shards,
        10,
        channels=1,
        mean=(0.286,),
        std=(0.353,),
        label_offset=0,
        image_size=28,
    )
    p = BatchPlan.create(global_batch_size=32, micro_batch_size=16, world_size=1, num_samples=64)
    images, labels = next(iter(data_mod.build_train_loader(cfg, p, rank=0, seed=0, device=CPU)))
    assert images.shape == (16, 1, 28, 28) and labels.max() < 10
    assert np.isfinite(images.numpy()).all()


def test_cached_eval_replays_the_first_pass_without_decoding(unique_shards, monkeypatch):
    from largebatch import data as data_mod

    cfg = data_cfg(unique_shards, 48, loader="native")
    reference = list(data_mod.build_eval_loader(cfg, batch_size=3, rank=1, world_size=2, device=CPU))
    decoded = count_decodes(monkeypatch)
    cached = data_mod.build_eval_loader(cfg, batch_size=3, rank=1, world_size=2, device=CPU, cache=True)
    assert len(cached) == len(reference) and cached.num_samples == 20
    stopped = iter(cached)
    next(stopped)
    stopped.close()  # a pass stopped part-way is not kept: the next pass reads again
    decoded.clear()
    for attempt in range(3):
        batches = list(cached)
        assert len(batches) == len(reference)
        for (images, labels), (ref_images, ref_labels) in zip(batches, reference, strict=True):
            assert torch.equal(images, ref_images) and torch.equal(labels, ref_labels)
        # the first complete pass decodes every record of the rank once, later ones none
        assert len(decoded) == 10, attempt
    cached.close()


def test_cached_decodes_give_the_same_batches_and_decode_each_record_once_at_full_size(unique_shards, monkeypatch):
    """data.cache_decoded: three epochs of random crops and flips, byte for byte the
    uncached loader's; a record is decoded at full size once, crops that want a reduced
    DCT scale (large crops of the 96 px images) still decode at that scale."""
    p = plan(world=1, micro=8, global_batch=16)
    cfg = data_cfg(unique_shards, 48, scale=(0.08, 1.0))

    def epochs(loader):
        out = []
        for epoch in (1, 2, 3):
            loader.set_epoch(epoch)
            out += list(loader)
        return out

    reference = epochs(data_mod.build_train_loader(cfg, p, rank=0, seed=SEED, device=CPU))
    scales: list[int] = []
    original = native.decode_at_scale
    monkeypatch.setattr(native, "decode_at_scale", lambda jpeg, k, *rest: scales.append(k) or original(jpeg, k, *rest))
    cached = epochs(data_mod.build_train_loader(dataclasses.replace(cfg, cache_decoded=True), p, rank=0, seed=SEED, device=CPU))
    for (images, labels), (ref_images, ref_labels) in zip(cached, reference, strict=True):
        assert torch.equal(images, ref_images) and torch.equal(labels, ref_labels)
    assert scales.count(1) <= 48 and len(scales) < 3 * 48  # full size once per record; fewer decodes than the 144 reads
    assert any(k > 1 for k in scales)  # the test exercised both paths


def _slow_first_worker(monkeypatch):
    """Worker 0 decodes slowly, so worker 1's batches arrive first and wait."""
    import time

    original = native._MicroBatchDataset._load

    def slow(self, index, draws, out):
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == 0:
            time.sleep(0.003)
        return original(self, index, draws, out)

    monkeypatch.setattr(native._MicroBatchDataset, "_load", slow)


def test_workers_decode_into_shared_slots_that_are_reused_only_after_their_batch_is_taken(unique_shards, monkeypatch):
    # 12 micro-batches per epoch through a ring of prefetch 1 x 2 workers + 1 = 3 slots,
    # worker 0 slower than worker 1: every slot is rewritten four times an epoch while
    # batches arrive out of order; the batches must equal a loader without workers.
    p = plan(micro=2, global_batch=8)
    _slow_first_worker(monkeypatch)
    reference = data_mod.build_train_loader(data_cfg(unique_shards, 48), p, rank=1, seed=SEED, device=CPU)
    ring = data_mod.build_train_loader(data_cfg(unique_shards, 48, num_workers=2, prefetch=1), p, rank=1, seed=SEED, device=CPU)
    assert ring._ring.shape[:2] == (3, 2) and ring._ring.is_shared()
    for epoch in (0, 1):
        reference.set_epoch(epoch)
        ring.set_epoch(epoch)
        expected, got = list(reference), list(ring)  # all held at once: no batch may alias a slot
        assert len(got) == 12
        for (a_img, a_lab), (b_img, b_lab) in zip(expected, got, strict=True):
            assert torch.equal(a_lab, b_lab) and torch.equal(a_img, b_img)
    # an epoch left after 5 batches (tasks still in flight), then the next one in full
    ring.set_epoch(2)
    iterator = iter(ring)
    for _ in range(5):
        next(iterator)
    iterator.close()
    reference.set_epoch(3)
    ring.set_epoch(3)
    for (a_img, a_lab), (b_img, b_lab) in zip(reference, ring, strict=True):
        assert torch.equal(a_lab, b_lab) and torch.equal(a_img, b_img)
    ring.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_pinned_hand_over_delivers_the_cpu_loaders_batches(unique_shards, monkeypatch):
    # Worker slots reused out of order, copies on a side stream: each batch is used on the
    # default stream the moment it is yielded, so a hand-over that did not wait for its
    # copy, or a slot rewritten before its copy, would show as a differing batch.
    p = plan(micro=2, global_batch=8)
    _slow_first_worker(monkeypatch)
    cuda = torch.device("cuda")
    reference = data_mod.build_train_loader(data_cfg(unique_shards, 48), p, rank=1, seed=SEED, device=CPU)
    workers_decode = data_cfg(unique_shards, 48, num_workers=2, prefetch=1, decode="cpu")  # 'auto' decodes on the GPU
    on_gpu = data_mod.build_train_loader(workers_decode, p, rank=1, seed=SEED, device=cuda)
    for epoch in (0, 1):
        reference.set_epoch(epoch)
        on_gpu.set_epoch(epoch)
        got = [(images * 1.0, labels + 0) for images, labels in on_gpu]
        torch.cuda.synchronize()
        expected = list(reference)
        assert len(got) == len(expected) == 12
        for (a_img, a_lab), (b_img, b_lab) in zip(expected, got, strict=True):
            assert b_img.device.type == "cuda" and b_img.dtype == torch.float32 and b_img.is_contiguous()
            assert torch.equal(a_lab, b_lab.cpu())
            torch.testing.assert_close(b_img.cpu(), a_img, rtol=0, atol=1e-6)
    on_gpu.close()


def test_eval_through_the_ring_keeps_the_short_last_batch(unique_shards):
    # 20 records in batches of 3: the last batch holds 2 images of a 3-image slot
    kwargs = dict(batch_size=3, rank=0, world_size=1, device=CPU)
    plain = list(data_mod.build_eval_loader(data_cfg(unique_shards, 48), **kwargs))
    ring = list(data_mod.build_eval_loader(data_cfg(unique_shards, 48, num_workers=2, prefetch=1), **kwargs))
    assert [len(labels) for _, labels in ring] == [3] * 6 + [2]
    for (a_img, a_lab), (b_img, b_lab) in zip(plain, ring, strict=True):
        assert torch.equal(a_lab, b_lab) and torch.equal(a_img, b_img)


def test_a_ring_too_large_for_shared_memory_is_a_data_error_with_the_settings_to_change(monkeypatch):
    def refuse(self):
        raise RuntimeError("unable to write to file </torch_1_2_3>: No space left on device (28)")

    monkeypatch.setattr(torch.Tensor, "share_memory_", refuse)
    with pytest.raises(
        native.DataError, match=r"cannot allocate the loader's 3 MiB of shared memory \(9 slots of 32 images.*--shm-size.*data.prefetch"
    ):
        native.shared_ring(9, 32, 3, 56)  # 2.6 MiB
