"""A device tensor's value on its way to the host, read later without waiting for the
work queued after it: the deferred checks of a non-finite step read their flags this way
(``largebatch.engine.update``, ``largebatch.optim.layerwise``)."""

from __future__ import annotations

from typing import Any

import torch


class HostCopy:
    """The value of ``tensor`` as it is now: on CUDA copied into pinned memory behind an
    event, so that ``tolist`` waits at most for the work queued before the copy; elsewhere
    the host's copy at once (on the CPU, the tensor itself)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.ready: torch.cuda.Event | None = None
        if tensor.device.type == "cuda":
            self.values, self.ready = tensor.to("cpu", non_blocking=True), torch.cuda.Event()
            self.ready.record()
        else:
            self.values = tensor.cpu()

    def tolist(self) -> Any:
        """The values, once the copy has arrived (``Tensor.tolist``: not a dispatched read)."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.values.tolist()
