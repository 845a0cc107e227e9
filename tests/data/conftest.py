"""Small shard sets built once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from largebatch.config.sections import DataConfig
from largebatch.config.typed import section
from largebatch.shards import FASHION_MNIST_DIR, convert
from largebatch.shards.convert import Sample, make_example, split_jobs, write_shard
from largebatch.shards.pool import run_jobs

FASHION_MNIST = Path(FASHION_MNIST_DIR)


def write_split(out: Path, split: str, samples: list[Sample], num_shards: int, encode) -> None:
    """``samples`` as ``num_shards`` shards of ``split``, as the converter writes them (in this process)."""
    run_jobs(write_shard, split_jobs(out, split, samples, num_shards, encode))


def noise_jpeg(rng: np.random.Generator, height: int, width: int, channels: int = 3) -> bytes:
    """A JPEG of smooth colour noise with a bright rectangle: photo-like, not static."""
    small = rng.integers(0, 256, size=(height // 16 + 2, width // 16 + 2, channels), dtype=np.uint8)
    image = Image.fromarray(small[:, :, 0] if channels == 1 else small)
    pixels = np.asarray(image.resize((width, height), Image.BICUBIC)).copy()
    top, left = rng.integers(0, height // 2), rng.integers(0, width // 2)
    pixels[top : top + height // 3, left : left + width // 3] = 230
    if channels == 1:
        pixels = pixels[:, :, None]
    return simplejpeg.encode_jpeg(
        np.ascontiguousarray(pixels),
        quality=90,
        colorspace="GRAY" if channels == 1 else "RGB",
    )


def header_claiming(jpeg: bytes, height: int, width: int) -> bytes:
    """``jpeg`` with its frame header (SOF0) claiming ``height`` x ``width``: what a decoder
    would allocate for, though the data holds the small image."""
    at = jpeg.index(b"\xff\xc0")  # marker, length (2), precision (1), height (2), width (2)
    return jpeg[: at + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + jpeg[at + 9 :]


def write_unique_label_shards(
    root: Path,
    counts: dict[str, int],
    shards: dict[str, int],
    *,
    seed: int = 0,
    label_offset: int = 1,
    replace: dict[int, bytes] | None = None,
) -> Path:
    """Shards whose record ``i`` has label ``i + label_offset``: labels identify samples.
    ``replace`` gives some records' JPEG bytes (by record number, in every split)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for split, count in counts.items():
        jpegs = [noise_jpeg(rng, int(rng.integers(48, 96)), int(rng.integers(48, 96))) for _ in range(count)]
        for i, jpeg in (replace or {}).items():
            jpegs[i] = jpeg
        samples = [Sample(i, i, f"{split}-{i}.jpg") for i in range(count)]

        def encode(sample: Sample, jpegs=jpegs) -> bytes:
            height, width = simplejpeg.decode_jpeg_header(jpegs[sample.source])[:2]
            jpeg = jpegs[sample.source]
            return make_example(
                jpeg,
                height,
                width,
                "RGB",
                sample.label + label_offset,
                str(sample.label),
                sample.filename,
            )

        write_split(root, split, samples, shards[split], encode)
    return root


def rewrite_record(shard: Path, record: int, features: dict) -> None:
    """Rewrite ``shard`` (and its index) with record ``record``'s features replaced by
    ``features``, written as they are (a float label, an int64 image)."""
    from largebatch.data.example import decode_example
    from largebatch.data.tfrecord import index_path_for
    from largebatch.shards.records import TFRecordWriter, encode_example, iter_records, write_index

    payloads = [decode_example(data) for _, _, data in iter_records(shard)]
    payloads[record] = {**payloads[record], **features}
    with TFRecordWriter(shard) as writer:
        for payload in payloads:
            writer.write(encode_example(payload))
    write_index(index_path_for(shard), writer.index)


@pytest.fixture(scope="session")
def unique_shards(tmp_path_factory) -> Path:
    """48 train records in 4 shards and 20 validation records in 3; label = record + 1."""
    root = tmp_path_factory.mktemp("unique")
    return write_unique_label_shards(root, {"train": 48, "validation": 20}, {"train": 4, "validation": 3})


def data_cfg(root: Path, num_classes: int, **overrides) -> DataConfig:
    """The ``data`` section for shards at ``root`` (typed, as loaders take it)."""
    cfg = {
        "loader": "native",
        "root": str(root),
        "train_split": "train",
        "eval_split": "validation",
        "image_size": 32,
        "channels": 3,
        "num_classes": num_classes,
        "label_offset": 1,
        "mean": (0.485, 0.456, 0.406),
        "std": (0.229, 0.224, 0.225),
        "num_workers": 0,
        "prefetch": 2,
        "scale": (0.08, 1.0),
        "ratio": (3 / 4, 4 / 3),
        "hflip": 0.5,
        "auto_augment": None,
        "color_jitter": None,
        "reprob": 0.0,
        "remode": "pixel",
        "recount": 1,
        "repeated_aug": 1,
        "eval_crop_ratio": 0.875,
        "verify_crc": True,
    }
    cfg.update(overrides)
    return section("data", cfg)


@pytest.fixture(scope="session")
def fmnist_shards(tmp_path_factory) -> Path:
    if not (FASHION_MNIST / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"Fashion-MNIST not installed at {FASHION_MNIST} (apt-get install dataset-fashion-mnist)")
    root = tmp_path_factory.mktemp("fmnist")
    convert.convert_fashion_mnist(root, limit=64, train_shards=4, validation_shards=2, progress=False)
    return root


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))
