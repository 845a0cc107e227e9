"""TensorBoard event files in ``<run_dir>/tensorboard``, on rank 0.

Every numeric value of the logger's record (``state.current.log_record``) becomes a scalar named
as in ``metrics.jsonl`` (``loss``, ``train/top1``, ``grad_norm/decay``, ...) at its
optimizer step; evaluation results too. Text values are skipped. Needs the
``tensorboard`` package (``pip install 'largebatch[tensorboard]'``); asking for this hook
without it is an error before training starts. View with
``tensorboard --logdir runs/``.
"""

from __future__ import annotations

from largebatch.engine.hook import Priority
from largebatch.errors import UserError
from largebatch.hooks._closing import ClosingHook
from largebatch.hooks.logger import numeric_values

SKIPPED = ("step", "epoch")


class TensorBoardSink(ClosingHook):
    """Args:
    subdir: the folder in the run directory for the event files.
    """

    priority = Priority.LOWEST
    held = "writer"

    def __init__(self, subdir: str = "tensorboard", priority: int | str | None = None) -> None:
        super().__init__(priority)
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            raise UserError(
                "the tensorboard hook needs the tensorboard package, which is not installed; "
                "pip install 'largebatch[tensorboard]' (or tensorboard), or drop the hook",
                key="hooks",
            ) from None
        self.subdir = subdir
        self.writer = None

    def before_run(self, state) -> None:
        if state.run.is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(state.run.run_dir / self.subdir))

    def _add(self, record: dict, step: int) -> None:
        if self.writer is None:
            return
        for key, value in numeric_values(record, skip=SKIPPED).items():
            self.writer.add_scalar(key, value, global_step=step)

    def after_step(self, state) -> None:
        if state.current.log_record is not None:
            self._add(state.current.log_record, state.step)

    def after_eval(self, state) -> None:
        self._add(state.eval_metrics, state.step)
        if self.writer is not None:
            self.writer.flush()

    def after_run(self, state) -> None:
        self.release()
