"""A hook that holds something open during the run (a file, a progress bar, a writer)."""

from __future__ import annotations

from largebatch.engine.hook import Hook


class ClosingHook(Hook):
    """Closes what its attribute ``held`` names when the run ends (``release``) or fails."""

    held = "handle"

    def release(self) -> None:
        """Close what is held, once (idempotent)."""
        handle = getattr(self, self.held, None)
        if handle is not None:
            handle.close()
            setattr(self, self.held, None)

    def on_exception(self, state, exception: BaseException) -> None:
        self.release()
