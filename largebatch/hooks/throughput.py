"""Throughput: samples per second for the whole job and per device, and the fraction
of time spent waiting for data, over each logging interval.

Wall-clock time between logging steps, so it includes everything a user waits for.
``samples_seen`` counts all ranks, so no collective is needed.
"""

from __future__ import annotations

import time

from largebatch.engine.hook import Hook, Priority


class ThroughputHook(Hook):
    priority = Priority.BELOW_NORMAL

    def __init__(self, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self._time = 0.0
        self._samples = 0
        self._wait = 0.0

    def _mark(self, state) -> None:
        self._time = time.perf_counter()
        self._samples = state.samples_seen
        self._wait = state.data_wait_seconds

    def before_train(self, state) -> None:
        self._mark(state)

    def after_eval(self, state) -> None:
        self._mark(state)  # evaluation time is not training throughput

    def after_step(self, state) -> None:
        if not state.is_log_step:
            return
        elapsed = max(time.perf_counter() - self._time, 1e-9)
        samples = state.samples_seen - self._samples
        state.metrics["samples_per_sec"] = samples / elapsed
        state.metrics["samples_per_sec_per_device"] = samples / elapsed / state.world_size
        state.metrics["data_wait_fraction"] = (state.data_wait_seconds - self._wait) / elapsed
        self._mark(state)
