"""What LAMB and LARS share: the step's skeleton and the statistics API.

Both scale each tensor's step by a trust ratio made of its norms. ``step`` runs the
closure, collects per group the parameters that have a gradient (refusing sparse ones),
finds whether they are FSDP2-sharded (``largebatch.dtensors``), hands them to the
subclass (``_step_sharded`` for sharded ones on the multi-tensor path, else ``_step_group``
per group) and files the statistics it returns under the groups' names.

Statistics API (for hooks): ``request_stats()`` makes the next ``step()`` record, per group,
the per-parameter trust ratios, weight norms and update norms as device tensors without a
host sync: ``last_stats`` is then ``{group_name: {"param_names": [...], "trust_ratio": Tensor,
"weight_norm": Tensor, "update_norm": Tensor}}``, one entry per parameter that had a
gradient, in the group's order; unnamed groups are ``"group<i>"``, unnamed parameters
``"group<i>.<j>"``. A step not requested records nothing, costs nothing extra and leaves
``last_stats`` as it was.

A step that may not count (``found_inf``): ``step`` reads the optimizer's ``found_inf``
attribute, a 0-dim float tensor on the parameters' device that
``largebatch.engine.update.step_unless`` sets as ``GradScaler.step`` sets it for torch's
fused optimizers (``skips_on_found_inf``). Where it is non-zero the step leaves the
parameters and every state tensor bit for bit as they were, decided on the device: a
kernel that reads the flag returns early (LAMB's Triton kernel), and around every other
the step's tensors are copied first and put back with ``torch.where`` (``Kept``; on the
CPU, where reading the flag waits for nothing, only when it is non-zero); where it is 0
the step is the step taken without it, bit for bit. What lives on the host (LAMB's
step counts, state a first step created) follows when the host has the flag: it is copied
there without waiting (``largebatch.host_copy``) and read at the next ``step``,
``state_dict`` or pickling, which put back what a skipped step changed (``settle``). The
statistics of such a step are recorded all the same; whether it counted is the caller's to
know. ``GradScaler`` does not see the attribute (that is torch's
``_step_supports_amp_scaling``): with fp16 it checks the gradients on the host and calls
``step`` only when they are finite, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from largebatch import dtensors
from largebatch.errors import UserError
from largebatch.host_copy import HostCopy

Stats = tuple[Tensor, Tensor, Tensor]  # per tensor: trust ratio, weight norm, update norm


class Collected(NamedTuple):
    """A group's parameters that have gradients, their gradients and names."""

    group: dict[str, Any]
    params: list[Tensor]
    grads: list[Tensor]
    names: list[str]


class Kept:
    """Copies of ``tensors`` (their local slices when sharded), put back by ``restore`` where
    ``skip`` (a 0-dim tensor) is non-zero: what the step did in between is undone on the
    device, bit for bit, with no host read. ``skip`` None, or 0 and on the CPU (read where it
    is: no device to wait for, and a copy of the step's tensors costs the CPU more than the
    step's arithmetic): nothing is copied or put back."""

    def __init__(self, skip: Tensor | None, tensors: Iterable[Tensor]) -> None:
        if skip is not None and skip.device.type == "cpu" and not skip.tolist():
            skip = None
        self.skip = None if skip is None else skip != 0
        self.pairs = [] if skip is None else [(t, t.clone()) for t in dtensors.locals_of(tensors)]

    def restore(self) -> None:
        for tensor, copy in self.pairs:
            assert self.skip is not None
            torch.where(self.skip.to(tensor.device), copy, tensor, out=tensor)


class Unsettled(NamedTuple):
    """A step taken under ``found_inf`` whose flag the host has not read yet: the flag, and
    each stepped parameter's state as it was before (None: it had none)."""

    flag: HostCopy
    before: dict[Tensor, dict[str, Any] | None]


