"""Test hooks (loaded by path) for preemption and node-loss tests.

They act through the real mechanisms: ``os.kill`` sends a real signal to the process,
and each hook leaves a file in the run directory to prove it ran.
"""

import json
import os
import signal
import time

from largebatch.checkpoint import list_checkpoints
from largebatch.engine.hook import Hook, Priority


class SendSignal(Hook):
    """Send ``signal`` to this process during micro-step ``micro`` of step ``step`` (0-based),
    after the forward pass, on ``rank`` (all ranks when None); record where the run stopped
    and its newest complete checkpoint."""

    def __init__(self, step: int, micro: int, signal: str = "SIGUSR1", rank: int | None = None):
        super().__init__()
        self.step, self.micro, self.signal, self.rank = step, micro, signal, rank

    def after_forward(self, state):
        if state.step == self.step and state.current.micro_in_window == self.micro and self.rank in (None, state.run.rank):
            (state.run.run_dir / f"signal-sent-rank{state.run.rank}").write_text(f"{state.step} {state.current.micro_in_window}")
            os.kill(os.getpid(), getattr(signal, self.signal))

    def after_run(self, state):
        newest = list_checkpoints(state.run.run_dir)  # complete when the run ends, even if written in the background
        record = {"step": state.step, "micro_step": state.micro_step, "reason": state.stop_reason, "interrupted": state.interrupted}
        record["newest_checkpoint"] = newest[-1].name if newest else None
        (state.run.run_dir / f"stop-rank{state.run.rank}.json").write_text(json.dumps(record))


class SlowSteps(Hook):
    """Sleep after each optimizer step, so a test can signal a run while it trains."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def after_step(self, state):
        time.sleep(self.seconds)


class KillRank(Hook):
    """``kill -9`` this process after step ``step`` on ``rank``, in the first attempt of a
    torchrun job only (``TORCHELASTIC_RESTART_COUNT=0``): a lost node."""

    priority = Priority.LOWEST  # after the checkpoint hook

    def __init__(self, step: int, rank: int):
        super().__init__()
        self.step, self.rank = step, rank

    def after_step(self, state):
        if state.step == self.step and state.run.rank == self.rank and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
            (state.run.run_dir / f"killed-rank{state.run.rank}-step{state.step}").write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
