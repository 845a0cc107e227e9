"""Training loss and mixup-aware top-1 and top-5 accuracy, averaged over each logging
interval; evaluation loss, top-1 and top-5 come from ``Engine.evaluate``.

Values accumulate as device tensors every micro-step (no host sync); at a logging step
they are published to ``state.metrics`` as ``loss``, ``train/top1`` and ``train/top5``
(the logger averages them over ranks). With mixup, a prediction scores ``lam`` for the
first label and ``1 - lam`` for the label mixed in (Colossal-AI's and timm's convention);
for top-k, a label scores when it is among the ``k`` highest logits.
"""

from __future__ import annotations

from typing import Any

import torch

from largebatch.engine.hook import Hook, Priority


def mixed_topk_correct(logits: torch.Tensor, labels: torch.Tensor, labels_b: torch.Tensor | None, lam: float, k: int) -> torch.Tensor:
    """Mixup-aware count of samples whose label is in the top ``k``:
    ``lam * [a in top-k] + (1 - lam) * [b in top-k]`` summed over the batch.

    Args:
        logits: ``[B, C]``.
        labels: the first labels ``[B]``.
        labels_b: the labels mixed in, or None.
        lam: the weight of ``labels``.
        k: how many of the highest logits count (capped at ``C``).
    """
    top = logits.topk(min(k, logits.shape[-1]), dim=-1).indices
    hits = top.eq(labels.unsqueeze(1)).any(1).sum(dtype=torch.float32)
    if labels_b is None:
        return hits
    hits_b = top.eq(labels_b.unsqueeze(1)).any(1).sum(dtype=torch.float32)
    return hits * lam + hits_b * (1.0 - lam)


class LossAccuracyHook(Hook):
    """Publish ``loss``, ``train/top1`` and ``train/top5`` at each logging step."""

    priority = Priority.NORMAL

    def __init__(self, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self._reset()

    def _reset(self) -> None:
        self._loss: torch.Tensor | float = 0.0
        self._correct: torch.Tensor | float = 0.0
        self._correct5: torch.Tensor | float = 0.0
        self._samples = 0
        self._steps = 0

    def after_forward(self, state) -> None:
        logits, batch = state.outputs.detach(), state.batch
        self._correct = self._correct + mixed_topk_correct(logits, batch.labels, batch.labels_b, batch.lam, 1)
        self._correct5 = self._correct5 + mixed_topk_correct(logits, batch.labels, batch.labels_b, batch.lam, 5)
        self._samples += batch.labels.shape[0]

    def after_step(self, state) -> None:
        self._loss = self._loss + state.step_loss
        self._steps += 1
        if state.is_log_step:
            samples = max(self._samples, 1)
            state.metrics["loss"] = torch.as_tensor(self._loss, dtype=torch.float32) / self._steps
            state.metrics["train/top1"] = torch.as_tensor(self._correct, dtype=torch.float32) / samples
            state.metrics["train/top5"] = torch.as_tensor(self._correct5, dtype=torch.float32) / samples
            self._reset()

    def state_dict(self) -> dict[str, Any]:
        """The partial interval's sums (as floats: a checkpoint is taken on any step)."""
        as_float = lambda v: float(v) if isinstance(v, torch.Tensor) else v  # noqa: E731
        return {
            "loss": as_float(self._loss),
            "correct": as_float(self._correct),
            "correct5": as_float(self._correct5),
            "samples": self._samples,
            "steps": self._steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._loss, self._correct = state.get("loss", 0.0), state.get("correct", 0.0)
        self._correct5, self._samples, self._steps = state.get("correct5", 0.0), state.get("samples", 0), state.get("steps", 0)
