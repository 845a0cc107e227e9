"""The NVIDIA DALI loader: ``fn.readers.tfrecord`` over the same shards and index files.

DALI is imported only here, only when this loader is asked for
(``pip install -e .[dali]``, i.e. ``nvidia-dali-cuda130``, built for the CUDA major of the pinned torch wheel).

**Same samples as every other loader.** DALI's TFRecord reader reads the records listed
in its index files, in index order, one ``(path, index_path)`` pair after another, and it
accepts the same shard more than once with different index files. So, per epoch, this
loader takes the rank's micro-batches from ``rank_train_indices`` (the native loader's
exact sequence), sorts the records inside each micro-batch by position, cuts the sequence
into runs of consecutive records from one shard, and writes one small index file per run
(into a private temporary folder) pointing into the unchanged shard. The reader, with
``random_shuffle=False``, then yields exactly the native loader's micro-batches: the same
sample set per micro-batch and per optimizer step, only in a different order inside a
micro-batch. A resumed epoch simply leaves the consumed micro-batches out of the runs.

The cost is one index file per run, about one per sample when shards outnumber the
samples of a micro-batch (ImageNet's 1024 shards), written when an epoch's iteration
starts (measured here: ~0.1 ms per file; DALI builds a 20,000-run reader in 0.2 s).

**Augmentation**: the same operations and the same random numbers as the native loader.
Each training sample's uniforms come from ``(seed, epoch, sample index)``
(``largebatch.randomness.augmentation_uniforms``) through an ``external_source`` fed in
the reader's order; the pipeline turns them into the random-resized-crop box with the
native loader's rule (``largebatch.data.decode.random_resized_crop_box``, written here as
DALI arithmetic on ``fn.peek_image_shape``), decodes only that box
(``fn.decoders.image_slice``), resizes it and flips where the sample's flip uniform is
below ``hflip``. DALI's own random operators are not used, so a sample's crop and flip
do not depend on the rank, the world size, or where a resumed epoch restarts, and they
are the boxes the native loader cuts. Evaluation: resize the shorter side, centre crop.

**Devices**: with a CUDA device the JPEGs are decoded with ``device='mixed'`` (nvJPEG) and
resized on the GPU; otherwise the whole pipeline runs on the CPU (``device_id=None``) and
the batches are copied to the run's device (an HPU too; ``mediapipe`` decodes there).

**Checks**: every index is checked against its shard's layout when the loader is built.
DALI's reader does not check record CRCs; run ``largebatch data verify`` once after
conversion. A JPEG that fails to decode is named (file, record, byte offset) by
re-reading the failing micro-batch with the native reader. Each JPEG's header size is read
(``fn.peek_image_shape``) before decoding: one above ``data.max_pixels`` is swapped for a
small stand-in image (a per-sample ``if``, DALI's conditional execution), so it is never
decoded, and its micro-batch stops the run with a ``DataError`` naming the record before
anything is trained on it.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from typing import Any

import numpy as np
import torch

from largebatch.config.sections import DataConfig
from largebatch.data.base import MicroBatches, RecordLoader, ShardLoader, labelled_jpeg
from largebatch.data.size_limit import JPEG_MAGIC, not_a_jpeg, too_large, undecodable
from largebatch.data.tfrecord import ShardSet
from largebatch.errors import DataError, UserError
from largebatch.randomness import CROP_ATTEMPTS

__all__ = ["DaliLoader"]

_READER = "tfrecord_reader"


def _import_dali():
    try:
        import nvidia.dali.tfrecord as tfrec
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    except ImportError as err:
        raise UserError(
            f"data.loader 'dali' needs NVIDIA DALI, which is not importable ({err}); "
            f"install it with: pip install -e .[dali]   (or choose data.loader 'native')",
            key="data.loader",
        ) from err
    return fn, tfrec, types, pipeline_def, DALIGenericIterator, LastBatchPolicy


def _read_records(fn, tfrec, paths: list[str], index_paths: list[str]):
    """The reader's ``(jpegs, labels, label_counts)`` of the run's record files, in index
    order. The label is read as a variable-length int64 list: DALI reads a float or bytes
    label as an empty one (as a fixed-length int64 it would hand back uninitialised memory),
    so ``label_counts`` (1 for a well-formed record) names every record whose label is not
    one int64; ``labels`` holds each record's first value, -1 where it has none."""
    record = fn.readers.tfrecord(
        path=paths,
        index_path=index_paths,
        features={
            "image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
            "image/class/label": tfrec.VarLenFeature(tfrec.int64, -1),
        },
        random_shuffle=False,
        name=_READER,
    )
    labels = record["image/class/label"]
    first = fn.pad(labels, axes=(0,), shape=(1,), fill_value=-1)[0:1]
    return record["image/encoded"], first, labels.shape()


