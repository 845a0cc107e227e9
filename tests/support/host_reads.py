"""A dispatch mode that records every operator that reads a tensor's value back to the
host: ``.item()``, ``bool()``, ``float()`` (``aten._local_scalar_dense``), ``is_nonzero``,
``torch.equal`` and ``nonzero`` (whose size the host reads). On a GPU or an HPU each waits
for the queued work; on the CPU they are counted where the same code would make them."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

READ_BACKS = {"aten._local_scalar_dense.default", "aten.is_nonzero.default", "aten.equal.default", "aten.nonzero.default"}


class HostReads(TorchDispatchMode):
    """Records, in ``seen``, the operators of ``READ_BACKS`` run inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in READ_BACKS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))
