"""Gradient accumulation: how micro-batch losses combine into one optimizer step.

A rank runs a window of ``w`` micro-batches (``w = A``, or fewer in a trailing partial
window; see ``largebatch.batching``). Each micro-batch's loss is the mean over its
samples; it is multiplied by ``1 / w`` before backward, so after the window a rank's
gradient is the mean over its ``w * micro_batch_size`` samples. DDP then averages over
the ``world_size`` ranks, whose shares are equal, so the optimizer sees the mean
gradient over the whole global batch: the same gradient one device would compute on
the global batch at once (tested against that full-batch gradient).

Under DDP, all micro-steps but the window's last run inside ``no_sync()``: gradients
accumulate locally and are all-reduced once per optimizer step, not once per micro-step.
Under FSDP2 (``dist.strategy`` fsdp/hsdp) the same holds with gradient sync switched off
for those micro-steps; the reduce-scatter averages over ranks as DDP's all-reduce does.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager as ContextManager
from typing import TYPE_CHECKING, TypeGuard

import torch

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule


def micro_loss_weight(window: int) -> float:
    """Factor applied to each micro-batch's mean loss in a window of ``window`` micro-batches."""
    return 1.0 / window


def sync_context(
    model: torch.nn.Module, micro: int, window: int, *, sync_first: bool = False, sync_all: bool = False
) -> ContextManager[None]:
    """``model.no_sync()`` for every micro-step but the last of the window, when the model is DDP.

    An FSDP2 model instead gets ``set_requires_gradient_sync``: off for every micro-step
    but the last (gradients accumulate unsharded, and are reduce-scattered once), and on
    for the first as well when ``sync_first`` (FSDP2 adds the later reduced gradients to
    the first's), and for every one when ``sync_all`` (gradients then never exist
    unsharded beyond one block: less memory, one reduction per micro-step).
    """
    if _is_fsdp(model):
        model.set_requires_gradient_sync(sync_all or micro == window - 1 or (sync_first and micro == 0))
        return contextlib.nullcontext()
    if micro < window - 1 and isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def _is_fsdp(model: torch.nn.Module) -> TypeGuard[FSDPModule]:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return False
    return isinstance(model, FSDPModule)