def stand_in_jpeg() -> np.ndarray:
    """A small black JPEG's bytes, decoded instead of an image above ``data.max_pixels``."""
    import simplejpeg

    return np.frombuffer(simplejpeg.encode_jpeg(np.zeros((8, 8, 3), dtype=np.uint8)), dtype=np.uint8)


def _train_crop(fn, types, jpegs, draws, cfg: DataConfig, decode_device: str, ops_device: str, output_type):
    """Training images: the native loader's crop box decoded, resized to
    ``data.image_size``, and the flip decision ``(images, mirror)``."""
    left, top, crop_w, crop_h = crop_window(jpegs, draws, cfg.scale, cfg.ratio)
    images = fn.decoders.image_slice(
        jpegs,
        fn.cast(fn.stack(left, top), dtype=types.FLOAT),
        fn.cast(fn.stack(crop_w, crop_h), dtype=types.FLOAT),
        device=decode_device,
        output_type=output_type,
        axis_names="WH",
        normalized_anchor=False,
        normalized_shape=False,
    )
    images = fn.resize(images, device=ops_device, resize_x=cfg.image_size, resize_y=cfg.image_size)
    mirror = fn.cast(draws[2 * CROP_ATTEMPTS + 2] < cfg.hflip, dtype=types.INT32)
    return images, mirror


def write_run_indexes(shards: ShardSet, batches: list[np.ndarray], folder: str) -> tuple[list[str], list[str]]:
    """Index files that make DALI's reader yield ``batches`` (each sorted within itself).

    Returns:
        ``(paths, index_paths)`` for ``fn.readers.tfrecord``: consecutive records that
        lie in one shard form one run, i.e. one pair.
    """
    if not batches:
        return [], []
    order = np.concatenate([np.sort(b) for b in batches])
    shard_of = np.searchsorted(shards.starts, order, side="right") - 1
    breaks = np.flatnonzero(np.diff(shard_of)) + 1
    paths, index_paths = [], []
    for run, (lo, hi) in enumerate(zip(np.r_[0, breaks], np.r_[breaks, len(order)])):
        shard = int(shard_of[lo])
        entries = shards.indices[shard][order[lo:hi] - shards.starts[shard]]
        index_path = os.path.join(folder, f"{run:07d}.idx")
        fd = os.open(index_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, "".join(f"{o} {s}\n" for o, s in entries.tolist()).encode())
        finally:
            os.close(fd)
        paths.append(str(shards.paths[shard]))
        index_paths.append(index_path)
    return paths, index_paths


def crop_window(jpegs, draws, scale: tuple[float, float], ratio: tuple[float, float]):
    """DALI nodes for ``random_resized_crop_box`` of each sample: ``(left, top, width, height)``.

    ``draws`` holds each sample's ``augmentation_uniforms`` (float64); the ten tries are
    evaluated at once and the first that fits is chosen, else the clamped centre crop, as
    in ``largebatch.data.decode.random_resized_crop_box`` (tested to give the same boxes).
    DALI's reductions take float32, exact for sizes below 2**24.
    """
    fn, _, types, _, _, _ = _import_dali()
    import nvidia.dali.math as dmath

    shape = fn.cast(fn.peek_image_shape(jpegs), dtype=types.FLOAT64)
    height, width = shape[0], shape[1]
    tries = CROP_ATTEMPTS
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    target = height * width * (scale[0] + (scale[1] - scale[0]) * draws[0 : 2 * tries : 2])
    aspect = dmath.exp(log_lo + (log_hi - log_lo) * draws[1 : 2 * tries : 2])
    crop_w = dmath.floor(dmath.sqrt(target * aspect) + 0.5)
    crop_h = dmath.floor(dmath.sqrt(target / aspect) + 0.5)
    fits = (crop_w > 0) & (crop_w <= width) & (crop_h > 0) & (crop_h <= height)
    # The first try that fits has the highest score; none fits when the best score is 0.
    score = fn.cast(fits * types.Constant(np.arange(tries, 0, -1, dtype=np.float32)), dtype=types.FLOAT)
    best = fn.reductions.max(score)
    chosen = (score == best) & fits
    found = best > 0

    def pick(values):
        return fn.cast(fn.reductions.sum(fn.cast(values * chosen, dtype=types.FLOAT)), dtype=types.FLOAT64)

    narrow, wide = width / height < ratio[0], width / height > ratio[1]
    within = ~(narrow | wide)
    fallback_w = narrow * width + wide * dmath.floor(height * ratio[1] + 0.5) + within * width
    fallback_h = narrow * dmath.floor(width / ratio[0] + 0.5) + wide * height + within * height
    crop_w = found * pick(crop_w) + (~found) * fallback_w
    crop_h = found * pick(crop_h) + (~found) * fallback_h
    top = found * dmath.floor(draws[2 * tries] * (height - crop_h + 1)) + (~found) * dmath.floor((height - crop_h) / 2)
    left = found * dmath.floor(draws[2 * tries + 1] * (width - crop_w + 1)) + (~found) * dmath.floor((width - crop_w) / 2)
    return left, top, crop_w, crop_h


