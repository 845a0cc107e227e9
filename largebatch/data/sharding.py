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

Repeated augmentation (``data.repeated_aug = R`` > 1, DeiT's ``RASampler``): the epoch's
order takes the first ``ceil(N / R)`` samples of the permutation and repeats each ``R``
times in a row, cut to ``N`` entries (the epoch keeps its length and step count), and
rank ``k`` takes every ``world_size``-th entry of each window from the ``k``-th, so the
``R`` copies of a sample go to ``R`` different ranks when there are that many. Copy ``r``
of sample ``i`` is the *virtual index* ``i + r * N``: loaders read sample ``index % N``
and draw its augmentation from the virtual index, so the copies are augmented
differently.
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


def repeated_order(perm: np.ndarray, repeats: int) -> np.ndarray:
    """The epoch's virtual indices under repeated augmentation (module docstring)."""
    n = len(perm)
    taken = perm[: -(-n // repeats)]
    copies = taken[:, None] + n * np.arange(repeats, dtype=np.int64)
    return copies.reshape(-1)[:n]


def rank_train_indices(plan: BatchPlan, rank: int, seed: int, epoch: int, shuffle: bool = True, repeats: int = 1) -> np.ndarray:
    """Indices rank ``rank`` trains on in ``epoch``, in the order it reads them.

    Returns an array of length ``plan.samples_per_rank_per_epoch``; consecutive runs of
    ``plan.micro_batch_size`` are its micro-batches. With ``repeats`` > 1 they are virtual
    indices (module docstring).
    """
    perm = epoch_permutation(plan.num_samples, seed, epoch, shuffle)
    if repeats > 1:
        perm = repeated_order(perm, repeats)
    micro, world = plan.micro_batch_size, plan.world_size
    pieces = []
    start = 0
    for window in plan.window_sizes():
        per_rank = window * micro
        if repeats > 1:  # strided, so a sample's copies land on different ranks
            pieces.append(perm[start + rank : start + per_rank * world : world])
        else:
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
