"""The run's random streams: every draw is a function of the seed and the run's counters.

The rule, for every loader, device and launcher:

* **Model randomness** (dropout, drop-path, anything the forward pass draws from torch's
  global generators) and Python's and NumPy's global generators are reseeded right before
  every forward pass from ``(seed, rank, step, micro-batch in the window)``
  (``RandomStreams.seed_forward``). Nothing that happens between two forward passes
  (creating a loader iterator, a hook drawing a number, an evaluation, a resume) shifts
  the next one's dropout masks.
* **Mixup / CutMix** draw from a NumPy generator made for each micro-batch from the same
  ``(seed, rank, step, micro-batch)`` (``RandomStreams.mixup_generator``).
* **Augmentation** (random-resized-crop box, flip) is a function of
  ``(seed, epoch, sample index)`` alone (``augmentation_uniforms``): the same sample gets
  the same crop on every rank, world size, worker count and loader (native and DALI
  compute the same boxes from the same numbers). The policies taken from timm and
  torchvision (RandAugment / AutoAugment, colour jitter, random erasing), which draw from
  Python's, NumPy's and torch's global generators, run with those generators seeded from
  a per-sample seed of the same ``(seed, epoch, sample index)`` (``augmentation_seeds``)
  and restored afterwards (``seeded_globals``). Under repeated augmentation the index is
  the copy's virtual index (``largebatch.data.sharding``), so copies differ.
* **Shuffling** is a function of ``(seed, epoch)`` (``largebatch.data.sharding``).
* **Loader workers** draw nothing; their base seed comes from a generator of their own,
  seeded from ``(seed, rank)``, never from the global one.

So a checkpoint needs no generator state: the counters it holds (step, epoch, position
in the epoch) re-derive every stream, and a resumed run takes the same steps as one that
was never stopped. The exception is a change of world size, where the per-rank streams
are those of the new world size (still deterministic).

Seeds are mixed with ``numpy.random.SeedSequence`` (per micro-batch, a few microseconds);
per-sample uniforms come from a counter-based hash (SplitMix64's finaliser, Steele et al.,
"Fast splittable pseudorandom number generators", OOPSLA 2014), vectorised over a batch.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

# Purposes, so streams made from the same counters never coincide.
_FORWARD, _MIXUP, _WORKERS, _AUGMENT, _POLICY = 1, 2, 3, 4, 5

CROP_ATTEMPTS = 10
"""Tries of the random-resized-crop sampling rule (torchvision's ``get_params``)."""

AUGMENTATION_DRAWS = 2 * CROP_ATTEMPTS + 3
"""Uniforms per training sample: (area, log-aspect) per try, top, left, flip."""


def derive_seed(*words: int) -> int:
    """A 63-bit seed mixed from non-negative integers (``SeedSequence``)."""
    state = np.random.SeedSequence([int(w) for w in words]).generate_state(2, np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def _mix64(x: np.ndarray) -> np.ndarray:
    # SplitMix64's finaliser; uint64 arithmetic wraps, which is the intent.
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def augmentation_uniforms(seed: int, epoch: int, indices: np.ndarray, count: int = AUGMENTATION_DRAWS) -> np.ndarray:
    """Uniforms in [0, 1) for training samples, a function of ``(seed, epoch, index, j)``.

    Args:
        seed: the run's seed.
        epoch: the epoch (0-based).
        indices: sample indices in the split, any order.
        count: uniforms per sample.

    Returns:
        float64 array ``[len(indices), count]``; row ``i`` depends only on
        ``(seed, epoch, indices[i])``.
    """
    key = np.uint64(derive_seed(seed, epoch, _AUGMENT))
    counter = np.asarray(indices, dtype=np.uint64).reshape(-1, 1) * np.uint64(count) + np.arange(count, dtype=np.uint64)
    bits = _mix64(_mix64(counter ^ key) + np.uint64(0x9E3779B97F4A7C15))
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def augmentation_seeds(seed: int, epoch: int, indices: np.ndarray) -> np.ndarray:
    """One 63-bit seed per training sample, a function of ``(seed, epoch, index)``, for the
    augmentation policies that draw from global generators (``seeded_globals``)."""
    key = np.uint64(derive_seed(seed, epoch, _POLICY))
    bits = _mix64(_mix64(np.asarray(indices, dtype=np.uint64) ^ key) + np.uint64(0x9E3779B97F4A7C15))
    return (bits >> np.uint64(1)).astype(np.int64)


class seeded_globals:  # noqa: N801 - used as a context manager, like torch.random.fork_rng
    """Python's, NumPy's and torch's global generators (torch's on ``device`` too, when it
    is not the CPU) seeded from ``seed`` inside the block and restored after it, so a
    library's draws there are a function of ``seed`` and shift no other stream."""

    def __init__(self, seed: int, device: torch.device | None = None) -> None:
        self.seed = int(seed)
        self.device = device

    def __enter__(self) -> None:
        self._saved = (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
        on_cuda = self.device is not None and self.device.type == "cuda"
        self._cuda = torch.cuda.get_rng_state(self.device) if on_cuda else None
        random.seed(self.seed)
        np.random.seed(self.seed % (1 << 32))
        torch.manual_seed(self.seed)  # also seeds CUDA's generators: restored below

    def __exit__(self, *exc: object) -> None:
        python, numpy_state, torch_state = self._saved
        random.setstate(python)
        np.random.set_state(numpy_state)
        torch.random.set_rng_state(torch_state)
        if self._cuda is not None:
            torch.cuda.set_rng_state(self._cuda, self.device)


class RandomStreams:
    """The per-rank streams of a run (module docstring has the rule).

    Args:
        seed: the run's seed.
        rank: this process's rank.
        backend: the device backend; its ``seed(int)`` seeds the device's generators.
    """

    def __init__(self, seed: int, rank: int, backend: Any) -> None:
        self.seed = int(seed)
        self.rank = int(rank)
        self.backend = backend

    def seed_forward(self, step: int, micro: int) -> None:
        """Reseed torch's (CPU and device), Python's and NumPy's global generators for the
        forward and backward pass of micro-batch ``micro`` of optimizer step ``step``."""
        value = derive_seed(self.seed, self.rank, step, micro, _FORWARD)
        torch.default_generator.manual_seed(value)
        self.backend.seed(value)
        random.seed(value)
        np.random.seed(value % 2**32)

    def mixup_generator(self, step: int, micro: int) -> np.random.Generator:
        """The generator mixup and CutMix draw from for micro-batch ``micro`` of ``step``."""
        return np.random.Generator(np.random.PCG64(derive_seed(self.seed, self.rank, step, micro, _MIXUP)))


def worker_generator(seed: int, rank: int) -> torch.Generator:
    """A generator for a ``DataLoader``'s base seed, so creating its iterator never draws
    from the global generator (and the workers' seeds follow ``(seed, rank)``)."""
    return torch.Generator().manual_seed(derive_seed(seed, rank, _WORKERS))
