"""``data.decode='device'``: the native loader's workers read and draw, the device decodes.

Against the CPU path (``data.decode='cpu'``) as the reference: the same samples, labels,
crop boxes and flips; the same pixels within a grey level where the CPU path decodes at
full size (on the CPU both paths decode with libjpeg-turbo; the device path resizes in
float and rounds, the CPU path resizes uint8); the same resume and the same refusals. The
CUDA cases (nvJPEG) carry the ``gpu`` marker and print the measured pixel difference.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path

import pytest
import torch

from largebatch import data as data_mod
from largebatch.batching import BatchPlan
from largebatch.data import device_decode, native
from largebatch.data.decode import crop_bounds
from largebatch.data.tfrecord import ShardSet
from largebatch.errors import DataError, UserError
from tests.data.conftest import data_cfg

CPU = torch.device("cpu")
SEED = 11
HAS_CUDA = torch.cuda.is_available()


def plan(micro: int = 8, global_batch: int = 16, samples: int = 48) -> BatchPlan:
    return BatchPlan.create(global_batch_size=global_batch, micro_batch_size=micro, world_size=1, num_samples=samples)


def grey_levels(images: torch.Tensor, cfg) -> torch.Tensor:
    """Normalised images back in grey levels (0-255), on the CPU."""
    mean = torch.tensor(cfg.mean).view(1, -1, 1, 1) * 255
    std = torch.tensor(cfg.std).view(1, -1, 1, 1) * 255
    return images.cpu() * std + mean


def epochs_of(loader, epochs=(0, 1)) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for epoch in epochs:
        loader.set_epoch(epoch)
        out += [(images.cpu(), labels.cpu()) for images, labels in loader]
    return out


def difference(cfg, reference, batches) -> torch.Tensor:
    """Absolute pixel differences in grey levels, after checking the labels are the same."""
    assert len(reference) == len(batches)
    for (_, ref_labels), (_, labels) in zip(reference, batches, strict=True):
        assert torch.equal(ref_labels, labels)
    return torch.cat(
        [(grey_levels(a, cfg) - grey_levels(b, cfg)).abs().flatten() for (a, _), (b, _) in zip(reference, batches, strict=True)]
    )


def test_auto_decodes_on_the_cpu_off_cuda_and_device_is_honoured_on_the_cpu(unique_shards):
    cfg = data_cfg(unique_shards, 48)
    assert cfg.decode == "auto"
    assert not data_mod.build_train_loader(cfg, plan(), rank=0, seed=SEED, device=CPU).decodes_on_device
    device = data_mod.build_train_loader(dataclasses.replace(cfg, decode="device"), plan(), rank=0, seed=SEED, device=CPU)
    assert device.decodes_on_device and device._ring is None
    for key, value in (("auto_augment", "rand-m9-mstd0.5-inc1"), ("color_jitter", 0.4), ("cache_decoded", True)):
        # policies on pixels in the workers keep 'auto' on the CPU path, even on CUDA (decided before any probe)
        assert not device_decode.decode_on_device(dataclasses.replace(cfg, **{key: value}), torch.device("cuda"))


def test_device_on_a_device_torchvision_cannot_decode_on_is_a_user_error(unique_shards):
    cfg = data_cfg(unique_shards, 48, decode="device")
    with pytest.raises(UserError, match="torchvision decodes JPEGs on the CPU and on CUDA \\(nvJPEG\\), not on 'hpu'") as caught:
        device_decode.decode_on_device(cfg, torch.device("hpu"))
    assert caught.value.key == "data.decode" and "set data.decode to 'cpu' or 'auto'" in str(caught.value)
    assert not device_decode.decode_on_device(dataclasses.replace(cfg, decode="auto"), torch.device("hpu"))


def record_cpu_crops(monkeypatch) -> list[tuple[tuple[int, int, int, int], bool]]:
    """The CPU path's crop bounds (in full-size pixels) and flips, in the order it crops."""
    seen = []
    original = native.crop_resize

    def recording(pixels, header, box, size, flip, out, mode):
        seen.append((crop_bounds(header, header, box), flip))
        return original(pixels, header, box, size, flip, out, mode)

    monkeypatch.setattr(native, "crop_resize", recording)
    return seen


