"""The native TFRecord loader: index files, random access, torch DataLoader workers.

Per epoch, rank ``k`` reads exactly ``rank_train_indices(plan, k, seed, epoch)`` (see
``largebatch.data.sharding``): disjoint, equal shares, reshuffled every epoch, and the
same samples per optimizer step as every other loader. The rank's micro-batches are
dealt to the DataLoader workers whole (worker ``w`` decodes micro-batches ``w, w+W, ...``)
and come back in order. Each record is fetched with one ``pread`` at the offset its
index gives, CRC-checked, its Example parsed, its JPEG decoded at reduced DCT scale when
the crop allows (``largebatch.data.decode``), cropped, resized and flipped on the CPU;
the contiguous uint8 NCHW batch is pinned, copied to the device and normalised there.

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

import numpy as np
import simplejpeg
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from largebatch.batching import BatchPlan
from largebatch.data.decode import (
    center_crop_box,
    decode_crop_resize,
    random_resized_crop_box,
)
from largebatch.data.example import ExampleDecodeError, decode_example
from largebatch.data.sharding import rank_eval_indices, rank_train_indices
from largebatch.data.tfrecord import ShardSet, count_samples
from largebatch.errors import DataError, UserError
from largebatch.randomness import AUGMENTATION_DRAWS, augmentation_uniforms, worker_generator

__all__ = ["NativeLoader", "build_eval_loader", "build_train_loader", "count_samples"]

_KEYS = ("image/encoded", "image/class/label")


def _cfg(data_cfg: dict, key: str, default=None):
    value = data_cfg.get(key, default)
    if value is None:
        raise UserError(f"missing data setting {key!r}", key=f"data.{key}")
    return value


class _TrainBatches:
    """Epoch to this rank's micro-batches (index arrays), from the shared sharding plan."""

    def __init__(self, plan: BatchPlan, rank: int, seed: int) -> None:
        self.plan, self.rank, self.seed = plan, rank, seed

    def __call__(self, epoch: int) -> list[np.ndarray]:
        indices = rank_train_indices(self.plan, self.rank, self.seed, epoch)
        return list(indices.reshape(-1, self.plan.micro_batch_size))


class _FixedBatches:
    """The same micro-batches every epoch (evaluation)."""

    def __init__(self, batches: list[np.ndarray]) -> None:
        self.batches = batches

    def __call__(self, epoch: int) -> list[np.ndarray]:
        return self.batches


