"""The ``Task`` interface: what the model is trained for, and how it is scored.

The engine owns the order of work and the counters; a task owns the objective. Per
training micro-batch (after mixup / CutMix, see ``largebatch.data.mixup``) the engine
calls, under the backend's autocast::

    outputs = task.forward(train_model, batch.images)
    loss = task.loss(outputs, batch)               # a 0-d tensor: the micro-batch's mean

and the ``loss`` hook adds ``task.train_sums(outputs, batch)`` (no gradient) to its
running sums, publishing each as ``train/<name>`` (sum / samples) at logging steps.
Evaluation is ``task.evaluate(model, loader, backend)``: per batch ``forward`` (under
autocast) and ``eval_sums`` (outside it), the sums added up over batches and ranks, and
``eval_metrics`` turns the totals into ``eval/<name>`` values.

A task holds no trainable parameters (the optimizer and the checkpoints see only the
model's); ``forward`` must call ``model`` itself, which under DDP or FSDP is the wrapper
whose forward synchronises gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from largebatch.dist import all_reduce_sum

if TYPE_CHECKING:  # torch is imported where tensors are made: checking a config loads the task without it
    import torch

    from largebatch.backends.base import Backend
    from largebatch.data.base import Loader
    from largebatch.data.mixup import MixedBatch


class Task:
    """Base class of every task; subclasses implement ``loss``, ``eval_sums`` and
    ``eval_metrics``, and name their sums in ``eval_sum_names``.

    Class attributes:
        eval_sum_names: the quantities ``eval_sums`` returns, in order; evaluation adds
            them up over batches and ranks and hands them to ``eval_metrics`` by name,
            with ``samples`` (counted by ``evaluate`` itself) besides.
    """

    eval_sum_names: tuple[str, ...] = ()

    def forward(self, model: torch.nn.Module, images: torch.Tensor) -> Any:
        """The model's outputs for a batch of images (default: ``model(images)``)."""
        return model(images)

    def loss(self, outputs: Any, batch: MixedBatch) -> torch.Tensor:
        """The training loss of a micro-batch: a 0-d tensor, the mean over its samples
        (the engine weights micro-batches by ``1 / window`` for accumulation).

        Args:
            outputs: what ``forward`` returned for ``batch.images``.
            batch: the micro-batch after mixing: ``targets`` (soft targets, or the labels
                when nothing mixes), ``labels``, ``labels_b`` and ``lam``.
        """
        raise NotImplementedError

    def train_sums(self, outputs: Any, batch: MixedBatch) -> dict[str, torch.Tensor]:
        """Training metrics of a micro-batch as sums over its samples (0-d tensors; no
        host sync wanted). The ``loss`` hook publishes ``train/<name>`` = the interval's
        sum / its samples. Default: none."""
        return {}

    def eval_sums(self, outputs: Any, labels: torch.Tensor) -> torch.Tensor:
        """One evaluation batch's sums: a 1-D float64 tensor of ``len(eval_sum_names)``
        values on the device (the samples are counted by ``evaluate``)."""
        raise NotImplementedError

    def eval_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        """The evaluation metrics from ``totals`` (``eval_sum_names`` and ``samples`` to
        the sums over every batch of every rank); ``evaluate`` prefixes each name."""
        raise NotImplementedError

    def evaluate(
        self,
        model: torch.nn.Module,
        loader: Loader,
        backend: Backend,
        *,
        prefix: str = "eval",
        on_batch: Callable[[torch.Tensor, torch.Tensor, Any], None] | None = None,
    ) -> dict[str, float]:
        """The task's metrics of ``model`` over ``loader``, summed over ranks.

        Every rank must call it (it all-reduces once at the end). The model is put in
        eval mode for the pass and back in train mode after it.

        Args:
            model: the model (unwrapped: evaluation needs no gradient synchronisation).
            loader: yields ``(images, labels)`` batches on the device.
            backend: gives the device and the autocast context.
            prefix: each metric is returned as ``{prefix}/{name}``.
            on_batch: called with ``(images, labels, outputs)`` after each batch.

        Returns:
            ``eval_metrics`` of the totals, and ``samples`` unless it gives its own, each
            name prefixed.
        """
        import torch

        names = (*self.eval_sum_names, "samples")
        model.eval()
        with torch.no_grad():
            sums = torch.zeros(len(names), dtype=torch.float64, device=backend.device)
            try:
                for images, labels in loader:
                    with backend.autocast():
                        outputs = self.forward(model, images)
                    count = torch.tensor([float(labels.shape[0])], dtype=torch.float64, device=sums.device)
                    sums += torch.cat([self.eval_sums(outputs, labels), count])
                    if on_batch is not None:
                        on_batch(images, labels, outputs)
            finally:
                model.train()
            all_reduce_sum(sums)
            totals = dict(zip(names, sums.tolist(), strict=True))
            metrics = dict(self.eval_metrics(totals))
        metrics.setdefault("samples", totals["samples"])
        return {f"{prefix}/{name}": value for name, value in metrics.items()}
