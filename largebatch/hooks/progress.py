"""A tqdm progress bar over the run's optimizer steps, on rank 0.

It turns itself off when stdout or stderr is not a terminal (a Slurm log, a pipe, a
test), where a bar only writes noise; ``force=True`` keeps it on. At each logging step
the bar shows the logged loss, top-1 and samples/s. Use it with ``log.console=False``,
or the console lines print between bar updates.
"""

from __future__ import annotations

import sys

from largebatch.engine.hook import Priority
from largebatch.hooks._closing import ClosingHook

SHOWN = (("loss", "loss"), ("train/top1", "top1"), ("samples_per_sec", "img/s"))


def is_terminal() -> bool:
    """Whether stdout and stderr both go to a terminal."""
    return all(getattr(stream, "isatty", lambda: False)() for stream in (sys.stdout, sys.stderr))


class ProgressBar(ClosingHook):
    """Args:
    force: show the bar even when output is not a terminal.
    """

    priority = Priority.LOWEST  # after the logger, whose record it shows
    held = "bar"

    def __init__(self, force: bool = False, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self.force = force
        self.bar = None

    def before_train(self, state) -> None:
        if not state.run.is_main or not (self.force or is_terminal()):
            return
        from tqdm.auto import tqdm

        self.bar = tqdm(total=state.run.total_steps, initial=state.step, unit="step", dynamic_ncols=True, file=sys.stderr)

    def after_step(self, state) -> None:
        if self.bar is None:
            return
        self.bar.set_description(f"epoch {state.epoch_number}/{state.run.config.epochs}", refresh=False)
        if state.current.log_record:
            shown = {
                label: f"{state.current.log_record[key]:.4g}"
                for key, label in SHOWN
                if isinstance(state.current.log_record.get(key), float)
            }
            self.bar.set_postfix(shown, refresh=False)
        self.bar.update(1)

    def after_train(self, state) -> None:
        self.release()
