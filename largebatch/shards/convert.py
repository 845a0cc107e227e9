"""Write TFRecord shards with the ImageNet schema (``largebatch.shards.verify`` checks them).

Each record is a ``tf.train.Example`` with the features of TensorFlow's ImageNet
converter (``models/research/inception/inception/data/build_imagenet_data.py``):

=====================  ==========  ==================================================
``image/encoded``      bytes       the JPEG
``image/format``       bytes       ``b'JPEG'``
``image/class/label``  int64       class number + ``label_offset`` (ImageNet: 1..1000)
``image/class/text``   bytes       class name (the synset folder name for ImageNet)
``image/height``       int64       pixels
``image/width``        int64       pixels
``image/colorspace``   bytes       ``b'RGB'`` or ``b'Gray'``
``image/channels``     int64       3 or 1
``image/filename``     bytes       the source file's name
=====================  ==========  ==================================================

Sources: an ImageNet-style folder (``train/<class>/*``, ``val/<class>/*``; classes in
sorted folder-name order; JPEGs are stored as they are, other formats and CMYK JPEGs are
re-encoded as RGB JPEG) and Debian's ``dataset-fashion-mnist`` package (idx files,
encoded as grayscale JPEG). Training records are shuffled with a fixed seed before
sharding (as the ImageNet converter does) so every shard holds a mix of classes; the
output is byte-for-byte deterministic.

Each shard is written to a temporary file, fsynced and renamed, index first, so a shard
with its index in place is complete; a re-run skips those. ``dataset.json`` beside the
shards records classes, label offset, record counts and a fingerprint of the source (each
file's path, size and modification time, or Fashion-MNIST's pixels, with the labels) and
of the options; it is written as ``dataset.json.partial`` before the first shard. A re-run
keeps finished shards only when all of these match: into a folder holding another
conversion's shards it stops, naming what differs, unless ``force`` removes them first (the
result is then byte for byte a fresh conversion's).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import simplejpeg
from tqdm import tqdm

from largebatch.config.schema import default_of
from largebatch.data.size_limit import too_large
from largebatch.data.tfrecord import INDEX_SUFFIX, SHARD_NAME_PATTERN, index_path_for, shard_name
from largebatch.errors import DataError
from largebatch.shards import FASHION_MNIST_DIR
from largebatch.shards.pool import Tick, run_jobs
from largebatch.shards.records import TFRecordWriter, encode_example, write_index

META_FILE = "dataset.json"
TRAIN_SHUFFLE_SEED = 12345
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
MAX_PIXELS: int = default_of("data.max_pixels")  # the loaders' limit, the converter's default
IMAGE_EXTENSIONS = {".jpeg", ".jpg", ".png", ".bmp", ".ppm", ".tif", ".tiff", ".webp"}


@dataclasses.dataclass(frozen=True)
class Sample:
    """One image to write: where its pixels come from, its 0-based class and its name."""

    source: object  # a Path, or the pixels (an array); what the encoder reads
    label: int
    filename: str


def _jpeg_of_file(path: Path, quality: int, max_pixels: int = MAX_PIXELS) -> tuple[bytes, int, int, str]:
    """The file's JPEG bytes (re-encoded only when needed), height, width and colorspace.

    Raises:
        DataError: the file is not a readable image, or its header says it has more than
            ``max_pixels`` pixels (checked before anything is decoded).
    """
    data = path.read_bytes()
    if data[:2] == b"\xff\xd8":
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError as err:
            raise DataError(f"not a readable JPEG: {err}", path=str(path)) from err
        _check_pixels(path, height, width, max_pixels)
        if colorspace in ("Gray", "YCbCr", "RGB"):
            return data, height, width, "Gray" if colorspace == "Gray" else "RGB"
    from PIL import Image, UnidentifiedImageError  # only for non-JPEG or CMYK sources

    try:
        with Image.open(io.BytesIO(data)) as image:  # reads the header only
            _check_pixels(path, image.height, image.width, max_pixels)
            pixels = np.asarray(image.convert("RGB"))
    except DataError:
        raise
    except UnidentifiedImageError as err:  # its text names an in-memory file object
        raise DataError(f"cannot read image: not an image format Pillow knows ({len(data)} bytes)", path=str(path)) from err
    except Exception as err:
        raise DataError(f"cannot read image: {err}", path=str(path)) from err
    encoded = simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=quality, colorspace="RGB")
    return encoded, pixels.shape[0], pixels.shape[1], "RGB"


def _check_pixels(path: Path, height: int, width: int, max_pixels: int) -> None:
    if height * width > max_pixels:
        raise DataError(too_large(height, width, max_pixels, "--max-pixels"), path=str(path))


def make_example(
    jpeg: bytes,
    height: int,
    width: int,
    colorspace: str,
    label: int,
    text: str,
    filename: str,
) -> bytes:
    """Serialise one record of the ImageNet schema (``label`` already offset)."""
    return encode_example(
        {
            "image/encoded": jpeg,
            "image/format": b"JPEG",
            "image/class/label": int(label),
            "image/class/text": text,
            "image/height": int(height),
            "image/width": int(width),
            "image/colorspace": colorspace,
            "image/channels": 1 if colorspace == "Gray" else 3,
            "image/filename": filename,
        }
    )


def shard_bounds(count: int, num_shards: int) -> list[int]:
    """Start of each shard's slice (plus the end): sizes differ by at most one record."""
    return [count * k // num_shards for k in range(num_shards + 1)]


def _shard_done(path: Path) -> bool:
    return path.is_file() and index_path_for(path).is_file()


def split_jobs(
    out: Path,
    split: str,
    samples: Sequence[Sample],
    num_shards: int,
    encode: Callable[[Sample], bytes],
    progress: tqdm | None = None,
) -> list[tuple]:
    """:func:`write_shard`'s arguments for each unfinished shard of ``split`` (a finished
    one moves ``progress`` on by its records)."""
    num_shards = max(1, min(num_shards, len(samples)))
    bounds = shard_bounds(len(samples), num_shards)
    jobs = []
    for number in range(num_shards):
        path = out / shard_name(split, number, num_shards)
        chunk = samples[bounds[number] : bounds[number + 1]]
        if _shard_done(path):
            if progress is not None:
                progress.update(len(chunk))
            continue
        jobs.append((path, chunk, encode))
    return jobs


def write_shard(path: Path, samples: Sequence[Sample], encode: Callable[[Sample], bytes], tick: Tick) -> None:
    """Write one shard: a temporary file, fsynced, its index, then the rename."""
    tmp = path.with_name(path.name + ".tmp")
    with TFRecordWriter(tmp) as writer:
        for sample in samples:
            writer.write(encode(sample))
            tick(1)
        writer.close(fsync=True)
    # Index first, shard last: a shard file present means its index is too.
    write_index(index_path_for(path), writer.index)
    os.replace(tmp, path)


def no_bar(progress: bool | None) -> bool | None:
    """tqdm's ``disable``: ``None`` lets tqdm show the bar only on a terminal."""
    return None if progress is None else not progress


def _write_meta(out: Path, meta: dict, name: str = META_FILE) -> None:
    tmp = out / (META_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out / name)


def _limit(samples: list[Sample], limit: int | None) -> list[Sample]:
    return samples if limit is None else samples[:limit]


def scan_image_folder(src: Path, val_labels: str | os.PathLike | None = None) -> tuple[list[str], dict[str, list[Sample]]]:
    """Classes (sorted folder names of ``train/``) and the samples of each split found.

    ``val/`` (or ``validation/``) holds ``<class>/`` folders, or, as ImageNet's validation
    archive unpacks, the images themselves with their classes in ``val_labels``: either
    one class folder name per line in file-name order (TensorFlow's
    ``imagenet_2012_validation_synset_labels.txt``) or a CSV with ``ImageId`` (the file
    name without its extension) and ``PredictionString`` (the class first), as Kaggle's
    ``LOC_val_solution.csv``. Both layouts give the same samples in the same order.

    Raises:
        DataError: when ``src/train`` is missing or empty, ``val/`` names a class that
            ``train/`` lacks, or a flat ``val/`` has no (or a mismatched) labels file.
    """
    train_dir = src / "train"
    if not train_dir.is_dir():
        raise DataError(
            "expected an ImageNet-style folder with train/<class>/ images",
            path=str(src),
        )
    classes = sorted(p.name for p in train_dir.iterdir() if p.is_dir())
    if not classes:
        raise DataError("no class folders under train/", path=str(train_dir))
    number = {name: i for i, name in enumerate(classes)}
    splits: dict[str, list[Sample]] = {}
    for folder, split in (
        ("train", "train"),
        ("val", "validation"),
        ("validation", "validation"),
    ):
        split_dir = src / folder
        if not split_dir.is_dir() or split in splits:
            continue
        samples = []
        for class_dir in sorted(p for p in split_dir.iterdir() if p.is_dir()):
            if class_dir.name not in number:
                raise DataError(
                    f"class folder {class_dir.name!r} is not in train/",
                    path=str(class_dir),
                )
            for image in sorted(class_dir.iterdir()):
                if image.suffix.lower() in IMAGE_EXTENSIONS:
                    samples.append(Sample(image, number[class_dir.name], image.name))
        if split == "validation":  # class folders, or loose images labelled by val_labels
            loose = sorted(p for p in split_dir.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
            if samples and (loose or val_labels is not None):
                what = "loose images" if loose else "no loose images for --val-labels to label"
                raise DataError(
                    f"holds class folders and {what}; use one layout: class folders, or images and --val-labels", path=str(split_dir)
                )
            if loose:
                samples = _labelled_images(split_dir, loose, val_labels, number)
        if not samples:
            raise DataError("no images found", path=str(split_dir))
        splits[split] = samples
    if val_labels is not None and "validation" not in splits:
        raise DataError("--val-labels given, but there is no val/ folder", path=str(src))
    return classes, splits


def _labelled_images(split_dir: Path, images: list[Path], labels_file: str | os.PathLike | None, number: dict[str, int]) -> list[Sample]:
    """A flat validation folder's samples, classes from ``labels_file`` (see
    :func:`scan_image_folder`), ordered as the class-folder layout orders them."""
    if labels_file is None:
        raise DataError(
            f"holds {len(images)} images and no class folders; give their classes with --val-labels FILE "
            "(one class folder name per line in file-name order, as TensorFlow's "
            "imagenet_2012_validation_synset_labels.txt, or Kaggle's LOC_val_solution.csv)",
            path=str(split_dir),
        )
    path = Path(labels_file)
    if not path.is_file():
        raise DataError("labels file not found", path=str(path))
    lines = path.read_text().splitlines()
    if lines and lines[0].replace(" ", "").startswith("ImageId,PredictionString"):
        by_stem = {}
        for line_number, line in enumerate(lines[1:], start=2):
            if line.strip():
                image_id, _, prediction = line.partition(",")
                by_stem[image_id.strip()] = (prediction.split() or [""])[0], line_number
        labelled = []
        for image in images:
            if image.stem not in by_stem:
                raise DataError(f"no row for {image.name} (ImageId {image.stem})", path=str(path))
            labelled.append((image, *by_stem[image.stem]))
    else:
        names = [(line.strip(), n) for n, line in enumerate(lines, start=1) if line.strip()]
        if len(names) != len(images):
            raise DataError(
                f"{len(names)} class names for the {len(images)} images in {split_dir}; "
                "it should have one line per image, in file-name order",
                path=str(path),
            )
        labelled = [(image, name, n) for image, (name, n) in zip(images, names)]
    samples = []
    for image, name, line_number in labelled:
        if name.isdigit() and name not in number:
            raise DataError(
                f"line {line_number}: {name!r} is a class number, not a class folder name: this looks like the "
                "devkit's ILSVRC2012_validation_ground_truth.txt, whose numbers follow the devkit's own class order; "
                "give TensorFlow's imagenet_2012_validation_synset_labels.txt or Kaggle's LOC_val_solution.csv",
                path=str(path),
            )
        if name not in number:
            raise DataError(f"line {line_number}: class {name!r} (for {image.name}) is not a folder in train/", path=str(path))
        samples.append(Sample(image, number[name], image.name))
    return sorted(samples, key=lambda sample: (sample.label, sample.filename))


def _shuffled(samples: list[Sample]) -> list[Sample]:
    order = np.random.RandomState(TRAIN_SHUFFLE_SEED).permutation(len(samples))
    return [samples[i] for i in order]


@dataclasses.dataclass(frozen=True)
class FolderEncoder:
    """An image file's record (picklable, for worker processes)."""

    classes: tuple[str, ...]
    label_offset: int
    quality: int
    max_pixels: int

    def __call__(self, sample: Sample) -> bytes:
        assert isinstance(sample.source, Path)
        jpeg, height, width, colorspace = _jpeg_of_file(sample.source, self.quality, self.max_pixels)
        return make_example(
            jpeg,
            height,
            width,
            colorspace,
            sample.label + self.label_offset,
            self.classes[sample.label],
            sample.filename,
        )


def convert_image_folder(
    src: str | os.PathLike,
    out: str | os.PathLike,
    *,
    train_shards: int = 1024,
    validation_shards: int = 128,
    label_offset: int = 1,
    limit: int | None = None,
    quality: int = 95,
    progress: bool | None = None,
    max_pixels: int = MAX_PIXELS,
    workers: int = 1,
    val_labels: str | os.PathLike | None = None,
    force: bool = False,
) -> dict:
    """Convert ``src/train/<class>/*`` (and ``src/val/<class>/*``) into shards under ``out``.

    Args:
        src: the image folder.
        out: where shards, index files and ``dataset.json`` go (created).
        train_shards, validation_shards: shards per split (fewer when a split has fewer
            images than shards).
        label_offset: added to the 0-based class number (ImageNet's TFRecords count from 1).
        limit: keep only the first ``limit`` records of each split (after shuffling), for tests.
        quality: JPEG quality for images that must be re-encoded.
        progress: show a progress bar (``None``: when stderr is a terminal).
        max_pixels: the largest image (height x width) accepted, read from its header
            before decoding; the loaders' ``data.max_pixels`` by default.
        workers: shards written at once, each in a process of its own; the output is the
            same for any number.
        val_labels: the classes of a flat ``val/`` folder (see :func:`scan_image_folder`).
        force: replace the shards of another conversion found in ``out`` (see
            :func:`check_out`) instead of refusing.

    Returns:
        The metadata written to ``dataset.json``.

    Raises:
        DataError: an unreadable image, or one above ``max_pixels`` (naming the file);
            the first in shard order, whatever ``workers`` is; ``out`` holds the shards of
            another conversion and ``force`` is not set.
    """
    src, out = Path(src), Path(out)
    classes, splits = scan_image_folder(src, val_labels)
    splits = {s: _limit(_shuffled(v) if s == "train" else v, limit) for s, v in splits.items()}
    encode = FolderEncoder(tuple(classes), label_offset, quality, max_pixels)
    shards = {"train": train_shards, "validation": validation_shards}
    inputs = Inputs(src, quality, limit)
    return _convert(out, "image-folder", str(src), classes, splits, shards, encode, label_offset, 3, progress, workers, inputs, force)


def _read_idx(path: Path, magic: int, header: int) -> np.ndarray:
    if not path.is_file():
        raise DataError(
            "Fashion-MNIST file missing; run `python data/prepare_fmnist.py` (it installs Debian's dataset-fashion-mnist and converts it)",
            path=str(path),
        )
    with gzip.open(path, "rb") as fh:
        raw = fh.read()
    if int.from_bytes(raw[:4], "big") != magic:
        raise DataError(
            f"not an idx file (magic {raw[:4].hex()}, expected {magic:08x})",
            path=str(path),
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header)


def load_fashion_mnist(
    src: str | os.PathLike = FASHION_MNIST_DIR,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{'train': (images, labels), 'validation': ...}`` from the Debian package's idx files."""
    src = Path(src)
    out = {}
    for prefix, split in (("train", "train"), ("t10k", "validation")):
        images = _read_idx(src / f"{prefix}-images-idx3-ubyte.gz", 0x00000803, 16).reshape(-1, 28, 28)
        labels = _read_idx(src / f"{prefix}-labels-idx1-ubyte.gz", 0x00000801, 8)
        if len(images) != len(labels):
            raise DataError(f"{len(images)} images but {len(labels)} labels", path=str(src))
        out[split] = (images, labels)
    return out


@dataclasses.dataclass(frozen=True)
class GrayEncoder:
    """A record of a 28x28 grayscale array (``Sample.source``), encoded as JPEG (picklable)."""

    classes: tuple[str, ...]
    label_offset: int
    quality: int

    def __call__(self, sample: Sample) -> bytes:
        assert isinstance(sample.source, np.ndarray)
        pixels = np.ascontiguousarray(sample.source[:, :, None])
        jpeg = simplejpeg.encode_jpeg(pixels, quality=self.quality, colorspace="GRAY")
        height, width = sample.source.shape
        return make_example(
            jpeg,
            height,
            width,
            "Gray",
            sample.label + self.label_offset,
            self.classes[sample.label],
            sample.filename,
        )


def convert_fashion_mnist(
    out: str | os.PathLike,
    *,
    src: str | os.PathLike = FASHION_MNIST_DIR,
    train_shards: int = 8,
    validation_shards: int = 2,
    label_offset: int = 0,
    limit: int | None = None,
    quality: int = 95,
    progress: bool | None = None,
    workers: int = 1,
    force: bool = False,
) -> dict:
    """Convert Debian's Fashion-MNIST package into grayscale-JPEG shards under ``out``.

    Arguments as for :func:`convert_image_folder`; the source keeps its own order.
    """
    out = Path(out)
    arrays = load_fashion_mnist(src)
    prefixes = {"train": "train", "validation": "t10k"}
    splits = {
        split: _limit(
            [Sample(images[i], int(labels[i]), f"{prefixes[split]}-{i:05d}.jpg") for i in range(len(labels))],
            limit,
        )
        for split, (images, labels) in arrays.items()
    }
    encode = GrayEncoder(FASHION_MNIST_CLASSES, label_offset, quality)
    shards = {"train": train_shards, "validation": validation_shards}
    return _convert(
        out,
        "fashion-mnist",
        str(src),
        list(FASHION_MNIST_CLASSES),
        splits,
        shards,
        encode,
        label_offset,
        1,
        progress,
        workers,
        Inputs(Path(src), quality, limit),
        force,
    )


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What a conversion's bytes depend on besides what ``dataset.json`` lists (classes,
    label offset, records and shards per split): the source's files and the options."""

    src: Path
    quality: int
    limit: int | None

    def fingerprint(self, splits: dict[str, Sequence[Sample]]) -> dict:
        """``dataset.json``'s ``fingerprint``: a digest of every sample's source (a file's
        path under ``src``, size and modification time; an array's pixels), label and
        split, with the options."""
        digest = hashlib.sha256()
        for split, samples in splits.items():
            for sample in samples:
                if isinstance(sample.source, Path):
                    stat = sample.source.stat()
                    name = os.path.relpath(sample.source, self.src)
                    item = [split, name, sample.label, stat.st_size, stat.st_mtime_ns]
                else:
                    item = [split, sample.filename, sample.label, hashlib.sha256(np.ascontiguousarray(sample.source)).hexdigest()]
                digest.update(json.dumps(item).encode() + b"\n")
        return {"sources": digest.hexdigest(), "quality": self.quality, "limit": self.limit}


def _differences(old: dict, new: dict) -> list[str]:
    """How the conversion ``old`` (a ``dataset.json``) differs from ``new``, in words."""
    found = []
    if old.get("source") != new["source"]:
        found.append(f"source {old.get('source')!r}, now {new['source']!r}")
    if old.get("classes") != new["classes"]:
        before, now = list(old.get("classes") or []), new["classes"]
        first = next((f"{a!r} -> {b!r}" for a, b in zip(before, now) if a != b), "the same first ones")
        found.append(f"classes ({len(before)} -> {len(now)}; {first})")
    if old.get("label_offset") != new["label_offset"]:
        found.append(f"label_offset {old.get('label_offset')} -> {new['label_offset']}")
    for split in sorted(set(old.get("splits") or {}) | set(new["splits"])):
        a, b = (old.get("splits") or {}).get(split, {}), new["splits"].get(split, {})
        if a != b:
            found.append(
                f"{split}: {a.get('records', 0)} records in {a.get('shards', 0)} shards -> {b.get('records', 0)} in {b.get('shards', 0)}"
            )
    recorded = old.get("fingerprint")
    if recorded is not None:  # written by a largebatch that records it
        if recorded.get("sources") != new["fingerprint"]["sources"]:
            found.append("the source's files (names, sizes or modification times) or their labels")
        for option in ("quality", "limit"):
            if recorded.get(option) != new["fingerprint"][option]:
                found.append(f"--{option} {recorded.get(option)} -> {new['fingerprint'][option]}")
    return found


def _written_files(out: Path) -> list[Path]:
    """The files of ``out`` a conversion writes: shards, their indexes, their temporaries."""
    return sorted(
        p
        for p in out.iterdir()
        if SHARD_NAME_PATTERN.match(p.name.removesuffix(".tmp").removesuffix(INDEX_SUFFIX))
        or p.name in (META_FILE, PARTIAL_META, META_FILE + ".tmp")
    )


PARTIAL_META = META_FILE + ".partial"  # a conversion's dataset.json while its shards are written


def check_out(out: Path, meta: dict, force: bool) -> None:
    """Make sure the shards already in ``out`` are this conversion's: a re-run after an
    interruption keeps its finished shards, but shards of another source, other classes,
    record counts or options are never kept beside a ``dataset.json`` that describes
    others. With ``force`` they are removed (and the conversion starts afresh).

    Raises:
        DataError: ``out`` holds another conversion's shards (naming what differs) and
            ``force`` is not set.
    """
    existing = _written_files(out)
    if not existing:
        return
    try:
        recorded = read_meta(out) or _read_json(out / PARTIAL_META)
    except DataError as err:
        if not force:
            raise
        recorded, differs = None, [err.message]
    else:
        if recorded is None and not any(SHARD_NAME_PATTERN.match(p.name) for p in existing):
            recorded = meta  # temporaries alone: nothing was finished
        differs = ["it holds shards that no dataset.json describes"] if recorded is None else _differences(recorded, meta)
    if not differs:
        return
    if not force:
        raise DataError(
            f"holds the shards of another conversion ({'; '.join(differs)}); keeping them would mix two datasets: "
            "give another --out, or --force to replace them",
            path=str(out),
        )
    for path in existing:
        path.unlink()
    print(f"{out}: removed {len(existing)} files of another conversion ({'; '.join(differs)}); converting afresh", flush=True)


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DataError(f"not valid JSON: {err}; remove it, or convert into another --out", path=str(path)) from err


def _convert(out, source, src, classes, splits, shards, encode, label_offset, channels, progress, workers, inputs, force) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    total = sum(len(v) for v in splits.values())
    meta = {
        "source": source,
        "source_path": src,
        "num_classes": len(classes),
        "label_offset": label_offset,
        "channels": channels,
        "classes": classes,
        "splits": {
            split: {"shards": max(1, min(shards[split], len(samples))), "records": len(samples)} for split, samples in splits.items()
        },
        "fingerprint": inputs.fingerprint(splits),
    }
    check_out(out, meta, force)
    if not (out / META_FILE).is_file():  # the conversion is named before its first shard
        _write_meta(out, meta, PARTIAL_META)
    with tqdm(total=total, unit="img", desc=f"convert {source}", disable=no_bar(progress)) as bar:
        jobs = []
        for split, samples in splits.items():
            jobs += split_jobs(out, split, samples, meta["splits"][split]["shards"], encode, bar)
        run_jobs(write_shard, jobs, workers=workers, bar=bar)
    _write_meta(out, meta)
    (out / PARTIAL_META).unlink(missing_ok=True)
    return meta


def read_meta(root: str | os.PathLike) -> dict | None:
    """``dataset.json`` of a shard folder, or ``None`` when absent."""
    return _read_json(Path(root) / META_FILE)
