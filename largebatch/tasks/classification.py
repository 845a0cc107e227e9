"""Image classification: cross-entropy against (soft) class targets, top-1 and top-5.

Training loss: cross-entropy against the soft targets mixup, CutMix and label
smoothing make (``largebatch.data.mixup``), or plain cross-entropy against the labels
when nothing mixes or smooths. Training accuracy is mixup-aware, as in Colossal-AI and
timm: a prediction scores ``lam`` for the first label and ``1 - lam`` for the label
mixed in; for top-k a label scores when it is among the ``k`` highest logits.
Evaluation: cross-entropy, top-1 and top-5 over the evaluation split.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from largebatch.tasks.base import Task

if TYPE_CHECKING:  # torch is imported where tensors are made: checking a config loads the task without it
    import torch

    from largebatch.data.mixup import MixedBatch


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against soft targets ``[B, C]`` (or int64 labels ``[B]``), averaged over the batch."""
    import torch

    if targets.dtype == torch.int64:
        return torch.nn.functional.cross_entropy(logits, targets)
    return torch.sum(-targets * torch.log_softmax(logits.float(), dim=-1), dim=-1).mean()


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
    import torch

    top = logits.topk(min(k, logits.shape[-1]), dim=-1).indices
    hits = top.eq(labels.unsqueeze(1)).any(1).sum(dtype=torch.float32)
    if labels_b is None:
        return hits
    hits_b = top.eq(labels_b.unsqueeze(1)).any(1).sum(dtype=torch.float32)
    return hits * lam + hits_b * (1.0 - lam)


class ClassificationTask(Task):
    """The default task: logits from the model, ``soft_cross_entropy`` for training,
    ``train/top1`` and ``train/top5`` while training, ``eval/loss``, ``eval/top1``,
    ``eval/top5`` and ``eval/samples`` from evaluation."""

    eval_sum_names = ("loss", "top1", "top5")

    def loss(self, outputs: torch.Tensor, batch: MixedBatch) -> torch.Tensor:
        return soft_cross_entropy(outputs, batch.targets)

    def train_sums(self, outputs: torch.Tensor, batch: MixedBatch) -> dict[str, torch.Tensor]:
        return {k: mixed_topk_correct(outputs, batch.labels, batch.labels_b, batch.lam, n) for k, n in (("top1", 1), ("top5", 5))}

    def eval_sums(self, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        import torch

        loss = torch.nn.functional.cross_entropy(outputs.float(), labels, reduction="sum")
        hits = outputs.topk(min(5, outputs.shape[-1]), dim=-1).indices.eq(labels.unsqueeze(1))
        return torch.stack([loss.double(), hits[:, 0].sum().double(), hits.any(1).sum().double()])

    def eval_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        count = max(totals["samples"], 1.0)
        return {"loss": totals["loss"] / count, "top1": totals["top1"] / count, "top5": totals["top5"] / count, "samples": count}
