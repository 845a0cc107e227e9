"""Mixup, CutMix and label smoothing as soft targets, on the device, on the batch.

Mixup: Zhang et al., "mixup: Beyond Empirical Risk Minimization" (arXiv:1710.09412).
CutMix: Yun et al., "CutMix" (arXiv:1905.04899). As in timm's ``Mixup`` (batch mode),
one ``lam`` is drawn per batch and each image is mixed with the batch reversed; for
CutMix, ``lam`` is corrected to the pasted box's true area. Label smoothing spreads
``label_smoothing`` of each target's mass evenly over all classes.

Randomness comes from the NumPy generator passed with each batch (the engine makes one
per micro-batch from ``(seed, rank, step, micro-batch)``, see ``largebatch.randomness``),
so mixing is reproducible and resumable without saving any state; without one, from the
object's own generator.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch


@dataclasses.dataclass
class MixedBatch:
    """A batch after mixing.

    Attributes:
        images: the mixed images.
        targets: soft targets ``[B, C]``, or the int64 labels when nothing mixes or
            smooths (the task's loss reads them, ``largebatch.tasks``).
        labels: the original labels.
        labels_b: the labels mixed in (``labels.flip(0)``), or None.
        lam: the weight of ``labels`` (1.0 when unmixed).
    """

    images: torch.Tensor
    targets: torch.Tensor
    labels: torch.Tensor
    labels_b: torch.Tensor | None = None
    lam: float = 1.0


class MixupCutmix:
    """Batch-mode Mixup / CutMix with label smoothing.

    Args:
        num_classes: number of classes of the soft targets.
        mixup_alpha: Beta(alpha, alpha) for mixup; 0 disables.
        cutmix_alpha: Beta(alpha, alpha) for CutMix; 0 disables.
        prob: probability that a batch is mixed at all.
        switch_prob: probability of CutMix rather than mixup when both are enabled.
        label_smoothing: mass spread over all classes.
        seed: seed of this object's generator (give each rank its own).
    """

    def __init__(
        self,
        num_classes: int,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        prob: float = 1.0,
        switch_prob: float = 0.5,
        label_smoothing: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.num_classes = num_classes
        self.mixup_alpha = mixup_alpha
        self.cutmix_alpha = cutmix_alpha
        self.prob = prob
        self.switch_prob = switch_prob
        self.label_smoothing = label_smoothing
        self.rng = np.random.default_rng(seed)

    @property
    def active(self) -> bool:
        """Whether targets are soft (any mixing or smoothing configured)."""
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0 or self.label_smoothing > 0

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, rng: np.random.Generator | None = None) -> MixedBatch:
        """Mix a batch, drawing from ``rng`` (default: this object's generator)."""
        if not self.active:
            return MixedBatch(images, labels, labels)
        rng = self.rng if rng is None else rng
        lam, use_cutmix = 1.0, False
        if (self.mixup_alpha > 0 or self.cutmix_alpha > 0) and rng.random() < self.prob:
            use_cutmix = self.cutmix_alpha > 0 and (self.mixup_alpha == 0 or rng.random() < self.switch_prob)
            alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
            lam = float(rng.beta(alpha, alpha))
        labels_b = labels.flip(0)
        if lam < 1.0:
            if use_cutmix:
                images, lam = self._cutmix(images, lam, rng)
            else:
                images = images.mul(lam).add_(images.flip(0), alpha=1.0 - lam)
        targets = self.soft_targets(labels, labels_b, lam, images.dtype)
        return MixedBatch(images, targets, labels, labels_b if lam < 1.0 else None, lam)

    def _cutmix(self, images: torch.Tensor, lam: float, rng: np.random.Generator) -> tuple[torch.Tensor, float]:
        height, width = images.shape[-2:]
        cut = math.sqrt(1.0 - lam)
        box_h, box_w = int(height * cut), int(width * cut)
        cy = int(rng.integers(height))
        cx = int(rng.integers(width))
        y0, y1 = max(cy - box_h // 2, 0), min(cy + box_h // 2, height)
        x0, x1 = max(cx - box_w // 2, 0), min(cx + box_w // 2, width)
        images = images.clone()
        images[..., y0:y1, x0:x1] = images.flip(0)[..., y0:y1, x0:x1]
        return images, 1.0 - (y1 - y0) * (x1 - x0) / (height * width)

    def soft_targets(self, labels: torch.Tensor, labels_b: torch.Tensor, lam: float, dtype: torch.dtype) -> torch.Tensor:
        off = self.label_smoothing / self.num_classes
        on = 1.0 - self.label_smoothing + off
        dtype = dtype if dtype.is_floating_point else torch.float32

        def one_hot(y: torch.Tensor) -> torch.Tensor:
            return torch.full((y.shape[0], self.num_classes), off, device=y.device, dtype=dtype).scatter_(1, y.unsqueeze(1), on)

        targets = one_hot(labels)
        if lam < 1.0:
            targets = targets.mul_(lam).add_(one_hot(labels_b), alpha=1.0 - lam)
        return targets
