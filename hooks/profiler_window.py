"""A ``torch.profiler`` window over chosen optimizer steps, saved as a Chrome trace.

In a config::

    hooks = [dict(type='hooks/profiler_window.py:ProfilerWindowHook', start=20, steps=3)]

Profiles steps ``start`` to ``start + steps - 1``, numbered as in ``metrics.jsonl``
(1 is the first optimizer step; skip the first few, which warm up allocators and
kernels). Writes to ``profile/`` in the run directory, on every rank:

* ``trace_rank{R}.json``: the Chrome trace; open it in ``chrome://tracing`` or
  https://ui.perfetto.dev. Each profiled step is a ``largebatch_step_{N}`` range.
* ``key_averages_rank{R}.txt``: the operator table sorted by self time
  (``sort_by``), ``row_limit`` rows.

Activities: the CPU, plus CUDA when the backend's device is a GPU. The profiler starts
in ``before_step`` of the first profiled step and stops in ``after_step`` of the last
(this hook runs first at both), so the window holds whole steps: data loading, forward,
backward, the optimizer and the hooks, except the other hooks' ``after_step`` of the
last step.
A run that ends inside the window writes what it has.
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from largebatch.engine.hook import Hook, Priority


class ProfilerWindowHook(Hook):
    """Profile a window of optimizer steps.

    Args:
        start: the first profiled step (1 is the first optimizer step).
        steps: how many steps to profile.
        record_shapes: record operator input shapes (larger trace).
        profile_memory: record tensor allocations.
        with_stack: record Python stacks (much larger trace).
        sort_by: the key-averages table's sort column.
        row_limit: rows in the key-averages table.
        directory: the folder in the run directory.
    """

    priority = Priority.HIGHEST  # the window opens before other hooks' before_step

    def __init__(
        self,
        start: int = 10,
        steps: int = 3,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        sort_by: str = "self_cpu_time_total",
        row_limit: int = 40,
        directory: str = "profile",
        priority: int | str | None = None,
    ) -> None:
        super().__init__(priority)
        if int(start) < 1 or int(steps) < 1:
            raise ValueError(f"start and steps must be >= 1, got start={start}, steps={steps}")
        self.start, self.steps = int(start), int(steps)
        self.options = dict(record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack)
        self.sort_by, self.row_limit, self.directory = sort_by, int(row_limit), directory
        self._profiler = None
        self._range = None

    @property
    def last(self) -> int:
        return self.start + self.steps - 1

    def before_step(self, state) -> None:
        step = state.step + 1
        if step == self.start:
            activities = [ProfilerActivity.CPU]
            if torch.device(state.run.backend.device).type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            self._profiler = profile(activities=activities, **self.options)
            self._profiler.__enter__()
        if self._profiler is not None and self.start <= step <= self.last:
            self._range = record_function(f"largebatch_step_{step}")
            self._range.__enter__()

    def after_step(self, state) -> None:
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        if self._profiler is not None and state.step >= self.last:
            self._finish(state)

    def after_run(self, state) -> None:
        self._finish(state)

    def on_exception(self, state, exception: BaseException) -> None:
        self._finish(state)

    def _finish(self, state) -> None:
        if self._profiler is None:
            return
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        prof, self._profiler = self._profiler, None
        prof.__exit__(None, None, None)
        out = state.run.run_dir / self.directory
        out.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(out / f"trace_rank{state.run.rank}.json"))
        table = prof.key_averages().table(sort_by=self.sort_by, row_limit=self.row_limit)
        (out / f"key_averages_rank{state.run.rank}.txt").write_text(table + "\n")
        if state.run.is_main:
            print(f"profiler_window: steps {self.start}-{min(self.last, state.step)} written to {out}", flush=True)
