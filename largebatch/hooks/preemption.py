"""Stop every rank at the same optimizer step when any of them was asked to stop.

``largebatch.preemption`` turns SIGUSR1 / SIGUSR2 / SIGTERM into a flag. In a single
process this hook reads the flag at each ``after_step`` and asks for a resumable stop at
once: the checkpoint hook then saves this step, and the run exits with ``EXIT_REQUEUE``.

Across ranks the flag is all-reduced (max over ranks: one small collective per optimizer
step), so all ranks see the request at the same step. Its value is read on the host a step
later (``largebatch.host_copy``): reading it at once would wait for the device to finish
the whole step and leave it idle while the next one is queued. A signal received during step
N therefore stops every rank after step N + 1, and the checkpoint is of that step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from largebatch import preemption
from largebatch.engine.hook import Hook, Priority

if TYPE_CHECKING:
    from largebatch.host_copy import HostCopy


class PreemptionHook(Hook):
    """Runs before the checkpoint hook at ``after_step`` so the stop is saved in time."""

    priority = Priority.HIGH

    def __init__(self, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self._reduced: HostCopy | None = None  # the last step's all-reduced flag, on its way to the host

    def after_step(self, state) -> None:
        import torch
        import torch.distributed as torch_dist

        name = preemption.received_signal()
        if not torch_dist.is_initialized():
            if name:
                state.request_stop(f"preempted by {name}", resumable=True)
            return
        from largebatch.host_copy import HostCopy

        flag = torch.full((1,), 1 if name else 0, dtype=torch.int32, device=state.run.backend.device)
        torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MAX)
        previous, self._reduced = self._reduced, HostCopy(flag)
        if previous is not None and previous.tolist()[0]:
            reason = f"preempted by {name}" if name else "preempted (another rank received a signal)"
            state.request_stop(reason, resumable=True)
