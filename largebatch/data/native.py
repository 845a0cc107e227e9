"""The native TFRecord loader: index files, random access, torch DataLoader workers.

Per epoch, rank ``k`` reads exactly ``rank_train_indices(plan, k, seed, epoch)`` (see
``largebatch.data.sharding``): disjoint, equal shares, reshuffled every epoch, and the
same samples per optimizer step as every other loader. The rank's micro-batches are
dealt to the DataLoader workers whole (worker ``w`` decodes micro-batches ``w, w+W, ...``)
and come back in order. Each record is fetched with one ``pread`` at the offset its
index gives, CRC-checked, its Example parsed, its JPEG decoded at reduced DCT scale when
the crop allows (``largebatch.data.decode``), cropped, resized and flipped on the CPU;
the contiguous uint8 NCHW batch is copied to the device and normalised there. With
``data.decode='device'`` (``'auto'`` on CUDA) the workers stop before decoding: they hand
over each micro-batch's JPEGs with the crops and flips they drew, and the device decodes,
crops, resizes and flips the whole micro-batch (``largebatch.data.device_decode``); there
is no ring then.

With workers, the batches never travel as tensors: the loader makes one ring of
``data.prefetch * data.num_workers + 1`` batch-sized uint8 slots in shared memory before
the workers start, a worker decodes straight into the slot its task names, and only the
slot number, labels and seeds cross the process boundary. The slot of the ``k``-th
micro-batch of an iteration is ``k`` modulo the ring's size: the DataLoader issues one task
per batch it returns and never has more than ``prefetch * num_workers`` issued and not yet
returned, so the slot a new task gets is always the one of a batch already converted on
the device side. (Tensors handed over the usual way cost a fresh shared-memory segment,
a copy, a file-descriptor exchange and page faults per batch: about 0.3 CPU ms per image
at 224 px, more than crop and resize together.) On CUDA the slot is copied into pinned
memory, then to the GPU on a side stream.

Augmentation randomness comes from ``(seed, epoch, sample index)`` alone
(``largebatch.randomness.augmentation_uniforms``), so a sample's crop and flip do not
depend on the number of workers, ranks, or on a resume; the DataLoader's base seed comes
from a generator of its own, so creating an iterator never draws from the global one.

``state_dict()`` holds ``{'epoch', 'micro_batch'}`` (micro-batches already yielded this
epoch); after ``load_state_dict`` the next iteration starts at that micro-batch without
reading or decoding the ones before it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from largebatch.config.sections import DataConfig
from largebatch.data.base import MicroBatches, ShardLoader, checked_jpeg, labelled_jpeg
from largebatch.data.decode import (
    Box,
    center_crop_box,
    crop_bounds,
    crop_resize,
    dct_scale,
    decode_at_scale,
    random_resized_crop_box,
)
from largebatch.data.device_decode import EncodedBatch, decode_batch, decode_on_device, encode_batch
from largebatch.data.policies import apply_policy, erase, image_policy, random_eraser
from largebatch.data.size_limit import undecodable
from largebatch.data.tfrecord import ShardSet
from largebatch.errors import DataError
from largebatch.randomness import AUGMENTATION_DRAWS, worker_generator

__all__ = ["NativeLoader"]


class _MicroBatchDataset(Dataset):
    """Item ``(epoch, b)`` is micro-batch ``b`` of ``epoch``: contiguous uint8 NCHW images, labels;
    with ``encoded`` (``data.decode='device'``) an ``EncodedBatch`` instead, nothing decoded.

    Decoding errors are returned, not raised, so the main process can raise one clean
    ``DataError`` (a worker's exception would arrive wrapped in a traceback dump).
    """

    def __init__(
        self, shards: ShardSet, batches: MicroBatches, cfg: DataConfig, ring: torch.Tensor | None = None, encoded: bool = False
    ) -> None:
        self.shards = shards
        self.ring = ring
        self.encoded = encoded
        self.batches = batches
        self.size = cfg.image_size
        self.channels = cfg.channels
        self.num_classes = cfg.num_classes
        self.label_offset = cfg.label_offset
        self.scale = cfg.scale
        self.ratio = cfg.ratio
        self.hflip = cfg.hflip
        self.crop_ratio = cfg.eval_crop_ratio
        self.interpolation = cfg.interpolation
        self.max_pixels = cfg.max_pixels
        self.policy = image_policy(cfg) if batches.train else None
        # data.cache_decoded: record -> (full-size pixels, label), kept from its first decode
        self.decoded: dict[int, tuple[np.ndarray, int]] | None = {} if cfg.cache_decoded else None
        self._epoch: int | None = None
        self._batches: list[np.ndarray] = []

    def __len__(self) -> int:  # pragma: no cover - the sampler drives indexing
        return len(self._batches)

    def _box(self, height: int, width: int, draws: np.ndarray | None) -> tuple[Box, bool]:
        """The crop box and flip of an image of ``height`` x ``width``: drawn from ``draws``
        for training, the centre crop (unflipped) for evaluation."""
        if draws is None:
            return center_crop_box(height, width, self.size, self.crop_ratio), False
        box = random_resized_crop_box(height, width, draws, self.scale, self.ratio)
        return box, bool(draws[AUGMENTATION_DRAWS - 1] < self.hflip)

    def _encoded(self, indices: np.ndarray, draws: np.ndarray | None, seeds: np.ndarray | None) -> EncodedBatch:
        """The micro-batch ``indices`` read, checked and its crops and flips drawn, undecoded."""
        records = indices % len(self.shards)  # a repeated sample reads its record
        crops = np.empty((len(indices), 4), dtype=np.int64)
        flips = np.zeros(len(indices), dtype=bool)
        labels = np.empty(len(indices), dtype=np.int64)
        jpegs = []
        for j, index in enumerate(records.tolist()):
            jpeg, labels[j], header = checked_jpeg(self.shards, index, self.label_offset, self.num_classes, self.max_pixels)
            box, flips[j] = self._box(*header, None if draws is None else draws[j])
            crops[j] = crop_bounds(header, header, box)
            jpegs.append(jpeg)
        return encode_batch(jpegs, crops, flips, labels, seeds, records)

    def _load(self, index: int, draws: np.ndarray | None, out: np.ndarray) -> int:
        """Decode sample ``index`` (a virtual index under repeated augmentation) into
        ``out`` (uint8 CHW) and return its label. With ``data.cache_decoded``, a record's
        full-size pixels are kept from its first decode and cropped again from there
        whenever its crop needs them at full size (the same bytes as decoding again)."""
        index %= len(self.shards)  # a repeated sample reads its record
        cached = None if self.decoded is None else self.decoded.get(index)
        jpeg = None
        if cached is None:
            jpeg, label, (height, width) = checked_jpeg(self.shards, index, self.label_offset, self.num_classes, self.max_pixels)
        else:
            pixels, label = cached
            height, width = pixels.shape[:2]
        box, flip = self._box(height, width, draws)
        try:
            k = dct_scale(box, self.size)
            if cached is None or k != 1:
                if jpeg is None:
                    jpeg, _ = labelled_jpeg(self.shards, index, self.label_offset, self.num_classes)
                pixels = decode_at_scale(jpeg, k, self.channels, (height, width))
                if k == 1 and self.decoded is not None:
                    self.decoded[index] = (pixels, label)
            crop_resize(pixels, (height, width), box, self.size, flip, out, self.interpolation)
        except ValueError as err:
            raise DataError(f"{self.shards.where(index)}: {undecodable(jpeg or b'', err)}") from err
        return label

    def __getitem__(self, item: tuple[int, int, int]):
        """Micro-batch ``number`` of ``epoch``: ``(images, labels, seeds)``, where images
        is the ring's slot number when there is a ring (the images are in it), else the
        uint8 NCHW tensor; labels and seeds are NumPy arrays (seeds None for evaluation)."""
        epoch, number, slot = item
        if epoch != self._epoch:
            self._epoch = epoch
            self._batches = self.batches(epoch)
        indices = self._batches[number]
        draws, seeds = self.batches.draws(epoch, indices), self.batches.seeds(epoch, indices)
        if self.encoded:
            try:
                return self._encoded(indices, draws, seeds)
            except DataError as err:
                return err.render()
        # Contiguous NCHW, not a channels-last view: float conversion keeps the layout,
        # and channels-last inputs make DDP's gradient buckets mismatch the grad strides.
        if self.ring is not None:
            images = self.ring[slot, : len(indices)]
        else:
            images = torch.empty((len(indices), self.channels, self.size, self.size), dtype=torch.uint8)
        labels = np.empty(len(indices), dtype=np.int64)
        slots = images.numpy()
        try:
            for j, index in enumerate(indices.tolist()):
                labels[j] = self._load(index, None if draws is None else draws[j], slots[j])
                if self.policy is not None:
                    apply_policy(self.policy, slots[j], seeds[j])
        except DataError as err:
            return err.render()
        return slot if self.ring is not None else images, labels, seeds


def _as_is(item):
    return item


def shared_ring(slots: int, batch: int, channels: int, size: int) -> torch.Tensor:
    """``slots`` uint8 batches of ``batch`` x ``channels`` x ``size`` x ``size`` in shared memory.

    Raises:
        DataError: the shared-memory file system is too small; the message gives the size
            it needs and the settings that shrink it.
    """
    shape = (slots, batch, channels, size, size)
    try:
        return torch.empty(shape, dtype=torch.uint8).share_memory_()
    except RuntimeError as err:
        need = math.prod(shape) / 2**20
        raise DataError(
            f"cannot allocate the loader's {need:.0f} MiB of shared memory ({slots} slots of {batch} images; {err}); "
            "give /dev/shm more room (docker: --shm-size) or lower data.prefetch, data.num_workers or the micro-batch size"
        ) from err


class _EpochSampler(Sampler):
    """Yields ``(epoch, b, slot)`` for ``b`` from the start position to the epoch's end;
    the ``k``-th item's slot is ``k`` modulo the number of ring slots (0 without a ring)."""

    def __init__(self, loader: NativeLoader, slots: int) -> None:
        self.loader = loader
        self.slots = max(slots, 1)

    def __iter__(self):
        epoch, start = self.loader.epoch, self.loader.start
        return iter([(epoch, b, k % self.slots) for k, b in enumerate(range(start, len(self.loader)))])

    def __len__(self) -> int:
        return len(self.loader) - self.loader.start


class NativeLoader(ShardLoader):
    """A loader over TFRecord shards that follows the loader contract (``IndexedLoader``);
    the arguments are ``ShardLoader``'s."""

    def __init__(self, shards: ShardSet, batches: MicroBatches, **options: Any) -> None:
        super().__init__(shards, batches, **options)
        data_cfg = self.data_cfg
        self._mean = torch.tensor([m * 255 for m in data_cfg.mean], dtype=torch.float32).view(1, -1, 1, 1).to(self.device)
        self._std = torch.tensor([s * 255 for s in data_cfg.std], dtype=torch.float32).view(1, -1, 1, 1).to(self.device)
        self._eraser = random_eraser(data_cfg, self.device) if batches.train else None
        self.decodes_on_device = decode_on_device(data_cfg, self.device)
        workers = data_cfg.num_workers
        kwargs, self._ring = {}, None
        if workers > 0:
            kwargs = {"prefetch_factor": data_cfg.prefetch, "persistent_workers": True}
        if workers > 0 and not self.decodes_on_device:
            slots = data_cfg.prefetch * workers + 1  # see the module docstring
            self._ring = shared_ring(slots, batches.batch_size, data_cfg.channels, data_cfg.image_size)
        self._loader = DataLoader(
            _MicroBatchDataset(self.records, batches, data_cfg, self._ring, encoded=self.decodes_on_device),
            batch_size=None,
            sampler=_EpochSampler(self, 0 if self._ring is None else self._ring.shape[0]),
            collate_fn=_as_is,  # not default_convert: NumPy labels cross as bytes, not as shared tensors
            num_workers=workers,
            generator=worker_generator(self.seed, self.rank),
            **kwargs,
        )

    def close(self) -> None:
        """Stop the worker processes now (idempotent). Left to the garbage collector, a
        loader stopped mid-epoch can take seconds to let its workers go."""
        iterator = getattr(self._loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        self._loader._iterator = None

    def _to_device(self, batch):
        if isinstance(batch, str):
            raise DataError(batch)
        non_blocking = self.device.type == "cuda"
        if isinstance(batch, EncodedBatch):
            cfg = self.data_cfg
            images = decode_batch(batch, cfg.image_size, cfg.channels, self.device, cfg.interpolation, self.records.where)
            labels, seeds = torch.from_numpy(batch.labels), batch.seeds
        else:
            images, labels, seeds = batch
            if self._ring is not None:  # the slot is reused once the next batch is asked for
                images = self._ring[images, : len(labels)]
            labels = torch.from_numpy(labels)
            if non_blocking:  # done reading the slot on return; the copies to the GPU overlap
                images = images.pin_memory()
            images = images.to(self.device, non_blocking=non_blocking).float()
        if non_blocking:
            labels = labels.pin_memory()
        labels = labels.to(self.device, non_blocking=non_blocking)
        images.sub_(self._mean).div_(self._std)
        if self._eraser is not None:
            erase(self._eraser, images, seeds)
        return images, labels

    def _iterate(self, batches):
        # The sampler covers the same micro-batches as ``batches``: the workers compute
        # them from the epoch themselves.
        if self.device.type != "cuda":
            for batch in self._loader:
                yield self._to_device(batch)
            return
        stream, pending = torch.cuda.Stream(self.device), None
        for batch in self._loader:  # copy the next batch while the current one trains
            with torch.cuda.stream(stream):
                ready = self._to_device(batch)
            if pending is not None:
                yield self._hand_over(pending, stream)
            pending = ready
        if pending is not None:
            yield self._hand_over(pending, stream)

    def _hand_over(self, batch, stream):
        torch.cuda.current_stream(self.device).wait_stream(stream)
        for tensor in batch:
            tensor.record_stream(torch.cuda.current_stream(self.device))
        return batch