class _MicroBatchDataset(Dataset):
    """Item ``(epoch, b)`` is micro-batch ``b`` of ``epoch``: contiguous uint8 NCHW images, labels.

    Decoding errors are returned, not raised, so the main process can raise one clean
    ``DataError`` (a worker's exception would arrive wrapped in a traceback dump).
    """

    def __init__(
        self, shards: ShardSet, batches_for_epoch, *, train: bool, cfg: dict, seed: int
    ) -> None:
        self.shards = shards
        self.batches_for_epoch = batches_for_epoch
        self.train = train
        self.seed = seed
        self.size = int(cfg["image_size"])
        self.channels = int(cfg["channels"])
        self.num_classes = int(cfg["num_classes"])
        self.label_offset = int(cfg.get("label_offset", 0))
        self.scale = tuple(cfg.get("scale", (0.08, 1.0)))
        self.ratio = tuple(cfg.get("ratio", (3 / 4, 4 / 3)))
        self.hflip = float(cfg.get("hflip", 0.5))
        self.crop_ratio = float(cfg.get("eval_crop_ratio", 0.875))
        self._epoch: int | None = None
        self._batches: list[np.ndarray] = []

    def __len__(self) -> int:  # pragma: no cover - the sampler drives indexing
        return len(self._batches)

    def _load(self, index: int, draws: np.ndarray | None, out: np.ndarray) -> int:
        """Decode sample ``index`` into ``out`` (uint8 CHW) and return its label."""
        data = self.shards.read(index)
        try:
            features = decode_example(data, _KEYS)
            jpeg = features["image/encoded"][0]
            raw_label = features["image/class/label"][0]
        except (ExampleDecodeError, KeyError, IndexError) as err:
            raise DataError(
                f"{self.shards.where(index)}: not an ImageNet-schema Example ({err})"
            ) from err
        label = raw_label - self.label_offset
        if not 0 <= label < self.num_classes:
            raise DataError(
                f"{self.shards.where(index)}: label {raw_label} is outside {self.label_offset}.."
                f"{self.label_offset + self.num_classes - 1} (data.num_classes {self.num_classes}, "
                f"data.label_offset {self.label_offset})"
            )
        try:
            height, width = simplejpeg.decode_jpeg_header(jpeg)[:2]
            flip = False
            if draws is not None:
                box = random_resized_crop_box(
                    height, width, draws, self.scale, self.ratio
                )
                flip = bool(draws[AUGMENTATION_DRAWS - 1] < self.hflip)
            else:
                box = center_crop_box(height, width, self.size, self.crop_ratio)
            decode_crop_resize(
                jpeg, box, self.size, self.channels, (height, width), flip, out
            )
        except ValueError as err:
            raise DataError(
                f"{self.shards.where(index)}: JPEG does not decode ({err})"
            ) from err
        return label

    def __getitem__(self, item: tuple[int, int]):
        epoch, number = item
        if epoch != self._epoch:
            self._epoch = epoch
            self._batches = self.batches_for_epoch(epoch)
        indices = self._batches[number]
        # Contiguous NCHW, not a channels-last view: float conversion keeps the layout,
        # and channels-last inputs make DDP's gradient buckets mismatch the grad strides.
        images = torch.empty(
            (len(indices), self.channels, self.size, self.size), dtype=torch.uint8
        )
        labels = np.empty(len(indices), dtype=np.int64)
        draws = (
            augmentation_uniforms(self.seed, epoch, indices) if self.train else None
        )
        slots = images.numpy()
        try:
            for j, index in enumerate(indices.tolist()):
                labels[j] = self._load(
                    index, None if draws is None else draws[j], slots[j]
                )
        except DataError as err:
            return err.render()
        return images, torch.from_numpy(labels)


class _EpochSampler(Sampler):
    """Yields ``(epoch, b)`` for ``b`` from the start position to the epoch's end."""

    def __init__(self, loader: NativeLoader) -> None:
        self.loader = loader

    def __iter__(self):
        epoch, start = self.loader.epoch, self.loader._start
        return iter([(epoch, b) for b in range(start, len(self.loader))])

    def __len__(self) -> int:
        return len(self.loader) - self.loader._start


