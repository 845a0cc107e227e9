"""Hooks the study tests put in a base config, acting only while a marker file exists:
one fails a run at its start, one holds a run mid-training so a test can kill its worker."""

from __future__ import annotations

import os
import pathlib
import time

from largebatch.engine.hook import Hook


class FailWhileMarked(Hook):
    """While ``marker`` exists, a run with global batch ``batch`` and seed ``seed`` raises at its start."""

    def __init__(self, marker: str, batch: int, seed: int = 0, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self.marker, self.batch, self.seed = pathlib.Path(marker), batch, seed

    def before_run(self, state) -> None:
        cfg = state.run.config
        if self.marker.exists() and cfg.global_batch_size == self.batch and cfg.seed == self.seed:
            raise RuntimeError(f"failing on purpose: {self.marker} exists")


class HoldWhileMarked(Hook):
    """While ``marker`` exists, a run with global batch ``batch`` stops after step ``step``
    and waits there, its pid in ``held`` in the run directory (until the marker goes, or
    the process is killed)."""

    def __init__(self, marker: str, batch: int, step: int = 2, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self.marker, self.batch, self.step = pathlib.Path(marker), batch, step

    def after_step(self, state) -> None:
        if state.step != self.step or state.run.config.global_batch_size != self.batch or not self.marker.exists():
            return
        (state.run.run_dir / "held").write_text(str(os.getpid()))
        while self.marker.exists():
            time.sleep(0.1)


class SlowEvaluation(Hook):
    """Each evaluation of a run with global batch ``batch`` takes ``seconds`` longer (a
    sleep at its start): time a study must not count as training."""

    def __init__(self, batch: int, seconds: float, priority: int | str | None = "LOW") -> None:
        super().__init__(priority)
        self.batch, self.seconds = batch, seconds

    def before_eval(self, state) -> None:
        if state.run.config.global_batch_size == self.batch:
            time.sleep(self.seconds)
