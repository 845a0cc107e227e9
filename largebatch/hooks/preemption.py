"""Stop every rank at the same optimizer step when any of them was asked to stop.

``largebatch.preemption`` turns SIGUSR1 / SIGUSR2 / SIGTERM into a flag. At each ``after_step`` this
hook all-reduces the flag (max over ranks: one small collective per optimizer step), so
all ranks see the request at the same step, and asks for a resumable stop: the checkpoint
hook then saves this step, and the run exits with ``EXIT_REQUEUE``.
"""

from __future__ import annotations

from largebatch import preemption
from largebatch.engine.hook import Hook, Priority


class PreemptionHook(Hook):
    """Runs before the checkpoint hook at ``after_step`` so the stop is saved in time."""

    priority = Priority.HIGH

    def after_step(self, state) -> None:
        import torch
        import torch.distributed as torch_dist

        name = preemption.received_signal()
        flag = torch.tensor([1 if name else 0], dtype=torch.int32, device=state.run.backend.device)
        if torch_dist.is_initialized():
            torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MAX)
        if int(flag.item()):
            reason = f"preempted by {name}" if name else "preempted (another rank received a signal)"
            state.request_stop(reason, resumable=True)
