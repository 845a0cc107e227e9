"""SYNTHETIC data: seeded random images and labels, for testing the engine without files.

Each sample is a pure function of ``(data.synthetic_seed, split, index)``: its label is drawn from a
generator seeded by that triple, and its image is that class's fixed prototype (a smooth
random pattern, also drawn from the seed) times ``data.signal`` plus unit Gaussian
noise. Because samples depend only on their index, and ``sharding`` assigns indices to
optimizer steps independently of the micro-batch size and world size, the same global
batch comes out however a run is split. ``synthetic_seed`` names the data set; the run's
``seed`` only shuffles it. The prototypes make the task learnable, so a
demo run shows the loss fall; nothing here is a real dataset.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from largebatch.config.sections import DataConfig
from largebatch.data.base import RecordLoader

SPLIT_IDS = {"train": 1, "eval": 2}


def _sample_seed(seed: int, split: str, index: int) -> int:
    # SeedSequence mixes the three integers so neighbouring indices get unrelated streams.
    return int(np.random.SeedSequence([seed, SPLIT_IDS[split], int(index)]).generate_state(1, np.uint64)[0] >> 1)


class SyntheticImages:
    """Deterministic synthetic images: ``sample(i)`` is always the same tensor pair."""

    def __init__(self, *, num_samples: int, num_classes: int, channels: int, image_size: int, seed: int, split: str, signal: float) -> None:
        self.num_samples = num_samples
        self.num_classes = num_classes
        self.shape = (channels, image_size, image_size)
        self.seed = seed
        self.split = split
        self.signal = signal
        gen = torch.Generator().manual_seed(seed)
        coarse = torch.randn(num_classes, channels, 4, 4, generator=gen)
        self.prototypes = F.interpolate(coarse, size=(image_size, image_size), mode="bilinear", align_corners=False)

    def __len__(self) -> int:
        return self.num_samples

    def sample(self, index: int) -> tuple[torch.Tensor, int]:
        gen = torch.Generator().manual_seed(_sample_seed(self.seed, self.split, index))
        label = int(torch.randint(self.num_classes, (1,), generator=gen))
        noise = torch.randn(self.shape, generator=gen)
        return self.prototypes[label] * self.signal + noise, label

    def batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = zip(*(self.sample(int(i) % self.num_samples) for i in indices))  # % : repeated_aug's virtual indices
        return torch.stack(images), torch.tensor(labels, dtype=torch.int64)


class SyntheticLoader(RecordLoader):
    """Micro-batches of ``SyntheticImages`` for one rank, following the sharding plan and
    the loader contract (``IndexedLoader``); the arguments are ``RecordLoader``'s."""

    records: SyntheticImages

    @classmethod
    def open(cls, data_cfg: DataConfig, *, train: bool) -> SyntheticImages:
        """``data.train_samples`` (``train``) or ``data.eval_samples`` images."""
        return SyntheticImages(
            num_samples=data_cfg.train_samples if train else data_cfg.eval_samples,
            num_classes=data_cfg.num_classes,
            channels=data_cfg.channels,
            image_size=data_cfg.image_size,
            seed=data_cfg.synthetic_seed,
            split="train" if train else "eval",
            signal=data_cfg.signal,
        )

    def _iterate(self, batches):
        for indices in batches:
            images, labels = self.records.batch(indices)
            yield images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)