def record_device_crops(monkeypatch) -> list[tuple[tuple[int, int, int, int], bool]]:
    """The crop bounds and flips the device path's workers hand over, in order."""
    seen = []
    original = native.decode_batch

    def recording(batch, *args):
        seen.extend((tuple(crop), bool(flip)) for crop, flip in zip(batch.crops.tolist(), batch.flips.tolist(), strict=True))
        return original(batch, *args)

    monkeypatch.setattr(native, "decode_batch", recording)
    return seen


def test_the_device_path_draws_the_cpu_paths_crops_and_flips(unique_shards, monkeypatch):
    """Three epochs of random crops (DCT scales 1 to 4 on the CPU path) and the evaluation
    split's centre crops: box for box and flip for flip the same, and both flips occur."""
    cfg = data_cfg(unique_shards, 48, image_size=16)
    cpu_seen, device_seen = record_cpu_crops(monkeypatch), record_device_crops(monkeypatch)
    for decode, seen in (("cpu", cpu_seen), ("device", device_seen)):
        run_cfg = dataclasses.replace(cfg, decode=decode)
        epochs_of(data_mod.build_train_loader(run_cfg, plan(), rank=0, seed=SEED, device=CPU), (0, 1, 2))
        list(data_mod.build_eval_loader(run_cfg, batch_size=8, rank=0, world_size=1, device=CPU))
        assert len(seen) == 3 * 48 + 20
    assert device_seen == cpu_seen
    assert {flip for _, flip in cpu_seen[:144]} == {False, True}


def test_same_pixels_as_the_cpu_path_where_it_decodes_at_full_size(unique_shards):
    """At 64 px every crop of the 48-96 px images decodes at full size on the CPU path: the
    two paths differ only by the resize's rounding (uint8 there, float here), at most one
    grey level; a crop or flip drawn differently would differ by tens."""
    cfg = data_cfg(unique_shards, 48, image_size=64)
    reference = epochs_of(data_mod.build_train_loader(cfg, plan(), rank=0, seed=SEED, device=CPU))
    on_device = epochs_of(data_mod.build_train_loader(dataclasses.replace(cfg, decode="device"), plan(), rank=0, seed=SEED, device=CPU))
    diff = difference(cfg, reference, on_device)
    assert float(diff.max()) <= 1.0 + 1e-3 and float(diff.mean()) < 0.5
    evaluation = [
        data_mod.build_eval_loader(c, batch_size=8, rank=0, world_size=1, device=CPU)
        for c in (cfg, dataclasses.replace(cfg, decode="device"))
    ]
    diff = difference(cfg, list(evaluation[0]), list(evaluation[1]))
    assert float(diff.max()) <= 1.0 + 1e-3


def test_at_reduced_dct_scales_the_difference_stays_small_on_average(unique_shards):
    """At 16 px the CPU path decodes most crops at 1/2 or 1/4 scale, the device path at full
    size then resizes: the mean difference stays within a few grey levels (docs/data.md)."""
    cfg = data_cfg(unique_shards, 48, image_size=16)
    reference = epochs_of(data_mod.build_train_loader(cfg, plan(), rank=0, seed=SEED, device=CPU))
    on_device = epochs_of(data_mod.build_train_loader(dataclasses.replace(cfg, decode="device"), plan(), rank=0, seed=SEED, device=CPU))
    diff = difference(cfg, reference, on_device)
    print(f"device path (CPU) against the CPU path at 16 px: max {float(diff.max()):.1f}, mean {float(diff.mean()):.2f} grey levels")
    assert 1.0 < float(diff.mean()) < 6.0  # above the full-size case's rounding: reduced scales are in play


