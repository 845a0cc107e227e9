"""Habana's media pipeline: JPEGs from the TFRecord shards, decoded and augmented on the Gaudi.

``habana_frameworks.mediapipe`` (package ``habana-media-loader``) is imported only here,
only when this loader is asked for, and only on an HPU device.

**Reading.** The media pipeline has readers for image folders, numpy files, COCO and
video, but none for TFRecord. It does have an external reader op
(``fn.MediaExtReaderOp`` with a ``media_ext_reader_op_impl`` subclass) whose batches may
be in-memory buffers (``readerOutType.BUFFER_LIST``) that go straight to the HPU JPEG
decoder. So this loader reads the rank's records itself, per micro-batch, from
``rank_train_indices`` (the native loader's exact sequence: same samples per micro-batch
and per optimizer step), takes ``image/encoded`` and ``image/class/label`` out of each
Example on the CPU (cheap: parsing, no decoding), checks each JPEG header's size against
``data.max_pixels`` (a larger image is a ``DataError`` naming its record, before the
decoder allocates anything) and hands the encoded JPEGs to the pipeline. No image folder copy of the data set is needed.

**On the Gaudi**: ``fn.ImageDecoder`` decodes and applies the random-resized crop
(``randomCropType.RANDOMIZED_AREA_AND_ASPECT_RATIO_CROP`` with ``data.scale`` and
``data.ratio``) and resizes to ``data.image_size``; ``fn.RandomFlip`` flips horizontally
where ``fn.CoinFlip`` (probability ``data.hflip``) says so; ``fn.CropMirrorNorm``
normalises with ``data.mean`` / ``data.std`` into float32 NCHW. Evaluation resizes to
``image_size / eval_crop_ratio`` square (the decoder's resize is not aspect-preserving,
unlike the native loader's shorter-side resize) and centre-crops ``image_size``.
Random streams are the pipeline's, seeded from ``(seed, epoch, rank)``.

**Output**: the loader contract of ``largebatch.data`` (float32 normalised images and
int64 labels on the HPU, ``len``, ``set_epoch``, ``state_dict``). The pipeline's batch
size is fixed, so a short last evaluation batch is padded with its last record and the
padding cut off the output.

**Fallback**: when the pipeline cannot start (the device is not an HPU, the media
package or its native modules are missing, grayscale data) the native loader is used
instead and one warning line says why.

Status: written against the Python sources of ``habana-media-loader`` 1.24 and Habana's
documentation; it has never run on a Gaudi. Only the fallback is tested.
"""

from __future__ import annotations

import itertools
import math
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from largebatch.config.sections import DataConfig
from largebatch.data import native
from largebatch.data.base import MicroBatches, RecordLoader, ShardLoader, checked_jpeg
from largebatch.data.tfrecord import ShardSet

__all__ = ["MediaPipeLoader", "unavailable_reason"]

_warned = False
_pipe_numbers = itertools.count()


def _import_mediapipe() -> SimpleNamespace:
    """Habana's media pipeline API (raises ImportError or OSError when it cannot load)."""
    from habana_frameworks.mediapipe import fn
    from habana_frameworks.mediapipe.media_types import dtype, ftype, imgtype, randomCropType, readerOutType
    from habana_frameworks.mediapipe.mediapipe import MediaPipe
    from habana_frameworks.mediapipe.operators.reader_nodes.reader_nodes import (
        media_ext_reader_op_impl,
        media_ext_reader_op_tensor_info,
    )
    from habana_frameworks.mediapipe.plugins.iterator_pytorch import HPUGenericPytorchIterator

    return SimpleNamespace(
        fn=fn,
        dtype=dtype,
        ftype=ftype,
        imgtype=imgtype,
        randomCropType=randomCropType,
        readerOutType=readerOutType,
        MediaPipe=MediaPipe,
        reader_impl=media_ext_reader_op_impl,
        tensor_info=media_ext_reader_op_tensor_info,
        Iterator=HPUGenericPytorchIterator,
    )


