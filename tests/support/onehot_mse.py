"""A custom task (loaded by path or by module in tests, shown in docs/tasks.md): the
model's outputs regress one-hot targets under a squared error, with mean squared error
as its training and evaluation metric."""

import torch

from largebatch.tasks import Task


class OneHotMSE(Task):
    """Squared error between the outputs and ``scale`` times the targets (one-hot labels,
    or mixup's soft targets), summed over classes, averaged over the batch."""

    eval_sum_names = ("squared_error",)

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def targets(self, labels: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
        if labels.dtype == torch.int64:
            labels = torch.nn.functional.one_hot(labels, outputs.shape[-1])
        return self.scale * labels.to(outputs.dtype)

    def squared_error(self, outputs, labels):
        return (outputs.float() - self.targets(labels, outputs.float())).square().sum(-1)

    def loss(self, outputs, batch):
        return self.squared_error(outputs, batch.targets).mean()

    def train_sums(self, outputs, batch):
        return {"mse": self.squared_error(outputs, batch.targets).sum()}

    def eval_sums(self, outputs, labels):
        return self.squared_error(outputs, labels).sum().double().reshape(1)

    def eval_metrics(self, totals):
        return {"mse": totals["squared_error"] / max(totals["samples"], 1.0)}