def test_workers_hand_over_encoded_batches_and_resume_continues_at_the_next_micro_batch(unique_shards):
    """2 workers against none; a loader stopped after 2 micro-batches and resumed from its
    state yields the rest of the uninterrupted epoch, tensor for tensor."""
    cfg = data_cfg(unique_shards, 48, decode="device")
    p = plan(micro=4)
    reference = data_mod.build_train_loader(cfg, p, rank=0, seed=SEED, device=CPU)
    reference.set_epoch(1)
    expected = list(reference)
    workers = dataclasses.replace(cfg, num_workers=2, prefetch=1)
    first = data_mod.build_train_loader(workers, p, rank=0, seed=SEED, device=CPU)
    first.set_epoch(1)
    iterator = iter(first)
    head = [next(iterator) for _ in range(2)]
    state = first.state_dict()
    first.close()
    resumed = data_mod.build_train_loader(workers, p, rank=0, seed=SEED, device=CPU)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    got = head + list(resumed)
    resumed.close()
    assert len(got) == len(expected) == 12
    for (a_img, a_lab), (b_img, b_lab) in zip(expected, got, strict=True):
        assert torch.equal(a_lab, b_lab) and torch.equal(a_img, b_img)


def test_grey_fashion_mnist_on_the_device_path(fmnist_shards):
    cfg = data_cfg(fmnist_shards, 10, channels=1, mean=(0.286,), std=(0.353,), label_offset=0, image_size=28)
    p = plan(micro=16, global_batch=32, samples=64)
    reference = epochs_of(data_mod.build_train_loader(cfg, p, rank=0, seed=0, device=CPU), (0,))
    on_device = epochs_of(data_mod.build_train_loader(dataclasses.replace(cfg, decode="device"), p, rank=0, seed=0, device=CPU), (0,))
    assert on_device[0][0].shape == (16, 1, 28, 28)
    assert float(difference(cfg, reference, on_device).max()) <= 1.0 + 1e-3


