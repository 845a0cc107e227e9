"""A small two-group model on fixed micro-batches, and a hook that records what the
sinks see, for checking each built-in hook against a direct computation."""

from __future__ import annotations

import pathlib

import torch

from largebatch.engine.hook import Hook, Priority
from largebatch.hooks.logger import MetricsLogger
from largebatch.optim.param_groups import build_param_groups
from tests.engine.helpers import make_engine

CLASSES = 7
MICRO = 4
FEATURES = 6


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(FEATURES, 8)
        self.fc2 = torch.nn.Linear(8, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Records(Hook):
    """Keeps every logged record (``state.current.log_record``) and evaluation result."""

    priority = Priority.LOWEST

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[dict] = []
        self.evals: list[tuple[int, dict]] = []

    def after_step(self, state) -> None:
        if state.current.log_record is not None:
            self.logged.append(dict(state.current.log_record))

    def after_eval(self, state) -> None:
        self.evals.append((state.step, dict(state.eval_metrics)))


def batches(count: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(MICRO, FEATURES, generator=gen), torch.randint(CLASSES, (MICRO,), generator=gen)) for _ in range(count)]


def build(
    tmp_path: pathlib.Path,
    hooks: list[Hook],
    *,
    steps: int = 4,
    accumulation: int = 2,
    epochs: int = 1,
    optimizer: str = "sgd",
    model: torch.nn.Module | None = None,
    **overrides,
):
    """An engine over ``MLP`` (or ``model``) with groups ``decay`` / ``no_decay``, the
    logger and a ``Records`` hook (returned too)."""
    torch.manual_seed(0)
    model = model or MLP()
    groups = build_param_groups(model, weight_decay=0.1)
    if optimizer == "lamb":
        from largebatch.optim.lamb import Lamb

        opt = Lamb(groups, lr=0.05, weight_decay=0.1)
    elif optimizer == "lars":
        from largebatch.optim.lars import Lars

        opt = Lars(groups, lr=1.0, weight_decay=0.1, eta=1e-3)
    elif optimizer == "adamw":  # fused: it skips an update on a device flag (the deferred non-finite check)
        opt = torch.optim.AdamW(groups, lr=0.05, weight_decay=0.1, fused=True)
    else:
        opt = torch.optim.SGD(groups, lr=0.1)
    records = Records()
    engine = make_engine(
        model,
        batches(steps * accumulation),
        global_batch_size=MICRO * accumulation,
        micro_batch_size=MICRO,
        num_samples=MICRO * accumulation * steps,
        hooks=[*hooks, MetricsLogger(console=False), records],
        optimizer=opt,
        run_dir=tmp_path,
        epochs=epochs,
        **{"data.num_classes": CLASSES, "optimizer.lr": 0.1, **overrides},
    )
    return engine, records
