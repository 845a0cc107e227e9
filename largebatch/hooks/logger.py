"""The metrics sink: ``metrics.jsonl`` in the run directory and a console line, on rank 0.

At each logging step (every ``log.interval`` steps and the last) it collects
``state.current.metrics``: tensor values are averaged over ranks in one all-reduce, plain
numbers are taken as they are. Each line of ``metrics.jsonl`` is one JSON object with at
least ``step``, ``epoch``, ``loss``, ``lr`` and ``samples_per_sec``; evaluation results
are written as their own lines, with ``eval/`` keys; text values have credentials
redacted (``largebatch.config.redact``). The record is also left in
``state.current.log_record`` for the other sinks (``progress``, ``csv``, ``tensorboard``), which
run after this hook and so need no second all-reduce.

``epoch`` is the 1-based number of the epoch the record's step belongs to, as the console
line shows it (``epoch 1/5``). A resumed run's ``metrics.jsonl`` holds each step once:
the records written after the checkpoint it resumes from (the steps, and an evaluation
that ran after that checkpoint) are dropped when it starts, and those steps are logged
again as they are retrained (exact resume: the same values).
"""

from __future__ import annotations

import json
import math
import time
from typing import ClassVar

from largebatch.config.redact import redact_text
from largebatch.config.sections import LogConfig
from largebatch.dist import all_reduce_mean
from largebatch.engine.hook import Priority
from largebatch.hooks._closing import ClosingHook
from largebatch.rundir import METRICS, read_metric_lines

_SCHEMA = LogConfig()  # the log section's defaults: the config gives the same ones


def numeric_values(record: dict, skip: tuple[str, ...] = ("step",)) -> dict[str, float]:
    """The finite numbers of a logged record (text values, NaN and inf left out), without
    the keys in ``skip``: what the other sinks (tensorboard, the trackers) plot."""
    return {
        key: float(value)
        for key, value in record.items()
        if key not in skip and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    }


def drop_replayed(path, step: int, last_eval_step: int | None) -> None:
    """Keep the records of ``path`` up to the checkpoint a run resumes from (``step``, and
    its evaluation only when the checkpoint holds it), atomically.

    Raises:
        UserError: a line other than the last is not a metrics record.
    """
    kept = []
    for line, record in read_metric_lines(path):  # a last line cut short is dropped here
        if record["step"] > step:
            continue
        evaluation = any(key.startswith("eval") for key in record)
        if record.get("step") == step and evaluation and last_eval_step != step:
            continue
        kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    tmp.replace(path)


class MetricsLogger(ClosingHook):
    """Write metrics to ``metrics.jsonl`` and the console.

    Args:
        console: print a line per logging step (rank 0).
        filename: the JSON-lines file in the run directory.
    """

    priority = Priority.VERY_LOW
    argument_checks: ClassVar[dict[str, str]] = {"console": "log.console"}
    held = "_file"

    def __init__(self, console: bool = _SCHEMA.console, filename: str = METRICS, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self.console = console
        self.filename = filename
        self._file = None
        self._start = 0.0
        self._start_step = 0

    def before_run(self, state) -> None:
        self._start = time.time()
        self._start_step = state.step  # a resumed run starts past 0
        if state.run.is_main:
            state.run.run_dir.path.mkdir(parents=True, exist_ok=True)
            path = state.run.run_dir / self.filename
            if path.is_file():
                drop_replayed(path, state.step, state.last_eval_step)
            self._file = open(path, "a", buffering=1)

    def _write(self, state, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")

    def after_step(self, state) -> None:
        if not state.is_log_step:
            return
        import torch

        names = [k for k, v in state.current.metrics.items() if isinstance(v, torch.Tensor)]
        # text values (a hook's) with credentials redacted, for every sink after this one
        values = {
            k: redact_text(v) if isinstance(v, str) else v for k, v in state.current.metrics.items() if not isinstance(v, torch.Tensor)
        }
        if names:
            stacked = torch.stack([state.current.metrics[k].detach().float().reshape(()) for k in names])
            values.update(zip(names, all_reduce_mean(stacked).tolist()))
        record = {"step": state.step, "epoch": state.epoch_number, "lr": state.current.lr, "samples_seen": state.samples_seen, **values}
        state.current.log_record = record
        self._write(state, record)
        if self.console and state.run.is_main:
            print(self._line(state, record), flush=True)

    def _line(self, state, record: dict) -> str:
        parts = [f"step {state.step}/{state.run.total_steps}", f"epoch {state.epoch_number}/{state.run.config.epochs}"]
        task_metrics = [k for k in record if k.startswith("train/")]  # the task's (classification: train/top1, train/top5)
        for key in ("loss", *task_metrics, "lr", "batch/global", "samples_per_sec", "grad_norm"):
            if key in record:
                value = record[key]
                parts.append(f"{key} {value:.4g}" if isinstance(value, float) and math.isfinite(value) else f"{key} {value}")
        return " | ".join(parts)

    def after_eval(self, state) -> None:
        record = {"step": state.step, "epoch": state.epoch_number, **state.eval_metrics}
        self._write(state, record)
        if self.console and state.run.is_main:
            shown = ", ".join(f"{k} {v:.4f}" for k, v in state.eval_metrics.items() if not k.endswith("/samples"))
            print(f"eval at step {state.step}: {shown} ({int(state.eval_metrics.get('eval/samples', 0))} samples)", flush=True)

    def after_run(self, state) -> None:
        if state.run.is_main:
            ran = state.step - self._start_step
            print(
                f"done: {ran} steps in {time.time() - self._start:.1f}s (now at step {state.step}/{state.run.total_steps}); "
                f"run directory {state.run.run_dir}",
                flush=True,
            )
        self.release()