class DaliLoader(ShardLoader):
    """A DALI pipeline per epoch, following the loader contract (``IndexedLoader``); the
    arguments are ``ShardLoader``'s."""

    verify_crc = False  # DALI's reader reads the records; the shards are read only to name a bad one

    def __init__(self, shards: ShardSet, batches: MicroBatches, **options: Any) -> None:
        self._dali = _import_dali()
        super().__init__(shards, batches, **options)
        data_cfg = self.data_cfg
        self._label_offset = data_cfg.label_offset
        self._mean, self._std = data_cfg.mean, data_cfg.std
        self._channels = data_cfg.channels
        self._folder = tempfile.mkdtemp(prefix="largebatch-dali-")
        # GPU decoding whenever the run's device (the backend's) is a CUDA GPU; on any
        # other device (CPU, or an HPU running a config written for GPUs) the pipeline
        # runs on the CPU and batches are copied to the device.
        self._use_gpu = self.device.type == "cuda"

    def _pipeline(self, paths: list[str], index_paths: list[str], batches: list[np.ndarray]):
        fn, tfrec, types, pipeline_def, _, _ = self._dali
        cfg = self.data_cfg
        size = cfg.image_size
        gray = self._channels == 1
        mean = [m * 255 for m in self._mean]
        std = [s * 255 for s in self._std]
        device_id = (self.device.index if self.device.index is not None else torch.cuda.current_device()) if self._use_gpu else None
        decode_device = "mixed" if self._use_gpu else "cpu"
        ops_device = "gpu" if self._use_gpu else "cpu"
        output_type = types.GRAY if gray else types.RGB
        epoch, sorted_batches = self.epoch, [np.sort(b) for b in batches]
        stand_in = stand_in_jpeg()

        def sample_draws(info):
            # The reader yields each micro-batch's records in index order (write_run_indexes).
            if info.iteration >= len(sorted_batches):
                raise StopIteration
            return self.batches.draws(epoch, sorted_batches[info.iteration])

        @pipeline_def(
            batch_size=max(len(b) for b in batches),
            num_threads=max(1, cfg.num_workers),  # DALI needs a thread even at data.num_workers 0
            device_id=device_id,
            seed=self.pipeline_seed(),
            prefetch_queue_depth=cfg.prefetch,
            enable_conditionals=True,
        )
        def pipeline():
            jpegs, labels, label_counts = _read_records(fn, tfrec, paths, index_paths)
            # the first bytes, for _check_format: DALI decodes a PNG (or BMP, TIFF) the native loader refuses
            magic = fn.slice(jpegs, start=[0], shape=[len(JPEG_MAGIC) + 2], axes=[0], out_of_bounds_policy="pad")
            shapes = fn.peek_image_shape(jpegs, dtype=types.INT64)  # the header's, nothing decoded
            if shapes[0] * shapes[1] > cfg.max_pixels:  # per sample (DALI's conditionals); _check_sizes stops the run
                jpegs = types.Constant(stand_in, device="cpu")
            if self.batches.train:
                draws = fn.external_source(source=sample_draws, batch=True, batch_info=True, dtype=types.FLOAT64)
                images, mirror = _train_crop(fn, types, jpegs, draws, cfg, decode_device, ops_device, output_type)
                crop = None
            else:
                images = fn.decoders.image(jpegs, device=decode_device, output_type=output_type)
                shorter = size / cfg.eval_crop_ratio
                images = fn.resize(images, device=ops_device, resize_shorter=shorter)
                mirror, crop = 0, (size, size)
            images = fn.crop_mirror_normalize(
                images,
                device=ops_device,
                dtype=types.FLOAT,
                output_layout="CHW",
                crop=crop,
                mean=mean,
                std=std,
                mirror=mirror,
            )
            return images, labels, label_counts, shapes, magic

        return pipeline()

    def _name_bad_record(self, batch: np.ndarray, err: Exception) -> DataError:
        import simplejpeg

        for index in batch.tolist():
            try:
                jpeg, _ = labelled_jpeg(self.records, index, self._label_offset, self.num_classes)
                simplejpeg.decode_jpeg(jpeg)
            except DataError as bad:
                return bad
            except Exception as bad:  # noqa: BLE001 - any failure here names the record
                return DataError(f"{self.records.where(index)}: {undecodable(jpeg, bad)}")
        return DataError(f"DALI pipeline failed on a micro-batch of {self.records.split!r}: {str(err).splitlines()[0]}")

    def _iterate(self, batches):
        _, _, _, _, iterator_class, policy = self._dali
        for name in os.listdir(self._folder):
            os.unlink(os.path.join(self._folder, name))
        paths, index_paths = write_run_indexes(self.records, batches, self._folder)
        pipe = self._pipeline(paths, index_paths, batches)
        iterator = iterator_class(
            [pipe],
            ["images", "labels", "label_counts", "shapes", "magic"],
            reader_name=_READER,
            last_batch_policy=policy.PARTIAL,
            auto_reset=False,
        )
        try:
            for batch in batches:
                try:
                    out = next(iterator)[0]
                except StopIteration:
                    raise AssertionError("DALI ran out of records before the epoch's micro-batches") from None
                except RuntimeError as err:
                    raise self._name_bad_record(batch, err) from err
                images, labels = out["images"], out["labels"].view(-1) - self._label_offset
                self._check_format(batch, out["magic"])
                self._check_sizes(batch, out["shapes"])
                self._check_labels(batch, labels, out["label_counts"].view(-1))
                yield images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)
        finally:
            del iterator, pipe

    def _check_format(self, batch: np.ndarray, magic: torch.Tensor) -> None:
        """A micro-batch holding an image that is not a JPEG (a PNG DALI would decode) stops
        here, naming the record, as the native loader stops at it."""
        bad = ~(magic[:, : len(JPEG_MAGIC)] == torch.tensor(list(JPEG_MAGIC), dtype=magic.dtype)).all(dim=1)
        if bool(bad.any()):
            row = int(bad.nonzero()[0, 0])
            raise DataError(f"{self.records.where(int(np.sort(batch)[row]))}: {not_a_jpeg(bytes(magic[row].tolist()))}")

    def _check_sizes(self, batch: np.ndarray, shapes: torch.Tensor) -> None:
        """A micro-batch holding an image above ``data.max_pixels`` (decoded as the
        stand-in) stops here, naming the record."""
        pixels = shapes[:, 0] * shapes[:, 1]
        bad = pixels > self.data_cfg.max_pixels
        if bool(bad.any()):
            row = int(bad.nonzero()[0, 0])
            index = int(np.sort(batch)[row])
            height, width = int(shapes[row, 0]), int(shapes[row, 1])
            raise DataError(f"{self.records.where(index)}: {too_large(height, width, self.data_cfg.max_pixels)}")

    def _check_labels(self, batch: np.ndarray, labels: torch.Tensor, counts: torch.Tensor) -> None:
        """A micro-batch holding a record whose label is not one int64 in range (a float,
        bytes, several values, none, or a class out of range) stops here, naming the record."""
        bad = (counts != 1) | (labels < 0) | (labels >= self.num_classes)
        if bool(bad.any()):
            index = int(np.sort(batch)[int(bad.nonzero()[0, 0])])
            # the record read as the native loader reads it names what is wrong
            labelled_jpeg(self.records, index, self._label_offset, self.num_classes)
            raise AssertionError(f"DALI read label {int(labels[bad][0])} from {self.records.where(index)}, whose label is in range")

    def close(self) -> None:
        """Remove the epoch's index files (idempotent)."""
        shutil.rmtree(getattr(self, "_folder", ""), ignore_errors=True)

    def __del__(self) -> None:
        self.close()

    @classmethod
    def for_device(cls, data_cfg: DataConfig, device: torch.device) -> type[RecordLoader]:
        """This class; a ``UserError`` naming the install command when DALI is not importable."""
        _import_dali()
        return cls