class NativeLoader:
    """A loader over TFRecord shards that follows the loader contract.

    Attributes:
        num_samples: records in the split (all ranks together).
        num_classes: classes (labels are 0-based on output).
    """

    def __init__(
        self,
        shards: ShardSet,
        num_batches: int,
        batches_for_epoch,
        *,
        train: bool,
        data_cfg: dict,
        seed: int,
        rank: int,
        device: torch.device,
    ) -> None:
        self.shards = shards
        self.num_samples = len(shards)
        self.num_classes = int(_cfg(data_cfg, "num_classes"))
        self.device = torch.device(device)
        self.epoch = 0
        self._start = 0
        self._position = 0
        self._num_batches = num_batches
        channels = int(_cfg(data_cfg, "channels"))
        mean = torch.tensor(
            [float(m) * 255 for m in _cfg(data_cfg, "mean")], dtype=torch.float32
        )
        std = torch.tensor(
            [float(s) * 255 for s in _cfg(data_cfg, "std")], dtype=torch.float32
        )
        if len(mean) != channels or len(std) != channels:
            raise UserError(
                f"data.mean and data.std need {channels} values (data.channels), got {len(mean)} and {len(std)}",
                key="data.mean",
            )
        self._mean = mean.view(1, -1, 1, 1).to(self.device)
        self._std = std.view(1, -1, 1, 1).to(self.device)
        workers = int(data_cfg.get("num_workers", 0))
        dataset = _MicroBatchDataset(
            shards, batches_for_epoch, train=train, cfg=data_cfg, seed=seed
        )
        kwargs = {}
        if workers > 0:
            kwargs = {
                "prefetch_factor": max(1, int(data_cfg.get("prefetch", 2))),
                "persistent_workers": True,
            }
        self._loader = DataLoader(
            dataset,
            batch_size=None,
            sampler=_EpochSampler(self),
            num_workers=workers,
            pin_memory=self.device.type == "cuda",
            generator=worker_generator(seed, rank),
            **kwargs,
        )

    def __len__(self) -> int:
        """Micro-batches this rank yields per epoch (a resumed epoch yields the rest of them)."""
        return self._num_batches

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to read next; a different epoch than a loaded state restarts at 0."""
        if epoch != self.epoch:
            self._start = 0
        self.epoch = int(epoch)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "micro_batch": self._position}

    def load_state_dict(self, state: dict) -> None:
        """Continue ``state['epoch']`` at micro-batch ``state['micro_batch']``."""
        self.epoch = int(state["epoch"])
        self._start = self._position = min(int(state["micro_batch"]), len(self))

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
        images, labels = batch
        non_blocking = self.device.type == "cuda"
        images = images.to(self.device, non_blocking=non_blocking).float()
        labels = labels.to(self.device, non_blocking=non_blocking)
        return images.sub_(self._mean).div_(self._std), labels

    def __iter__(self):
        self._position = self._start
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        pending = None
        try:
            for batch in self._loader:
                if (
                    stream is not None
                ):  # copy the next batch while the current one trains
                    with torch.cuda.stream(stream):
                        ready = self._to_device(batch)
                    if pending is not None:
                        yield self._hand_over(pending, stream)
                    pending = ready
                else:
                    out = self._to_device(batch)
                    self._position += 1
                    yield out
            if pending is not None:
                yield self._hand_over(pending, stream)
        finally:
            self._start = 0

    def _hand_over(self, batch, stream):
        torch.cuda.current_stream(self.device).wait_stream(stream)
        for tensor in batch:
            tensor.record_stream(torch.cuda.current_stream(self.device))
        self._position += 1
        return batch


def _check_channels(data_cfg: dict) -> None:
    if int(_cfg(data_cfg, "channels")) not in (1, 3):
        raise UserError(
            f"data.channels must be 1 or 3, got {data_cfg['channels']}",
            key="data.channels",
        )


def build_train_loader(
    data_cfg: dict, plan: BatchPlan, *, rank: int, seed: int, device: torch.device
) -> NativeLoader:
    """The training loader of ``rank``: ``plan.micro_batches_per_epoch`` micro-batches per epoch.

    Args:
        data_cfg: the ``data`` section of the config (``root``, ``train_split``, ...).
        plan: the run's batch arithmetic; ``plan.num_samples`` must equal the split's size.
        rank: this process's rank in ``0 .. plan.world_size - 1``.
        seed: the run's seed (shuffling and augmentation).
        device: where batches are delivered.

    Raises:
        DataError: missing or inconsistent shards or index files.
        UserError: a plan made for a different sample count, a bad setting.
    """
    _check_channels(data_cfg)
    shards = ShardSet(
        _cfg(data_cfg, "root"),
        data_cfg.get("train_split", "train"),
        bool(data_cfg.get("verify_crc", True)),
    )
    if len(shards) != plan.num_samples:
        raise UserError(
            f"the batch plan counts {plan.num_samples} training samples but {shards.root} has "
            f"{len(shards)} in split {shards.split!r}; build the plan from count_samples()",
            key="data.root",
        )
    return NativeLoader(
        shards,
        plan.micro_batches_per_epoch,
        _TrainBatches(plan, rank, seed),
        train=True,
        data_cfg=data_cfg,
        seed=seed,
        rank=rank,
        device=device,
    )


def build_eval_loader(
    data_cfg: dict, *, batch_size: int, rank: int, world_size: int, device: torch.device
) -> NativeLoader:
    """The evaluation loader of ``rank``: every record exactly once across ranks, in order.

    The rank's block comes from ``rank_eval_indices``; its last batch may be short.
    """
    _check_channels(data_cfg)
    shards = ShardSet(
        _cfg(data_cfg, "root"),
        data_cfg.get("eval_split", "validation"),
        bool(data_cfg.get("verify_crc", True)),
    )
    indices = rank_eval_indices(len(shards), rank, world_size)
    batches = [indices[i : i + batch_size] for i in range(0, len(indices), batch_size)]
    return NativeLoader(
        shards,
        math.ceil(len(indices) / batch_size),
        _FixedBatches(batches),
        train=False,
        data_cfg=data_cfg,
        seed=0,
        rank=rank,
        device=device,
    )
