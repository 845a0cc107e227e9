"""The loader base and the loader contract's Protocol, against the plan and the uninterrupted epoch."""

from __future__ import annotations

import numpy as np
import torch

from largebatch import data as data_mod
from largebatch.batching import BatchPlan
from largebatch.config.typed import section
from largebatch.data.base import IndexedLoader, Loader, MicroBatches
from largebatch.data.sharding import rank_eval_indices, rank_train_indices
from largebatch.randomness import augmentation_uniforms
from tests.data.conftest import data_cfg
from tests.engine.helpers import ListLoader

CPU = torch.device("cpu")
PLAN = BatchPlan.create(global_batch_size=16, micro_batch_size=4, world_size=2, num_samples=48)


class IndexLoader(IndexedLoader):
    """Yields each micro-batch's indices as its "images": the base's bookkeeping laid bare."""

    def _iterate(self, batches):
        for indices in batches:
            yield torch.as_tensor(indices), torch.zeros(len(indices), dtype=torch.int64)


def test_micro_batches_follow_the_plan_and_the_random_stream_rule():
    train = MicroBatches.for_training(PLAN, rank=1, seed=5)
    assert len(train) == PLAN.micro_batches_per_epoch and train.train
    for epoch in (0, 3):
        expected = rank_train_indices(PLAN, 1, 5, epoch).reshape(-1, 4)
        assert np.array_equal(np.stack(train(epoch)), expected)
        assert np.array_equal(train.draws(epoch, expected[0]), augmentation_uniforms(5, epoch, expected[0]))
    evaluation = MicroBatches.for_evaluation(10, 3, rank=1, world_size=2)
    assert not evaluation.train and len(evaluation) == 2 and evaluation.draws(0, np.arange(3)) is None
    assert np.array_equal(np.concatenate(evaluation(7)), rank_eval_indices(10, 1, 2))


def test_base_resumes_mid_epoch_and_restarts_a_new_epoch():
    def loader():
        return IndexLoader(48, 2, MicroBatches.for_training(PLAN, rank=0, seed=1), CPU)

    full = loader()
    full.set_epoch(2)
    reference = [images.tolist() for images, _ in full]
    assert len(reference) == len(full) == PLAN.micro_batches_per_epoch

    first = loader()
    first.set_epoch(2)
    iterator = iter(first)
    head = [next(iterator)[0].tolist() for _ in range(2)]
    state = first.state_dict()
    assert state == {"epoch": 2, "micro_batch": 2} and head == reference[:2]

    resumed = loader()
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # the engine selects the loaded epoch again: the position stays
    assert [images.tolist() for images, _ in resumed] == reference[2:]
    assert resumed.state_dict() == {"epoch": 2, "micro_batch": len(reference)}
    resumed.set_epoch(2)  # a second pass over the epoch starts at its first micro-batch
    assert [images.tolist() for images, _ in resumed] == reference

    moved = loader()
    moved.load_state_dict(state)
    moved.set_epoch(3)  # another epoch than the loaded one starts from its beginning
    assert len([b for b in moved]) == len(reference)


def test_every_loader_satisfies_the_protocol(unique_shards, tmp_path):
    cfg = data_cfg(unique_shards, 48)
    synthetic_cfg = section("data", {"train_samples": 48, "eval_samples": 8, "num_classes": 3, "channels": 1, "image_size": 8,
                                     "synthetic_seed": 0, "signal": 1.0, "train_split": "train"})  # fmt: skip
    loaders = [
        data_mod.build_train_loader(cfg, PLAN, rank=0, seed=0, device=CPU),
        data_mod.build_eval_loader(cfg, batch_size=4, rank=0, world_size=1, device=CPU),
        data_mod.build_train_loader(synthetic_cfg, PLAN, rank=0, seed=0, device=CPU),
        data_mod.build_eval_loader(synthetic_cfg, batch_size=4, rank=0, world_size=1, device=CPU),
        data_mod.build_eval_loader(data_cfg(unique_shards, 48, loader="dali"), batch_size=4, rank=0, world_size=1, device=CPU),
        data_mod.CachedEvalLoader(data_mod.build_eval_loader(cfg, batch_size=4, rank=0, world_size=1, device=CPU)),
        ListLoader([(torch.zeros(2, 1), torch.zeros(2, dtype=torch.int64))], num_classes=2),
    ]
    for loader in loaders:
        assert isinstance(loader, Loader), type(loader).__name__
        loader.close()
    assert not isinstance(object(), Loader)