def truncated(root: Path, record: int) -> tuple[str, Path]:
    """Rewrite training record ``record`` with its JPEG cut in half (the header still parses)."""
    from largebatch.data.example import decode_example
    from tests.data.conftest import rewrite_record

    shards = ShardSet(root, "train")
    shard, number = shards.locate(record)
    jpeg = decode_example(shards.read(record))["image/encoded"][0]
    rewrite_record(shards.paths[shard], number, {"image/encoded": [jpeg[: len(jpeg) // 2]]})
    return ShardSet(root, "train").where(record), shards.paths[shard]


def cut_jpeg_error(root: Path, device: torch.device, decode: str) -> str:
    where, _ = truncated(root, 5)
    cfg = data_cfg(root, 16, decode=decode)
    with pytest.raises(DataError) as caught:
        list(data_mod.build_train_loader(cfg, plan(samples=16), rank=0, seed=0, device=device))
    message = str(caught.value)
    assert message.startswith(f"{where}: JPEG does not decode (")
    return message


@pytest.fixture
def small_shards(tmp_path) -> Path:
    from tests.data.conftest import write_unique_label_shards

    return write_unique_label_shards(tmp_path / "shards", {"train": 16}, {"train": 2})


@pytest.mark.parametrize("decode", ["cpu", "device"])
def test_a_cut_jpeg_is_named_by_both_paths(small_shards, decode):
    message = cut_jpeg_error(small_shards, CPU, decode)
    assert ".cpp:" not in message  # torchvision's source location is not part of the line


# -- on a CUDA GPU: nvJPEG -----------------------------------------------------------------


def real_shards() -> Path | None:
    """The repository's Fashion-MNIST shards (made by data/prepare_fmnist.py), if present."""
    root = Path(__file__).resolve().parents[2] / "data" / "fashion-mnist"
    return root if (root / "dataset.json").is_file() else None


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("image_size", [64, 16])
def test_on_a_gpu_nvjpeg_gives_the_cpu_paths_samples_within_a_measured_difference(unique_shards, image_size):
    """nvJPEG against the CPU path on the same records, crops and flips: labels equal, the
    pixel difference printed (the GPU check's log keeps it) and small on average."""
    cuda = torch.device("cuda")
    cfg = data_cfg(unique_shards, 48, image_size=image_size)
    reference = epochs_of(data_mod.build_train_loader(cfg, plan(), rank=0, seed=SEED, device=CPU))
    gpu_cfg = dataclasses.replace(cfg, num_workers=2)
    loader = data_mod.build_train_loader(gpu_cfg, plan(), rank=0, seed=SEED, device=cuda)
    assert loader.decodes_on_device  # 'auto' on CUDA
    diff = difference(cfg, reference, epochs_of(loader))
    loader.close()
    print(f"nvJPEG against the CPU path at {image_size} px: max {float(diff.max()):.1f}, mean {float(diff.mean()):.3f} grey levels")
    assert float(diff.mean()) < (2.0 if image_size == 64 else 6.0)


ON_CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")])


@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
def test_real_fashion_mnist_records_decode_on_the_device_as_on_the_cpu(device):
    """The first 1,024 records of the repository's Fashion-MNIST validation shards through
    the evaluation loader: the device path (libjpeg-turbo on the CPU, nvJPEG on CUDA) against
    the CPU path; the difference is printed (the GPU check's log keeps it)."""
    root = real_shards()
    if root is None:
        pytest.skip("data/fashion-mnist is not prepared (python data/prepare_fmnist.py)")
    cfg = data_cfg(root, 10, channels=1, mean=(0.286,), std=(0.353,), label_offset=0, image_size=28)
    batches = [
        [(images.cpu(), labels.cpu()) for images, labels in itertools.islice(loader, 4)]
        for loader in (
            data_mod.build_eval_loader(cfg, batch_size=256, rank=0, world_size=1, device=CPU),
            data_mod.build_eval_loader(
                dataclasses.replace(cfg, decode="device"), batch_size=256, rank=0, world_size=1, device=torch.device(device)
            ),
        )
    ]
    diff = difference(cfg, *batches)
    print(f"{device} decode against the CPU path, 1,024 Fashion-MNIST records: max {float(diff.max()):.1f}, mean {float(diff.mean()):.3f}")
    if device == "cpu":  # the same decoder: the resize's rounding only
        assert float(diff.max()) <= 1.0 + 1e-3
    assert float(diff.mean()) < (0.5 if device == "cpu" else 2.0)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_on_a_gpu_a_cut_jpeg_is_named_not_decoded(small_shards):
    """nvJPEG must refuse a JPEG cut in half as libjpeg-turbo does, naming the record."""
    message = cut_jpeg_error(small_shards, torch.device("cuda"), "device")
    assert re.search(r"record 5 at byte offset \d+", message)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_on_a_gpu_a_jpeg_nvjpeg_refuses_is_decoded_on_the_cpu_and_named_once(unique_shards, monkeypatch, capfd):
    """nvJPEG lacks some chroma layouts libjpeg-turbo reads: such a JPEG (here: record 3,
    refused by a wrapper around the real decoder) is decoded on the CPU, not a stopped run."""
    cfg = data_cfg(unique_shards, 48, image_size=64)
    refused = ShardSet(unique_shards, "train").read(3)  # the payload holds the JPEG's bytes
    original = device_decode._decode_jpegs

    def nvjpeg_refusing_record_3(jpegs, channels, device):
        if device.type == "cuda" and any(bytes(j.numpy()) in refused for j in jpegs):
            raise RuntimeError("Error while decoding JPEG images: Unknown chroma subsampling")
        return original(jpegs, channels, device)

    monkeypatch.setattr(device_decode, "_decode_jpegs", nvjpeg_refusing_record_3)
    reference = epochs_of(data_mod.build_train_loader(cfg, plan(), rank=0, seed=SEED, device=CPU))
    loader = data_mod.build_train_loader(dataclasses.replace(cfg, decode="device"), plan(), rank=0, seed=SEED, device=torch.device("cuda"))
    diff = difference(cfg, reference, epochs_of(loader))
    assert float(diff.mean()) < 2.0
    warnings = [line for line in capfd.readouterr().err.splitlines() if "decoded on the CPU" in line]
    assert len(warnings) == 1 and "record 3 at byte offset" in warnings[0] and "Unknown chroma subsampling" in warnings[0]
