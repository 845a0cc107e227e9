"""Wall time spent inside each hook, per event, so a slow hook is visible.

When on, the engine times every hook call (``time.perf_counter`` around it; see
``Engine.fire``) into ``state.hook_times``. At the end of the run (and when it fails)
rank 0 writes ``hook_times.json`` in the run directory: one entry per hook and event with
``calls``, ``seconds`` and ``ms_per_call``, slowest first, and prints the ``top`` slowest
with their share of the run's wall time. Host time only: on a GPU, device work a hook
queues is paid by whoever syncs next (usually the logger), unless the hook syncs itself.
The totals are checkpointed, so a resumed run keeps counting.
"""

from __future__ import annotations

import json
import time
from typing import Any, ClassVar

from largebatch.config.schema import Field
from largebatch.engine.hook import Hook, Priority


class HookTimerHook(Hook):
    """Args:
    filename: the JSON file in the run directory.
    top: how many of the slowest entries to print at the end (0: none).
    """

    priority = Priority.HIGHEST
    argument_checks: ClassVar[dict[str, Field]] = {"top": Field(int, 5, low=0)}

    def __init__(self, filename: str = "hook_times.json", top: int = 5, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self.filename = filename
        self.top = int(top)
        self._times: dict[tuple[str, str], list[float]] = {}
        self._start = time.perf_counter()
        self._earlier_seconds = 0.0

    def before_run(self, state) -> None:
        self._start = time.perf_counter()
        state.hook_times = self._times

    def entries(self) -> list[dict[str, Any]]:
        """One dict per (hook, event), slowest first."""
        rows = [
            {"hook": hook, "event": event, "calls": int(calls), "seconds": seconds, "ms_per_call": 1000 * seconds / max(calls, 1)}
            for (hook, event), (calls, seconds) in self._times.items()
        ]
        return sorted(rows, key=lambda row: -row["seconds"])

    def _write(self, state) -> None:
        if not state.run.is_main:
            return
        wall = self._earlier_seconds + time.perf_counter() - self._start
        rows = self.entries()
        state.run.run_dir.path.mkdir(parents=True, exist_ok=True)
        (state.run.run_dir / self.filename).write_text(json.dumps({"run_seconds": wall, "hooks": rows}, indent=1) + "\n")
        if self.top and rows:
            total = sum(row["seconds"] for row in rows)
            print(f"hook times: {total:.2f}s of {wall:.1f}s in hooks; slowest:", flush=True)
            for row in rows[: self.top]:
                share = 100 * row["seconds"] / max(wall, 1e-9)
                print(
                    f"  {row['hook']}.{row['event']}: {row['seconds']:.3f}s ({share:.1f}%), "
                    f"{row['calls']} calls, {row['ms_per_call']:.3f} ms/call",
                    flush=True,
                )

    def after_run(self, state) -> None:
        self._write(state)

    def on_exception(self, state, exception: BaseException) -> None:
        self._write(state)

    def state_dict(self) -> dict[str, Any]:
        return {
            "times": [[hook, event, calls, seconds] for (hook, event), (calls, seconds) in self._times.items()],
            "run_seconds": self._earlier_seconds + time.perf_counter() - self._start,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._times.clear()
        for hook, event, calls, seconds in state.get("times", []):
            self._times[(hook, event)] = [calls, seconds]
        self._earlier_seconds = state.get("run_seconds", 0.0)
