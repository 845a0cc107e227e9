"""The loader contract as a ``typing.Protocol``, and the base every built-in loader shares.

``Loader`` is what the engine, the hooks and the tests type against (the contract itself
is described in ``largebatch.data``'s module docstring). ``IndexedLoader`` owns what is the
same for every loader: the epoch, the position in it, ``state_dict``/``load_state_dict``
and the rule for which micro-batches a rank reads (``MicroBatches``). A loader built on it
implements one method, ``_iterate(batches)``: turn the epoch's remaining micro-batches (arrays
of record indices) into ``(images, labels)`` on the device. Every built-in loader is a
``RecordLoader`` and is built by ``build_loader``: the class for the device, the split's
records, the rank's micro-batches.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Sized
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from largebatch.batching import BatchPlan
from largebatch.config.sections import DataConfig
from largebatch.data.example import IMAGE, LABEL, ExampleDecodeError, class_number, decode_example, image_and_label
from largebatch.data.sharding import rank_eval_indices, rank_train_indices
from largebatch.data.size_limit import checked_size, undecodable
from largebatch.data.tfrecord import ShardSet
from largebatch.errors import DataError, UserError
from largebatch.randomness import augmentation_seeds, augmentation_uniforms

__all__ = ["IndexedLoader", "Loader", "MicroBatches", "RecordLoader", "ShardLoader", "build_loader"]


@runtime_checkable
class Loader(Protocol):
    """The loader contract (``largebatch.data``'s module docstring has the rules)."""

    num_samples: int
    num_classes: int

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def close(self) -> None: ...


class MicroBatches:
    """The micro-batches (arrays of record indices) a rank reads in each epoch, and the
    random-stream rule that goes with them.

    Training: ``sharding.rank_train_indices`` (a shuffle that is a function of
    ``(seed, epoch)``, cut by the plan), and each sample's augmentation uniforms a function
    of ``(seed, epoch, sample index)`` (``randomness.augmentation_uniforms``), so a micro-batch
    is the same whichever loader, rank count or worker reads it. Evaluation: the rank's
    block of ``sharding.rank_eval_indices``, the same every epoch, with no randomness.
    Picklable, so worker processes can compute an epoch's batches themselves.
    """

    def __init__(
        self,
        count: int,
        batch_size: int,
        *,
        plan: BatchPlan | None = None,
        rank: int = 0,
        seed: int = 0,
        fixed: list[np.ndarray] | None = None,
        repeats: int = 1,
    ) -> None:
        self.count, self.batch_size = count, batch_size
        self.train = plan is not None
        self.repeats = repeats
        self._plan, self._rank, self._seed, self._fixed = plan, rank, seed, fixed

    @classmethod
    def for_training(cls, plan: BatchPlan, rank: int, seed: int, repeats: int = 1) -> MicroBatches:
        """``repeats`` > 1: repeated augmentation; the batches hold virtual indices
        (``largebatch.data.sharding``: read sample ``index % num_samples``)."""
        return cls(plan.micro_batches_per_epoch, plan.micro_batch_size, plan=plan, rank=rank, seed=seed, repeats=repeats)

    @classmethod
    def for_evaluation(cls, num_records: int, batch_size: int, rank: int, world_size: int) -> MicroBatches:
        indices = rank_eval_indices(num_records, rank, world_size)
        batches = [indices[i : i + batch_size] for i in range(0, len(indices), batch_size)]
        return cls(math.ceil(len(indices) / batch_size), batch_size, fixed=batches)

    def __len__(self) -> int:
        """Micro-batches per epoch."""
        return self.count

    def __call__(self, epoch: int) -> list[np.ndarray]:
        """The epoch's micro-batches, in the order they are read."""
        if self._plan is None:
            return list(self._fixed or [])
        indices = rank_train_indices(self._plan, self._rank, self._seed, epoch, repeats=self.repeats)
        return list(indices.reshape(-1, self._plan.micro_batch_size))

    def draws(self, epoch: int, indices: np.ndarray) -> np.ndarray | None:
        """Augmentation uniforms for ``indices`` in ``epoch`` (None for evaluation)."""
        return augmentation_uniforms(self._seed, epoch, indices) if self.train else None

    def seeds(self, epoch: int, indices: np.ndarray) -> np.ndarray | None:
        """Per-sample seeds for the policies that draw from global generators (None for evaluation)."""
        return augmentation_seeds(self._seed, epoch, indices) if self.train else None


class IndexedLoader:
    """Epoch, position and state for a loader that reads ``MicroBatches``.

    ``set_epoch`` to another epoch starts it from its first micro-batch; the epoch a
    state was loaded into continues at the saved position. ``len()`` is the epoch's
    micro-batch count (a resumed epoch yields the rest of them). Subclasses implement
    ``_iterate`` and, when they hold processes or files, ``close``.

    Attributes:
        num_samples: records in the split (all ranks together).
        num_classes: classes (labels are 0-based on output).
        device: where batches are delivered.
        batches: the rank's ``MicroBatches``.
    """

    def __init__(self, num_samples: int, num_classes: int, batches: MicroBatches, device: torch.device) -> None:
        self.num_samples = int(num_samples)
        self.num_classes = int(num_classes)
        self.batches = batches
        self.device = torch.device(device)
        self.epoch = 0
        self._start = 0  # where the next pass over the epoch begins
        self._position = 0  # micro-batches of the epoch yielded so far

    def __len__(self) -> int:
        return len(self.batches)

    @property
    def start(self) -> int:
        """The micro-batch the next pass over the current epoch begins at (a resumed epoch's
        position, else 0)."""
        return self._start

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
        """Release processes, pipelines and files (idempotent); nothing by default."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._position = self._start
        try:
            remaining = self.batches(self.epoch)[self._start :]
            if remaining:
                for batch in self._iterate(remaining):
                    self._position += 1
                    yield batch
        finally:
            self._start = 0

    def _iterate(self, batches: list[np.ndarray]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(images, labels)`` on the device for each of ``batches``, in order."""
        raise NotImplementedError


class RecordLoader(IndexedLoader):
    """An ``IndexedLoader`` over a split's records (synthetic images, TFRecord shards) with
    the ``data`` section and the run's seed and rank: what ``build_loader`` builds.

    Args:
        records: the split's records (``len()`` of them).
        batches: the rank's micro-batches.
        data_cfg: the config's ``data`` section.
        seed: the run's seed.
        rank: this process's rank.
        device: where batches are delivered.
    """

    def __init__(self, records: Sized, batches: MicroBatches, *, data_cfg: DataConfig, seed: int, rank: int, device: torch.device) -> None:
        super().__init__(len(records), data_cfg.num_classes, batches, device)
        self.records, self.data_cfg, self.seed, self.rank = records, data_cfg, seed, rank

    @classmethod
    def for_device(cls, data_cfg: DataConfig, device: torch.device) -> type[RecordLoader]:
        """The class that reads ``data_cfg`` on ``device``: this one, unless it needs a package
        that is missing (a ``UserError`` naming it) or a device that is not there (a stand-in)."""
        return cls

    @classmethod
    def open(cls, data_cfg: DataConfig, *, train: bool) -> Sized:
        """The records of the training (``train``) or the evaluation split."""
        raise NotImplementedError

    def pipeline_seed(self) -> int:
        """A 31-bit seed of ``(seed, epoch, rank)`` for a pipeline's own random operators."""
        return zlib.crc32(f"{self.seed}/{self.epoch}/{self.rank}".encode()) & 0x7FFFFFFF


class ShardLoader(RecordLoader):
    """A ``RecordLoader`` over TFRecord shards (the native, DALI and media-pipeline loaders).
    Reads check record CRCs as ``data.verify_crc`` says, unless the class's ``verify_crc`` is
    False (DALI, whose reader reads the records: the shards are read only to name a bad one)."""

    records: ShardSet
    verify_crc = True

    @classmethod
    def open(cls, data_cfg: DataConfig, *, train: bool) -> ShardSet:
        """The split's shards under ``data.root`` (which the schema requires of these loaders)."""
        assert data_cfg.root is not None, "the schema requires data.root of a TFRecord loader"
        return ShardSet(data_cfg.root, data_cfg.train_split if train else data_cfg.eval_split, data_cfg.verify_crc and cls.verify_crc)


def labelled_jpeg(shards: ShardSet, index: int, label_offset: int, num_classes: int) -> tuple[bytes, int]:
    """Record ``index``'s JPEG bytes and 0-based label (the stored one less ``label_offset``).

    Raises:
        DataError: the record is not an ImageNet-schema Example, or its label is outside
            the classes (naming the shard, record and byte offset, and the settings).
    """
    try:
        jpeg, raw_label = image_and_label(decode_example(shards.read(index), (IMAGE, LABEL)))
    except ExampleDecodeError as err:
        raise DataError(f"{shards.where(index)}: not an ImageNet-schema Example ({err})") from err
    return jpeg, class_number(raw_label, num_classes=num_classes, label_offset=label_offset, where=shards.where(index))


def checked_jpeg(shards: ShardSet, index: int, label_offset: int, num_classes: int, max_pixels: int) -> tuple[bytes, int, tuple[int, int]]:
    """``labelled_jpeg``, and the JPEG's ``(height, width)`` from its header, checked against
    ``max_pixels`` before any decoder sees the bytes.

    Raises:
        DataError: as ``labelled_jpeg``; the bytes are not a JPEG or its header does not
            parse; the image is larger than ``max_pixels`` (each naming the record).
    """
    jpeg, label = labelled_jpeg(shards, index, label_offset, num_classes)
    try:
        return jpeg, label, checked_size(jpeg, max_pixels, lambda: shards.where(index))
    except ValueError as err:
        raise DataError(f"{shards.where(index)}: {undecodable(jpeg, err)}") from err


def build_loader(
    loader_class: type[RecordLoader],
    data_cfg: DataConfig,
    *,
    rank: int,
    device: torch.device,
    plan: BatchPlan | None = None,
    seed: int = 0,
    batch_size: int = 0,
    world_size: int = 1,
) -> RecordLoader:
    """A loader of ``loader_class`` (or of the class it names for ``device``). With ``plan``:
    the training loader of ``rank``, ``plan.micro_batches_per_epoch`` micro-batches per epoch
    shuffled by ``seed``. Without: the evaluation loader of ``rank``, every record exactly once
    across the ``world_size`` ranks, in order, in batches of ``batch_size`` (the last perhaps
    short).

    Raises:
        UserError: the loader's package is missing, or the plan counts another number of
            training samples.
        DataError: missing or inconsistent shards or index files.
    """
    loader_class = loader_class.for_device(data_cfg, device)
    records = loader_class.open(data_cfg, train=plan is not None)
    if plan is None:
        batches = MicroBatches.for_evaluation(len(records), batch_size, rank, world_size)
    elif len(records) != plan.num_samples:
        raise UserError(
            f"the batch plan counts {plan.num_samples} training samples but the training split has {len(records)}; "
            "build the plan from largebatch.data.count_samples()",
            key="data.root",
        )
    else:
        batches = MicroBatches.for_training(plan, rank, seed, repeats=data_cfg.repeated_aug)
    return loader_class(records, batches, data_cfg=data_cfg, seed=seed, rank=rank, device=device)
