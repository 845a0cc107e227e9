"""An optimizer step that is not logged reads nothing back from the device, default hooks
included: on a GPU each read waits for the queued work and leaves the device idle while the
next step is launched. Counted here on the CPU as the reads torch would make (a tensor's
value to the host: ``tests/support/host_reads.py``), with the
optimizer that skips a step on a device flag (fused AdamW: the non-finite check is
deferred). On a GPU, ``test_nan_guard_deferred.py`` checks the same span from the
update on with torch's sync debug mode."""

from __future__ import annotations

from largebatch.config.sections import CheckpointConfig, EmaConfig, LogConfig
from largebatch.engine.hook import Hook, Priority
from largebatch.hooks import build_hooks
from largebatch.hooks.logger import MetricsLogger
from tests.hooks.common import build
from tests.support.host_reads import HostReads

STEPS = 6


class CountFrom(Hook):
    """Starts counting at the first ``before_step`` hook of a step that is neither the first
    (it builds the optimizer's state) nor logged."""

    priority = Priority.HIGHEST

    def __init__(self, reads: HostReads) -> None:
        super().__init__()
        self.reads, self.counted = reads, []

    def before_step(self, state) -> None:
        if state.step > 0 and not state.will_log:
            self.reads.__enter__()
            self.counted.append(state.step)


class CountTo(Hook):
    """Stops counting after the last ``after_step`` hook."""

    priority = Priority.LOWEST

    def __init__(self, start: CountFrom) -> None:
        super().__init__()
        self.start = start

    def after_step(self, state) -> None:
        if self.start.counted and self.start.counted[-1] == state.step - 1:
            self.start.reads.__exit__(None, None, None)


def default_hooks() -> list[Hook]:
    """The default hooks as a run builds them from the config's default sections, but the
    logger (``build`` adds one)."""
    hooks = build_hooks([], checkpoint=CheckpointConfig(), log=LogConfig(console=False), ema=EmaConfig())
    return [hook for hook in hooks if not isinstance(hook, MetricsLogger)]


def test_an_unlogged_step_with_the_default_hooks_reads_nothing_back(tmp_path):
    reads = HostReads()
    start = CountFrom(reads)
    engine, _ = build(tmp_path, [*default_hooks(), start, CountTo(start)], steps=STEPS, optimizer="adamw", **{"log.interval": 100})
    engine.run()
    assert start.counted == list(range(1, STEPS - 1))  # every step but the first and the last (logged)
    assert reads.seen == []
