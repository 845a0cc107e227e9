"""Training loss and the task's training metrics, averaged over each logging interval;
evaluation metrics come from ``Engine.evaluate``.

Values accumulate as device tensors every micro-step (no host sync); at a logging step
they are published to ``state.current.metrics`` as ``loss`` (the mean step loss) and
``train/<name>`` for each of the task's ``train_sums`` (the interval's sum over its
samples; the logger averages them over ranks). For classification these are
``train/top1`` and ``train/top5``, mixup-aware (``largebatch.tasks.classification``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from largebatch.engine.hook import Hook, Priority

if TYPE_CHECKING:  # torch is imported where tensors are made: checking a config loads the hook without it
    import torch


class LossAccuracyHook(Hook):
    """Publish ``loss`` and the task's ``train/<name>`` metrics at each logging step."""

    priority = Priority.NORMAL

    def __init__(self, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self._reset()

    def _reset(self) -> None:
        self._loss: torch.Tensor | float = 0.0
        self._sums: dict[str, torch.Tensor | float] = {}
        self._samples = 0
        self._steps = 0

    def after_forward(self, state) -> None:
        import torch

        batch = state.current.batch
        with torch.no_grad():
            sums = state.run.task.train_sums(state.current.outputs, batch)
        for name, value in sums.items():
            self._sums[name] = self._sums.get(name, 0.0) + value
        self._samples += batch.labels.shape[0]

    def after_step(self, state) -> None:
        self._loss = self._loss + state.current.step_loss
        self._steps += 1
        if state.is_log_step:
            import torch

            samples = max(self._samples, 1)
            state.current.metrics["loss"] = torch.as_tensor(self._loss, dtype=torch.float32) / self._steps
            for name, total in self._sums.items():
                state.current.metrics[f"train/{name}"] = torch.as_tensor(total, dtype=torch.float32) / samples
            self._reset()

    def state_dict(self) -> dict[str, Any]:
        """The partial interval's sums (as floats: a checkpoint is taken on any step)."""
        import torch

        as_float = lambda v: float(v) if isinstance(v, torch.Tensor) else v  # noqa: E731
        return {
            "loss": as_float(self._loss),
            "sums": {name: as_float(value) for name, value in self._sums.items()},
            "samples": self._samples,
            "steps": self._steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._loss, self._sums = state.get("loss", 0.0), dict(state.get("sums", {}))
        self._samples, self._steps = state.get("samples", 0), state.get("steps", 0)
