"""Throughput over each logging interval: samples per second per device and for the
whole job, the fraction of time spent waiting for data, and, from the model's FLOPs,
TFLOP/s per device and model-FLOPs utilisation (MFU) where the device's peak is known.

Wall-clock time between logging steps on each rank, so it includes everything a user
waits for. The values are device tensors that the logger averages over ranks in its one
all-reduce (logging steps only): ``samples_per_sec_per_device`` is the mean over ranks,
``samples_per_sec`` the sum (each rank publishes its rate times the world size).

FLOPs are counted once per input shape (``largebatch.flops``: one extra forward of a
single sample under ``FlopCounterMode``, at the first micro-batch of that shape), a
training sample costing three forwards. ``tflops_per_device`` is that times the per-device
rate; ``mfu`` divides it by the peak: ``peak_tflops`` when given, else the table in
``largebatch.flops`` for the GPU or Gaudi and the run's precision (none on a CPU).
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from largebatch import flops as flops_mod
from largebatch.config.schema import Field
from largebatch.engine.hook import Hook, Priority


class ThroughputHook(Hook):
    """Args:
    count_flops: count the model's FLOPs and log ``tflops_per_device`` (and ``mfu``).
    peak_tflops: the device's dense peak TFLOP/s for the run's precision (None: look it up).
    """

    priority = Priority.BELOW_NORMAL
    argument_checks: ClassVar[dict[str, Field]] = {"peak_tflops": Field(float, None, low=0, low_open=True, nullable=True)}

    def __init__(self, count_flops: bool = True, peak_tflops: float | None = None, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self.count_flops = count_flops
        self.peak_tflops = peak_tflops
        self.flops_per_sample: dict[tuple[int, ...], int] = {}
        self._flops = 0.0  # training FLOPs run on this rank since the mark
        self._time = 0.0
        self._samples = 0
        self._wait = 0.0

    def _mark(self, state) -> None:
        self._time = time.perf_counter()
        self._samples = state.samples_seen
        self._wait = state.data_wait_seconds
        self._flops = 0.0

    def before_train(self, state) -> None:
        if self.peak_tflops is None:
            self.peak_tflops = flops_mod.peak_tflops(state.run.backend)
        self._mark(state)

    def after_eval(self, state) -> None:
        self._mark(state)  # evaluation time is not training throughput

    def after_forward(self, state) -> None:
        if not self.count_flops:
            return
        images = state.current.batch.images
        shape = tuple(images.shape[1:])
        if shape not in self.flops_per_sample:
            self.flops_per_sample[shape] = flops_mod.forward_flops_per_sample(state.run.model, shape, images.device)
        self._flops += flops_mod.TRAIN_FORWARD_MULTIPLE * self.flops_per_sample[shape] * images.shape[0]

    def after_step(self, state) -> None:
        if not state.is_log_step:
            return
        import torch

        elapsed = max(time.perf_counter() - self._time, 1e-9)
        local = (state.samples_seen - self._samples) / state.run.world_size / elapsed
        values = {
            "samples_per_sec": local * state.run.world_size,
            "samples_per_sec_per_device": local,
            "data_wait_fraction": (state.data_wait_seconds - self._wait) / elapsed,
        }
        if self.count_flops and self._flops:
            values["tflops_per_device"] = self._flops / elapsed / 1e12
            if self.peak_tflops:
                values["mfu"] = values["tflops_per_device"] / self.peak_tflops
        stacked = torch.tensor(list(values.values()), dtype=torch.float32, device=state.run.backend.device)
        state.current.metrics.update(zip(values, stacked.unbind()))
        self._mark(state)

    def state_dict(self) -> dict[str, Any]:
        return {"flops_per_sample": [[list(shape), flops] for shape, flops in self.flops_per_sample.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.flops_per_sample = {tuple(shape): int(flops) for shape, flops in state.get("flops_per_sample", [])}
