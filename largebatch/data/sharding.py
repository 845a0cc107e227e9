"""Which sample indices each rank reads, per epoch.

Every loader (synthetic, native TFRecord, DALI) shares this plan so a config can switch
``data.loader`` and train on the same samples in the same order:

* each epoch draws a permutation of all ``num_samples`` indices from ``(seed, epoch)``;
* window ``s`` of the epoch (one optimizer step) takes the next ``global_batch`` indices
  of the permutation (``micro * r * world_size`` for a short trailing window of ``r``
  micro-batches);
* rank ``k`` takes the ``k``-th contiguous slice of that window, and reads it in order,
  one micro-batch after another.

So the set of samples in optimizer step ``s`` depends only on ``(seed, epoch, s)`` and
the global batch size, never on the micro-batch size or the number of ranks, and the
ranks' shares are disjoint and of equal size.
"""

from __future__ import annotations

import numpy as np

from largebatch.batching import BatchPlan


def epoch_permutation(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """All sample indices in this epoch's order (identity when ``shuffle`` is false)."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64([seed, epoch]))
    return rng.permutation(num_samples).astype(np.int64)


def rank_train_indices(plan: BatchPlan, rank: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """Indices rank ``rank`` trains on in ``epoch``, in the order it reads them.

    Returns an array of length ``plan.samples_per_rank_per_epoch``; consecutive runs of
    ``plan.micro_batch_size`` are its micro-batches.
    """
    perm = epoch_permutation(plan.num_samples, seed, epoch, shuffle)
    micro, world = plan.micro_batch_size, plan.world_size
    pieces = []
    start = 0
    for window in plan.window_sizes():
        per_rank = window * micro
        lo = start + rank * per_rank
        pieces.append(perm[lo : lo + per_rank])
        start += per_rank * world
    return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)


def rank_eval_indices(num_samples: int, rank: int, world_size: int) -> np.ndarray:
    """Evaluation indices for ``rank``: every sample exactly once across ranks, in order.

    Ranks get contiguous blocks whose sizes differ by at most one, so no sample is
    repeated to pad a rank (padding would count some samples twice in the accuracy).
    """
    base, extra = divmod(num_samples, world_size)
    lo = rank * base + min(rank, extra)
    hi = lo + base + (1 if rank < extra else 0)
    return np.arange(lo, hi, dtype=np.int64)