class LayerwiseOptimizer(torch.optim.Optimizer):
    """Base of ``Lamb`` and ``Lars``. A subclass sets its optimizer-wide switches (``foreach``
    among them) before calling ``__init__`` and names them in ``SWITCHES`` (kept by pickling
    and deepcopy), checks its own group options in ``_check`` and implements ``_step_group``
    and ``_step_sharded``, which leave what they change as it was where ``skip`` is non-zero
    (``Kept``, or a kernel that reads the flag)."""

    SWITCHES: tuple[str, ...] = ()
    foreach: bool
    # ``step`` honours ``found_inf`` (the module docstring): the deferred non-finite check's
    # test (``largebatch.engine.update.defers``).
    skips_on_found_inf: ClassVar[bool] = True

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], defaults: dict[str, Any]) -> None:
        self.last_stats: dict[str, dict[str, Any]] = {}
        self._stats_requested = False
        self._unsettled: Unsettled | None = None
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (a dict with ``params`` and per-group options); ``UserError`` when an option is out of range."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        where = f"param group {group.get('name', len(self.param_groups) - 1)!r}"
        for key in ("lr", "eps", "weight_decay"):
            if not group[key] >= 0:
                raise UserError(f"{where}: {key} must be >= 0, got {group[key]!r}")
        self._check(group, where)
        names = group.get("param_names")
        if names is not None and len(names) != len(group["params"]):
            raise UserError(
                f"{where}: param_names has {len(names)} names for {len(group['params'])} parameters; give one name per parameter, in order"
            )

    def _check(self, group: dict[str, Any], where: str) -> None:
        """The subclass's own checks of a new group (``UserError`` when one fails)."""

    def __getstate__(self) -> dict[str, Any]:
        # torch.optim.Optimizer pickles only defaults, state and groups; keep the
        # optimizer-wide switches too (copy.deepcopy, pickling).
        self.settle()
        state = super().__getstate__()
        state.update((key, getattr(self, key)) for key in self.SWITCHES)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("last_stats", {})
        self.__dict__.setdefault("_stats_requested", False)
        self.__dict__.setdefault("_unsettled", None)

    def state_dict(self) -> dict[str, Any]:
        """torch's ``state_dict``, a step taken under ``found_inf`` settled first."""
        self.settle()
        return super().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's ``load_state_dict``; a step not yet settled is forgotten with the state it changed."""
        self._unsettled = None
        super().load_state_dict(state_dict)

    def settle(self) -> None:
        """Read the flag of the last step taken under ``found_inf`` (waiting at most for that
        step) and, where it was non-zero, put back the state as it was on the host: step
        counts, and no state where the step created it. Nothing when none is pending."""
        pending, self._unsettled = self._unsettled, None
        if pending is None or not pending.flag.tolist():
            return
        for param, before in pending.before.items():
            if before is None:
                self.state.pop(param, None)
            else:
                self.state[param] = before

    def request_stats(self) -> None:
        """Record trust ratios and norms during the next ``step()`` into ``last_stats``."""
        self._stats_requested = True

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Take one step on every parameter that has a gradient.

        Args:
            closure: re-evaluates the model and returns the loss (optional).

        Returns:
            The closure's loss, or ``None``.

        Raises:
            UserError: a gradient is sparse.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.settle()
        skip: Tensor | None = getattr(self, "found_inf", None)
        if skip is not None:  # what the host holds of each parameter's state, before the step
            stepped = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
            before = {p: dict(self.state[p]) if p in self.state else None for p in stepped}
        record, self._stats_requested = self._stats_requested, False
        groups = [self._collect(index, group) for index, group in enumerate(self.param_groups)]
        shard_group = dtensors.reduction_group([p for entry in groups for p in entry.params])
        context = self._prepare(groups)
        if shard_group is not None and self.foreach:
            results = self._step_sharded(groups, shard_group, context, record, skip)
        else:
            results = [self._step_group(entry, context, record, skip) if entry.params else None for entry in groups]
        if skip is not None:
            self._unsettled = Unsettled(HostCopy(skip), before)
        if record:
            self.last_stats = {
                entry.group.get("name", f"group{index}"): {
                    "param_names": entry.names,
                    **dict(zip(("trust_ratio", "weight_norm", "update_norm"), result or ())),
                }
                for index, (entry, result) in enumerate(zip(groups, results))
                if entry.params
            }
        return loss

    def _collect(self, index: int, group: dict[str, Any]) -> Collected:
        """The group's parameters with gradients, their gradients and names; ``_init_state`` each."""
        params, grads, names = [], [], []
        given = group.get("param_names")
        for i, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            name = given[i] if given is not None else f"group{index}.{i}"
            if p.grad.is_sparse:
                raise UserError(
                    f"{type(self).__name__} got a sparse gradient for parameter {name!r}; {type(self).__name__.upper()} needs dense "
                    "gradients (e.g. nn.Embedding(..., sparse=False))"
                )
            self._init_state(p, self.state[p])
            params.append(p)
            grads.append(p.grad)
            names.append(name)
        return Collected(group, params, grads, names)

    def _init_state(self, param: Tensor, state: dict[str, Any]) -> None:
        """Create the state of a parameter about to take a step (nothing by default)."""

    def _prepare(self, groups: list[Collected]) -> Any:
        """What every group's step needs from all of them (``Lamb``: the clipping coefficient)."""
        return None

    def _kept(self, skip: Tensor | None, params: Iterable[Tensor]) -> Kept:
        """``Kept`` of the parameters and their state tensors, for a step under ``skip``."""
        if skip is None:
            return Kept(None, ())
        return Kept(skip, [t for p in params for t in (p, *self.state.get(p, {}).values()) if isinstance(t, Tensor)])

    def _step_group(self, entry: Collected, context: Any, record: bool, skip: Tensor | None) -> Stats | None:
        raise NotImplementedError  # one group's step; its statistics when ``record``

    def _step_sharded(
        self, groups: list[Collected], shard_group: Any, context: Any, record: bool, skip: Tensor | None
    ) -> list[Stats | None]:
        raise NotImplementedError  # every group's step on FSDP2's slices, all norms in one collective


def in_order(parts: list[tuple[list[int], Stats]]) -> Stats:
    """Per-tensor statistics of a group's buckets ``(indices, (ratio, ||x||, ||u||))``,
    back in the group's order."""
    if len(parts) == 1:
        return parts[0][1]
    device = parts[0][1][0].device
    order = torch.tensor([i for idx, _ in parts for i in idx]).argsort().to(device)
    return tuple(torch.cat([stats[k].to(device) for _, stats in parts])[order] for k in range(3))  # type: ignore[return-value]