def unavailable_reason(data_cfg: DataConfig, device: torch.device) -> str | None:
    """Why the media pipeline cannot run here, or None when it can."""
    device = torch.device(device)
    if device.type != "hpu":
        return f"the device is {device.type}, and the media pipeline decodes on a Gaudi (HPU)"
    if data_cfg.channels != 3:
        return "data.channels is 1, and the HPU JPEG decoder writes RGB"
    try:
        _import_mediapipe()
    except (ImportError, OSError) as exc:
        return f"habana_frameworks.mediapipe does not load ({type(exc).__name__}: {exc})"
    return None


def _warn_fallback(reason: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        print(f"largebatch: warning: data.loader 'mediapipe' uses the native loader instead: {reason}", file=sys.stderr, flush=True)


class _RecordSource:
    """Encoded JPEGs and 0-based labels of one micro-batch, read from the shards; each
    JPEG's header size checked against ``max_pixels`` before the decoder sees it."""

    def __init__(
        self, shards: ShardSet, batches: list[np.ndarray], batch_size: int, num_classes: int, label_offset: int, max_pixels: int
    ) -> None:
        self.records, self.batches, self.batch_size = shards, batches, batch_size
        self.num_classes, self.label_offset, self.max_pixels = num_classes, label_offset, max_pixels

    def read(self, number: int) -> tuple[np.ndarray, np.ndarray]:
        indices = self.batches[number].tolist()
        indices += [indices[-1]] * (self.batch_size - len(indices))  # fixed pipeline batch size
        jpegs = np.empty(self.batch_size, dtype=object)
        labels = np.empty(self.batch_size, dtype=np.int32)
        for j, index in enumerate(indices):
            jpeg, label, _ = checked_jpeg(self.records, index, self.label_offset, self.num_classes, self.max_pixels)
            buffer = np.frombuffer(jpeg, dtype=np.uint8)
            # The decoder reads whole 64-byte blocks; trailing zeros after the JPEG's end are ignored.
            jpegs[j] = np.pad(buffer, (0, -len(buffer) % 64))
            labels[j] = label
        return jpegs, labels


def _reader_class(mp: SimpleNamespace) -> type:
    """The external reader op implementation (its base class exists only with the package)."""

    class TFRecordReader(mp.reader_impl):
        def __init__(self, params: dict, fw_params: Any) -> None:
            self.source: _RecordSource = params["priv_params"]["source"]
            self.batch_size = fw_params.batch_size
            self.number = 0

        def __iter__(self):
            self.number = 0
            return self

        def __len__(self) -> int:
            return len(self.source.batches)

        def __next__(self):
            if self.number >= len(self.source.batches):
                raise StopIteration
            out = self.source.read(self.number)
            self.number += 1
            return out

        def gen_output_info(self) -> list:
            shape = np.array([self.batch_size], dtype=np.uint32)
            return [mp.tensor_info(mp.dtype.NDT, shape, ""), mp.tensor_info(mp.dtype.INT32, shape, "")]

        def get_largest_file(self) -> str:
            return ""

        def get_media_output_type(self):
            return mp.readerOutType.BUFFER_LIST

    return TFRecordReader


def _make_pipe(mp: SimpleNamespace, source: _RecordSource, cfg: DataConfig, *, train: bool, seed: int) -> Any:
    fn, dt = mp.fn, mp.dtype
    size = cfg.image_size
    mean = np.array([float(m) * 255 for m in cfg.mean], dtype=np.float32)
    inv_std = np.array([1.0 / (float(s) * 255) for s in cfg.std], dtype=np.float32)
    reader_class = _reader_class(mp)

    class ImagePipe(mp.MediaPipe):
        def __init__(self) -> None:
            super().__init__(
                device="hpu",
                prefetch_depth=cfg.prefetch,
                batch_size=source.batch_size,
                num_threads=max(1, cfg.num_workers),  # at least one thread at data.num_workers 0
                pipe_name=f"largebatch-{'train' if train else 'eval'}-{next(_pipe_numbers)}",
            )
            self.reader = fn.MediaExtReaderOp(impl=reader_class, num_outputs=2, priv_params={"source": source}, seed=seed)
            if train:
                scale, ratio = cfg.scale, cfg.ratio
                self.decode = fn.ImageDecoder(
                    device="hpu",
                    output_format=mp.imgtype.RGB_P,
                    resize=[size, size],
                    resampling_mode=mp.ftype.BI_LINEAR,
                    random_crop_type=mp.randomCropType.RANDOMIZED_AREA_AND_ASPECT_RATIO_CROP,
                    scale_min=float(scale[0]),
                    scale_max=float(scale[1]),
                    ratio_min=float(ratio[0]),
                    ratio_max=float(ratio[1]),
                    seed=seed,
                )
                self.flip_probability = fn.Constant(constant=cfg.hflip, dtype=dt.FLOAT32, device="cpu")
                self.coin_flip = fn.CoinFlip(seed=seed + 1, device="cpu")
                self.flip = fn.RandomFlip(horizontal=1, device="hpu")
                self.cmn = fn.CropMirrorNorm(crop_w=size, crop_h=size, crop_d=0, dtype=dt.FLOAT32, device="hpu")
            else:
                resized = int(math.floor(size / cfg.eval_crop_ratio + 0.5))
                self.decode = fn.ImageDecoder(
                    device="hpu", output_format=mp.imgtype.RGB_P, resize=[resized, resized], resampling_mode=mp.ftype.BI_LINEAR
                )
                self.cmn = fn.CropMirrorNorm(
                    crop_w=size, crop_h=size, crop_d=0, crop_pos_x=0.5, crop_pos_y=0.5, dtype=dt.FLOAT32, device="hpu"
                )
            self.mean = fn.MediaConst(data=mean, shape=[1, 1, mean.size], dtype=dt.FLOAT32, device="cpu")
            self.inv_std = fn.MediaConst(data=inv_std, shape=[1, 1, inv_std.size], dtype=dt.FLOAT32, device="cpu")

        def definegraph(self):
            jpegs, labels = self.reader()
            images = self.decode(jpegs)
            if train:
                images = self.flip(images, self.coin_flip(self.flip_probability()))
            images = self.cmn(images, self.mean(), self.inv_std())
            return images, labels

    return ImagePipe()


class MediaPipeLoader(ShardLoader):
    """A media pipeline per epoch, following the loader contract (``IndexedLoader``); the
    arguments are ``ShardLoader``'s."""

    def __init__(self, shards: ShardSet, batches: MicroBatches, **options: Any) -> None:
        self._mp = _import_mediapipe()
        super().__init__(shards, batches, **options)

    def _iterate(self, batches):
        label_offset = self.data_cfg.label_offset
        source = _RecordSource(self.records, batches, self.batches.batch_size, self.num_classes, label_offset, self.data_cfg.max_pixels)
        pipe = _make_pipe(self._mp, source, self.data_cfg, train=self.batches.train, seed=self.pipeline_seed())
        iterator = iter(self._mp.Iterator(mediapipe=pipe))
        try:
            for batch in batches:
                images, labels = next(iterator)
                yield images[: len(batch)], labels[: len(batch)].to(self.device).long()
        finally:
            del iterator, pipe

    @classmethod
    def for_device(cls, data_cfg: DataConfig, device: torch.device) -> type[RecordLoader]:
        """This class where the media pipeline runs; the native loader, with one warning line
        saying why, where it cannot."""
        reason = unavailable_reason(data_cfg, device)
        if reason is None:
            return cls
        _warn_fallback(reason)
        return native.NativeLoader
