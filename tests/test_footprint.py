"""The memory estimate's optimizer state: as many parameter-sized tensors as the optimizer,
built from the same section, holds after a step (its class's defaults where the config is silent)."""

from __future__ import annotations

import pytest
import torch

from largebatch.config.frozen import FrozenDict
from largebatch.config.sections import OptimizerConfig
from largebatch.footprint import optimizer_state_tensors
from largebatch.optim import optimizer_class

CASES = [
    ("adamw", {}),
    ("adamw", {"amsgrad": True}),
    ("lamb", {}),
    ("lars", {}),  # momentum 0.9 by default: one buffer
    ("lars", {"momentum": 0.0}),
    ("sgd", {}),  # momentum 0 by default: none
    ("sgd", {"momentum": 0.9}),
    ("sgd", {"momentum": 0.9, "nesterov": True}),
]


@pytest.mark.parametrize("kind,extra", CASES, ids=[f"{k}-{sorted(e.items())}" for k, e in CASES])
def test_the_estimate_counts_the_state_the_optimizer_keeps(kind, extra):
    param = torch.nn.Parameter(torch.randn(4, 3))
    optimizer = optimizer_class(kind)([param], lr=0.1, **extra)
    param.grad = torch.randn_like(param)
    optimizer.step()
    held = sum(1 for value in optimizer.state[param].values() if torch.is_tensor(value) and value.shape == param.shape)
    assert optimizer_state_tensors(OptimizerConfig(lr=0.1, type=kind, extra=FrozenDict(extra))) == held
