"""``metrics.csv`` in the run directory: one row per logging step and per evaluation,
on rank 0, with the same values as ``metrics.jsonl``.

Columns are the union of the keys seen so far (``step`` and ``epoch`` first): a record
that brings a new key (the first evaluation, say) rewrites the file once with the wider
header; missing values are empty cells. A resumed run appends to the existing file.
Text values (the trust-ratio hook's layer names) are written as they are.
"""

from __future__ import annotations

import csv
import pathlib

from largebatch.engine.hook import Hook, Priority


class CsvSink(Hook):
    """Args:
    filename: the CSV file in the run directory.
    """

    priority = Priority.LOWEST

    def __init__(self, filename: str = "metrics.csv", priority: int | str | None = None) -> None:
        super().__init__(priority)
        self.filename = filename
        self.path: pathlib.Path | None = None
        self.columns: list[str] = []

    def before_run(self, state) -> None:
        if not state.run.is_main:
            return
        state.run.run_dir.path.mkdir(parents=True, exist_ok=True)
        self.path = state.run.run_dir / self.filename
        if self.path.exists():
            with open(self.path, newline="") as handle:
                self.columns = next(csv.reader(handle), [])

    def _append(self, record: dict) -> None:
        if self.path is None:
            return
        new = [key for key in record if key not in self.columns]
        if new or not self.path.exists():
            rows = []
            if self.path.exists():
                with open(self.path, newline="") as handle:
                    rows = list(csv.DictReader(handle))
            self.columns = self.columns + new
            with open(self.path, "w", newline="") as handle:
                writer = csv.DictWriter(handle, self.columns)
                writer.writeheader()
                writer.writerows(rows)
        with open(self.path, "a", newline="") as handle:
            csv.DictWriter(handle, self.columns).writerow(record)

    def after_step(self, state) -> None:
        if state.current.log_record is not None:
            self._append(state.current.log_record)

    def after_eval(self, state) -> None:
        self._append({"step": state.step, "epoch": state.epoch_number, **state.eval_metrics})
