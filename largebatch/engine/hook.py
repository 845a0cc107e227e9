"""The ``Hook`` base class and hook priorities.

A hook subclasses ``Hook`` and overrides the methods named after the events it needs
(``largebatch.engine.events``); each receives the ``TrainState``. Hooks run in priority
order, lowest number first; equal priorities keep registration order. A hook's
``state_dict()`` is saved in checkpoints under its ``name``.
"""

from __future__ import annotations

import enum
import os
import traceback
from typing import TYPE_CHECKING, Any

from largebatch.engine.events import Event
from largebatch.errors import UserError

if TYPE_CHECKING:  # the state holds the hooks (``TrainState.hooks``): imported at run time, a circle
    from largebatch.engine.state import TrainState


class Priority(enum.IntEnum):
    """Named points on the 0-100 priority scale (lower runs first)."""

    HIGHEST = 0
    VERY_HIGH = 10
    HIGH = 30
    ABOVE_NORMAL = 40
    NORMAL = 50
    BELOW_NORMAL = 60
    LOW = 70
    VERY_LOW = 90
    LOWEST = 100


def parse_priority(value: int | str | Priority) -> int:
    """A priority from a name (``'LOW'``) or a number in 0..100."""
    if isinstance(value, str):
        try:
            return int(Priority[value.upper()])
        except KeyError:
            names = ", ".join(p.name for p in Priority)
            raise ValueError(f"unknown priority {value!r}; use a number 0-100 or one of {names}") from None
    if not 0 <= int(value) <= 100:
        raise ValueError(f"priority {value} is outside 0..100")
    return int(value)


class Hook:
    """Base class of every hook.

    Class attributes:
        priority: where the hook runs among others (``Priority`` or 0-100).

    Override any of the event methods below; the engine calls only the ones a hook
    overrides. Hooks read the state freely (``largebatch.engine.state``) and write
    ``state.current.metrics``; the rest they ask for: ``state.current.request_skip(reason)``,
    ``state.request_eval()``, ``state.request_stop(reason)`` (ends the run at the next step
    boundary), ``state.register_model(name, model)`` and ``state.request_first_micro_sync()``.
    They never write the counters (only the engine advances them) or ``state.run`` (frozen).
    """

    priority: int = Priority.NORMAL

    def __init__(self, priority: int | str | None = None) -> None:
        if priority is not None:
            self.priority = parse_priority(priority)

    @property
    def name(self) -> str:
        """The key of this hook's state in checkpoints."""
        return type(self).__name__

    def state_dict(self) -> dict[str, Any]:
        """State to checkpoint (empty by default)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    def before_run(self, state: TrainState) -> None: ...
    def before_train(self, state: TrainState) -> None: ...
    def before_epoch(self, state: TrainState) -> None: ...
    def before_step(self, state: TrainState) -> None: ...
    def before_micro_step(self, state: TrainState) -> None: ...
    def after_forward(self, state: TrainState) -> None: ...
    def after_backward(self, state: TrainState) -> None: ...
    def before_optimizer_step(self, state: TrainState) -> None: ...
    def after_optimizer_step(self, state: TrainState) -> None: ...
    def after_step(self, state: TrainState) -> None: ...
    def after_epoch(self, state: TrainState) -> None: ...
    def before_eval(self, state: TrainState) -> None: ...
    def after_eval_batch(self, state: TrainState) -> None: ...
    def after_eval(self, state: TrainState) -> None: ...
    def after_train(self, state: TrainState) -> None: ...
    def after_run(self, state: TrainState) -> None: ...

    def on_exception(self, state: TrainState, exception: BaseException) -> None:
        """Called when the run fails, before the error propagates."""

    def overrides(self, event: Event) -> bool:
        """Whether this hook implements ``event`` (the engine skips the rest)."""
        return getattr(type(self), event.value) is not getattr(Hook, event.value)


class HookError(RuntimeError):
    """A hook raised ``exc`` in ``event``: the message names the hook's class, the event
    and the exception; for anything but a ``UserError`` (a mistake that speaks for
    itself), also the line of the hook's file it came from (``raised_at``)."""

    def __init__(self, hook: Hook, event: Event, exc: BaseException) -> None:
        if isinstance(exc, UserError):
            detail = str(exc)
        else:
            detail = f"{type(exc).__name__}: {exc}"
            where = raised_at(getattr(type(hook), event.value), exc)
            if where is not None:
                detail += f" at {where}"
        super().__init__(f"hook {type(hook).__name__} failed in {event.value}: {detail}")


def raised_at(method: Any, exc: BaseException) -> str | None:
    """``FILE:LINE`` of the deepest frame of ``exc``'s traceback in the file that defines
    ``method`` (the hook's event method): the line that raised, or the call in the hook's
    own code that led there. ``FILE`` is relative to the working directory when inside it;
    None when no frame is in that file."""
    code = getattr(method, "__code__", None)
    if code is None:
        return None
    frames = [(frame.f_code.co_filename, line) for frame, line in traceback.walk_tb(exc.__traceback__)]
    found = [(name, line) for name, line in frames if name == code.co_filename]
    if not found:
        return None
    name, line = found[-1]
    try:
        relative = os.path.relpath(name)
    except (OSError, ValueError):  # no working directory, another drive
        relative = name
    return f"{name if relative.startswith('..') else relative}:{line}"
