"""Training loss and mixup-aware top-1 accuracy, averaged over each logging interval.

Values accumulate as device tensors every micro-step (no host sync); at a logging step
they are published to ``state.metrics`` as ``loss`` and ``train/top1`` (the logger
averages them over ranks). With mixup, a prediction scores ``lam`` for the first label
and ``1 - lam`` for the label mixed in (Colossal-AI's and timm's convention).
"""

from __future__ import annotations

import torch

from largebatch.data.mixup import mixed_correct
from largebatch.engine.hook import Hook, Priority


class LossAccuracyHook(Hook):
    priority = Priority.NORMAL

    def __init__(self, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self._reset()

    def _reset(self) -> None:
        self._loss: torch.Tensor | float = 0.0
        self._correct: torch.Tensor | float = 0.0
        self._samples = 0
        self._steps = 0

    def after_forward(self, state) -> None:
        self._correct = self._correct + mixed_correct(state.outputs.detach(), state.batch)
        self._samples += state.batch.labels.shape[0]

    def after_step(self, state) -> None:
        self._loss = self._loss + state.step_loss
        self._steps += 1
        if state.is_log_step:
            state.metrics["loss"] = torch.as_tensor(self._loss, dtype=torch.float32) / self._steps
            state.metrics["train/top1"] = torch.as_tensor(self._correct, dtype=torch.float32) / max(self._samples, 1)
            self._reset()
