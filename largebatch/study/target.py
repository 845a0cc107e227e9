"""Steps to target from a trial's evaluations, and how finely they are resolved.

A run is evaluated at discrete steps (``largebatch.study.evaluation`` evaluates sparsely
far from the target and every few percent of steps near it). The target is first reached
between the last evaluation that had not reached it, at step ``lo``, and the first that
had, at step ``hi``: that bracket is what the evaluations know, and its relative width
``(hi - lo) / lo`` is the **resolution** of the figure. The figure itself is interpolated
inside the bracket, linearly in the metric against log(step) (the curves are close to
straight on that scale over a few percent of steps), so it moves smoothly with the run
rather than jumping to the next evaluation step.

A target reached at the first evaluation has no lower end (``lo`` = 0): its resolution is
unbounded and the report says so.

A trial records the crossing of every target of its study, on each split, in its outcome
(``crossings``: target key -> split -> crossing); ``crossing_of`` reads one back.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any, Protocol


class TargetLike(Protocol):
    """What a crossing is looked up by (``largebatch.study.spec.Target``)."""

    @property
    def key(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class Crossing:
    """Where a curve first reached the target.

    Attributes:
        steps: the interpolated step.
        lo: the last evaluated step before it that had not reached the target (0: none).
        hi: the first evaluated step that had.
    """

    steps: float
    lo: int
    hi: int

    @property
    def resolution(self) -> float:
        """The bracket's relative width, ``(hi - lo) / lo`` (inf with no lower end)."""
        return math.inf if self.lo <= 0 else (self.hi - self.lo) / self.lo

    def record(self) -> dict[str, float]:
        """The crossing as a trial's record stores it (``from_dict`` reads it back)."""
        return {"steps": self.steps, "lo": self.lo, "hi": self.hi}

    @classmethod
    def from_dict(cls, data: dict[str, float] | None) -> Crossing | None:
        return None if data is None else cls(float(data["steps"]), int(data["lo"]), int(data["hi"]))


def reached(value: float | None, target: float, mode: str) -> bool:
    """Whether ``value`` reaches ``target`` (``mode`` 'max': at least it; 'min': at most)."""
    if value is None or not math.isfinite(value):
        return False
    return value >= target if mode == "max" else value <= target


def first_crossing(curve: Iterable[tuple[int, float | None]], target: float, mode: str) -> Crossing | None:
    """The first crossing of ``target`` in ``(step, value)`` evaluations (ascending steps;
    ``None`` or non-finite values are skipped), or None when it was never reached."""
    previous: tuple[int, float] | None = None
    for step, value in curve:
        if value is None or not math.isfinite(value):
            continue
        if reached(value, target, mode):
            if previous is None:
                return Crossing(float(step), 0, step)
            lo, before = previous
            share = (target - before) / (value - before)
            steps = math.exp(math.log(lo) + share * (math.log(step) - math.log(lo)))
            return Crossing(min(max(steps, float(lo)), float(step)), lo, step)
        previous = (step, value)
    return None


def crossing_of(trial: Any, target: TargetLike, split: str = "eval") -> Crossing | None:
    """A finished trial's crossing of ``target`` on ``split`` ('eval': held-out, 'test'),
    or None when it did not reach it (or measured no such split).

    Trials of a study with one target written before ``crossings`` existed hold it as
    ``<split>_crossing``; that is read for any target.
    """
    outcome = trial.user_attrs.get("outcome") or {}
    if "crossings" not in outcome:
        return Crossing.from_dict(outcome.get(f"{split}_crossing"))
    return Crossing.from_dict((outcome["crossings"].get(target.key) or {}).get(split))
