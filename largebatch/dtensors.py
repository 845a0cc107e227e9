"""Norms of sharded tensors (FSDP2's DTensors) in one collective per step.

Under ``dist.strategy='fsdp'`` or ``'hsdp'`` every parameter, its gradient and its
optimizer state are DTensors sharded on dim 0 (FSDP2's ``fully_shard``), and each rank
holds a slice. ``torch.linalg.vector_norm`` of a DTensor is correct but reduces across
ranks once per tensor; layer-wise optimizers (LAMB, LARS), clipping and the gradient-norm
hooks need many per-tensor norms per step, so each rank squares and sums its slice of
every tensor (an empty slice gives 0) and one ``all_reduce`` over the ranks that hold the
slices adds up the whole step's partial sums. Under HSDP (a 2-D mesh that replicates
across groups and shards within one) that is the shard group only: adding the replicas
would count each slice once per replica.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from largebatch.errors import UserError

try:  # torch >= 2.4
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - older torch has no FSDP2 either
    DTensor = ()  # type: ignore[assignment,misc]


def is_sharded(tensor: Tensor) -> bool:
    """Whether ``tensor`` is a DTensor (a parameter sharded by FSDP2)."""
    return isinstance(tensor, DTensor)


def local(tensor: Tensor) -> Tensor:
    """This rank's slice of a DTensor (a view: in-place changes reach the DTensor), or ``tensor``."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def locals_of(tensors: Iterable[Tensor]) -> list[Tensor]:
    return [local(t) for t in tensors]


def reduction_group(tensors: Sequence[Tensor]):
    """The process group whose ranks hold the slices of ``tensors``; None when none is sharded.

    Raises:
        UserError: the tensors mix sharded and unsharded ones, or are sharded over
            different meshes or mesh dimensions (one reduction cannot serve them).
    """
    layout = None
    plain = 0
    for t in tensors:
        if not isinstance(t, DTensor):
            plain += 1
            continue
        dims = tuple(i for i, placement in enumerate(t.placements) if placement.is_shard())
        if len(dims) != 1 or any(not (p.is_shard() or p.is_replicate()) for p in t.placements):
            raise UserError(
                f"a parameter is laid out as {t.placements} on {t.device_mesh}; the sharded optimizers handle FSDP2's "
                "layouts (Shard(0) on a 1-D mesh, or (Replicate(), Shard(0)) under HSDP)"
            )
        key = (t.device_mesh, dims[0])
        if layout is None:
            layout = key
        elif key != layout:
            raise UserError("parameters are sharded over different meshes; shard the whole model with one dist.strategy")
    if layout is None:
        return None
    if plain:
        raise UserError(
            f"{plain} parameter(s) are not sharded while the others are; under dist.strategy 'fsdp'/'hsdp' the whole "
            "model must be wrapped (largebatch shards each block, then the root)"
        )
    mesh, dim = layout
    return mesh.get_group(dim)


def local_norms(tensors: Sequence[Tensor]) -> Tensor:
    """Per tensor, the L2 norm of this rank's slice, on the first one's device (no collective)."""
    slices = locals_of(tensors)
    return torch.stack([n.to(slices[0].device) for n in torch._foreach_norm(slices)])


class NormReduction:
    """Collects partial sums of squares from several places, reduces them in one collective.

    ``add`` returns a handle; after ``reduce`` (one ``all_reduce`` over ``group``, or none
    when ``group`` is None or nothing was added), ``norms(handle)`` gives the whole
    tensors' L2 norms.
    """

    def __init__(self, group) -> None:
        self.group = group
        self._parts: list[Tensor] = []
        self._norms: list[Tensor] = []

    def add(self, tensors: Sequence[Tensor]) -> int:
        """Queue the norms of ``tensors``; returns the handle for ``norms``."""
        return self.add_squares(local_norms(tensors).square() if tensors else torch.zeros(0))

    def add_squares(self, part: Tensor) -> int:
        """Queue per-tensor sums of squares of this rank's slices, computed elsewhere
        (a 1-D tensor); returns the handle for ``norms``."""
        self._parts.append(part)
        return len(self._parts) - 1

    def reduce(self) -> None:
        """Add up the partial sums over the group's ranks, all at once."""
        parts = [p for p in self._parts if p.numel()]  # an empty one's dtype must not count
        total = torch.cat([p.to(parts[0]) for p in parts]) if parts else torch.zeros(0)
        if parts and self.group is not None:
            torch.distributed.all_reduce(total, group=self.group)
        self._norms = list(total.sqrt().split([p.numel() for p in self._parts]))

    def norms(self, handle: int) -> Tensor:
        return self._norms[handle]


def grad_norms(grads: Sequence[Tensor]) -> Tensor:
    """The L2 norm of each of ``grads`` (sharded or not), in one collective when sharded."""
    group = reduction_group(grads)
    if group is None:
        return local_norms(grads)
    reduction = NormReduction(group)
    handle = reduction.add(grads)
    reduction.reduce()
    return reduction.norms(handle)
