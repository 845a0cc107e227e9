"""Build an ``Engine`` around any small model and fixed micro-batches (for exact tests)."""

from __future__ import annotations

import pathlib

import torch

from largebatch.backends.cpu import CpuBackend
from largebatch.config import derive
from largebatch.config.typed import typed
from largebatch.data.mixup import MixupCutmix
from largebatch.dist import DistInfo
from largebatch.engine.engine import Engine
from largebatch.engine.hook import Hook
from largebatch.engine.state import Run, TrainState
from largebatch.optim.schedules import build_schedule
from largebatch.randomness import RandomStreams
from largebatch.rundir import RunDir
from largebatch.tasks import ClassificationTask, Task
from tests.conftest import tiny_config


class ListLoader:
    """The loader contract over a list of ``(inputs, labels)`` micro-batches."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]], num_classes: int) -> None:
        self.batches = batches
        self.num_samples = sum(len(b[1]) for b in batches)
        self.num_classes = num_classes
        self.position = 0
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.batches)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.position = 0
        self.epoch = epoch

    def __iter__(self):
        while self.position < len(self.batches):
            batch = self.batches[self.position]
            self.position += 1
            yield batch
        self.position = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "micro_batch": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["micro_batch"]

    def close(self) -> None:
        """Nothing to release."""


def make_engine(
    model: torch.nn.Module,
    batches: list,
    *,
    global_batch_size: int,
    micro_batch_size: int,
    num_samples: int,
    world_size: int = 1,
    rank: int = 0,
    hooks: list[Hook] = (),
    optimizer: torch.optim.Optimizer | None = None,
    run_dir: pathlib.Path = pathlib.Path("/tmp/largebatch-test"),
    config_hooks: list = (),
    task: Task | None = None,
    **overrides,
) -> Engine:
    """``hooks`` are the engine's; ``config_hooks`` the config's ``hooks`` key, for the
    rules that read it (the adaptive batch's criterion asks for the noise_scale hook);
    ``task`` the run's (default: classification)."""
    overrides = {
        "hooks": list(config_hooks),
        "global_batch_size": global_batch_size,
        "micro_batch_size": micro_batch_size,
        "lr_schedule.warmup_steps": 0,
        "eval.at_end": False,
        "eval.interval_epochs": 0,
        **overrides,
    }
    cfg = typed(tiny_config(**overrides))
    derived = derive(cfg, world_size, num_samples)
    if derived.sharded:
        train_model = model = CpuBackend("fp32").shard_model(model, derived)  # FSDP2, in place
        if callable(optimizer):  # built after sharding, over the sharded parameters
            optimizer = optimizer(model)
    else:
        train_model = torch.nn.parallel.DistributedDataParallel(model) if world_size > 1 else model
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.1)
    backend = CpuBackend("fp32")
    run = Run(
        config=cfg,
        derived=derived,
        dist=DistInfo(rank, world_size, rank, "test"),
        backend=backend,
        model=model,
        train_model=train_model,
        optimizer=optimizer,
        schedule=build_schedule(cfg.lr_schedule, derived),
        scaler=None,
        mixup=MixupCutmix(cfg.data.num_classes),
        task=task or ClassificationTask(),
        run_dir=RunDir(run_dir),
        random=RandomStreams(cfg.seed, rank, backend),
    )
    return Engine(TrainState(run), list(hooks), ListLoader(batches, cfg.data.num_classes))
