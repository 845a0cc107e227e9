"""Data loaders behind one contract.

``data.loader`` picks a loader class (``synthetic``, ``native``, ``dali``, ``mediapipe``:
``loader_class``), and one builder (``largebatch.data.base.build_loader``) makes every
loader: ``build_train_loader(data_cfg, plan, *, rank, seed, device)`` and
``build_eval_loader(data_cfg, *, batch_size, rank, world_size, device)``;
``count_samples(data_cfg, part)`` counts the training or evaluation split without building
one. A loader (typed as ``largebatch.data.base.Loader``, a ``typing.Protocol``; the
built-in ones share ``base.IndexedLoader``, which owns the epoch, the position and the
state, and keep only their pipelines):

* has ``len()``: the micro-batches this rank yields per epoch (for training,
  ``plan.micro_batches_per_epoch``, following ``sharding.rank_train_indices``);
* ``set_epoch(epoch)`` before each epoch: a new epoch reshuffles and starts from its
  first micro-batch; the epoch a loader was restored to keeps its position;
* yields ``(images, labels)``: float32 NCHW normalised images and int64 0-based labels,
  both on the device;
* ``state_dict()`` / ``load_state_dict()`` hold its position in the epoch, so a resumed
  run continues at the next micro-batch;
* has ``num_samples`` and ``num_classes``;
* ``close()`` releases worker processes, pipelines and temporary files (idempotent;
  the run calls it when it ends, however it ends).

**Randomness** (``largebatch.randomness``): a loader draws nothing from global
generators. Shuffling is a function of ``(seed, epoch)``; each training sample's
augmentation (crop box, flip) of ``(seed, epoch, sample index)``, the same on every loader,
rank, world size and worker count; worker seeds of ``(seed, rank)``. So the micro-batches
a loader yields depend only on the epoch and the position, which is why a checkpoint holds
no loader state beyond the counters, and a resumed epoch yields exactly the micro-batches
the uninterrupted one would have.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from largebatch.batching import BatchPlan
from largebatch.config.sections import DataConfig

if TYPE_CHECKING:  # torch is imported by the loaders, not here: `largebatch --help` stays light
    import torch

    from largebatch.data.base import RecordLoader


def loader_class(data_cfg: DataConfig) -> type[RecordLoader]:
    """The class of ``data.loader`` (imported only when asked for: ``largebatch --help`` stays light)."""
    if data_cfg.loader == "synthetic":
        from largebatch.data.synthetic import SyntheticLoader

        return SyntheticLoader
    if data_cfg.loader == "dali":
        from largebatch.data.dali import DaliLoader

        return DaliLoader
    if data_cfg.loader == "mediapipe":
        from largebatch.data.mediapipe import MediaPipeLoader

        return MediaPipeLoader
    from largebatch.data.native import NativeLoader

    return NativeLoader


def count_samples(data_cfg: DataConfig, part: Literal["train", "eval"]) -> int:
    """Samples in the training (``part='train'``) or evaluation (``'eval'``) split: synthetic
    data's ``data.train_samples`` or ``data.eval_samples``, else the records of the shards named
    ``data.train_split`` or ``data.eval_split``, counted from their index files (no loader is built)."""
    train = {"train": True, "eval": False}[part]
    if data_cfg.loader == "synthetic":
        return data_cfg.train_samples if train else data_cfg.eval_samples
    from largebatch.data.tfrecord import count_records

    assert data_cfg.root is not None, "the schema requires data.root of a TFRecord loader"
    return count_records(data_cfg.root, data_cfg.train_split if train else data_cfg.eval_split)


def build_train_loader(data_cfg: DataConfig, plan: BatchPlan, *, rank: int, seed: int, device: torch.device) -> RecordLoader:
    """The training loader of ``data.loader`` for ``rank`` (``base.build_loader``); augmentation
    policies it lacks are refused (``largebatch.data.policies``: all but native; synthetic takes
    ``repeated_aug``)."""
    from largebatch.data.base import build_loader
    from largebatch.data.policies import refuse_policies

    if data_cfg.loader != "native":
        refuse_policies(data_cfg, data_cfg.loader)
    return build_loader(loader_class(data_cfg), data_cfg, plan=plan, rank=rank, seed=seed, device=device)


def build_eval_loader(data_cfg: DataConfig, *, batch_size: int, rank: int, world_size: int, device: torch.device, cache: bool = False):
    """The evaluation loader of ``data.loader`` for ``rank`` (``base.build_loader``);
    ``cache=True`` (``eval.cache``) wraps it in a ``CachedEvalLoader``."""
    from largebatch.data.base import build_loader

    loader = build_loader(loader_class(data_cfg), data_cfg, batch_size=batch_size, rank=rank, world_size=world_size, device=device)
    return CachedEvalLoader(loader) if cache else loader


class CachedEvalLoader:
    """An evaluation loader whose first complete pass is kept: later passes replay the
    same batches without reading, decoding or transferring anything.

    What is kept is what the model receives: float32 images and labels on the device,
    ``4 * channels * height * width`` bytes an image (31 MB for Fashion-MNIST's 10,000
    test images at 28 px, 30 GB for ImageNet's 50,000 validation images at 224 px), so
    it suits small evaluation sets that are evaluated often (a steps-to-target study
    evaluates dozens of times). Evaluation images are not augmented, so every pass is
    the same; a pass stopped part-way is not kept.
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.num_samples = loader.num_samples
        self.num_classes = loader.num_classes
        self._batches: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)

    def close(self) -> None:
        self._batches = None
        self.loader.close()

    def __iter__(self):
        if self._batches is not None:
            yield from self._batches
            return
        kept = []
        for images, labels in self.loader:
            # A copy: a loader may hand over buffers it refills for its next batch.
            kept.append((images.clone(), labels.clone()))
            yield kept[-1]
        self._batches = kept
