"""LARS: layer-wise adaptive rate scaling for momentum SGD.

Paper: You, Gitman and Ginsburg, "Large Batch Training of Convolutional Networks",
arXiv:1708.03888 (2017), Algorithm 1, in the form large-batch ImageNet recipes use
(Goyal et al. 2017's momentum SGD with the layer-wise ratio; MLPerf's and timm's
``Lars``). Per parameter tensor ``x`` with gradient ``g``:

    ratio = eta * ||x|| / (||g|| + wd * ||x|| + eps)     (1 when ||x|| or ||g|| is 0)
    d = ratio * (g + wd * x)
    b = momentum * b + d                                  (b = d at the first step)
    x = x - lr * (d + momentum * b  if nesterov  else  b)

Weight decay sits inside the ratio's denominator and inside the update, as in the paper;
a group without the ratio takes ``d = g + wd * x``.
Biases, norms and the other tensors the parameter-group machinery
(``largebatch.optim.param_groups``) excludes from weight decay get neither decay nor the
ratio by default (``no_decay_adapt=False``): they take plain momentum-SGD steps, the
usual exclusion of LARS recipes and timm's default (``always_adapt=False``). A group with
``adapt=False`` does the same; ``no_decay_adapt=True`` adapts every group.

Options match timm's ``Lars`` (``trust_coeff`` is ``eta`` here); ``dampening`` and
``trust_clip`` (LARC) are not offered. Implementation: the foreach path computes all
norms of a group with ``torch._foreach_norm``, the ratios in one vectorised op, and the
update with ``torch._foreach_*`` ops, never reading a value back to the host; the
per-tensor path (``foreach=False``) writes the algorithm out literally and is the
reference the foreach path is tested against.

Statistics API (for the ``trust_ratio`` hook) and the step's skeleton are ``Lamb``'s
(``largebatch.optim.layerwise``): ``request_stats()`` makes the next ``step()`` record per
group the trust ratios, weight norms and gradient norms (``update_norm``) in ``last_stats``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from largebatch import dtensors
from largebatch.errors import UserError
from largebatch.optim.layerwise import Collected, LayerwiseOptimizer, Stats, in_order


class Lars(LayerwiseOptimizer):
    """LARS (You et al. 2017) over momentum SGD, multi-tensor.

    Args:
        params: parameters or parameter-group dicts (groups may carry ``name`` and
            ``param_names``, used to label statistics).
        lr: learning rate (the global one; the ratio scales it per tensor).
        momentum: momentum coefficient (0: none).
        weight_decay: decay coefficient ``wd``, inside the ratio and the update.
        eta: trust coefficient.
        eps: added to the ratio's denominator.
        nesterov: Nesterov momentum.
        adapt: apply the layer-wise ratio (per group).
        no_decay_adapt: apply the ratio to groups whose ``weight_decay`` is 0 too.
        foreach: multi-tensor path (default) or the per-tensor reference path.

    Raises:
        UserError: an option is out of range.
    """

    SWITCHES = ("no_decay_adapt", "foreach")

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1.0,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eta: float = 1e-3,
        eps: float = 1e-8,
        nesterov: bool = False,
        *,
        adapt: bool = True,
        no_decay_adapt: bool = False,
        foreach: bool = True,
    ) -> None:
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "eta": eta,
            "eps": eps,
            "nesterov": nesterov,
            "adapt": adapt,
        }
        self.no_decay_adapt, self.foreach = no_decay_adapt, foreach
        super().__init__(params, defaults)

    def _check(self, group: dict[str, Any], where: str) -> None:
        if not 0 <= group["momentum"] < 1:
            raise UserError(f"{where}: momentum must be in [0, 1), got {group['momentum']!r}")
        if not group["eta"] > 0:
            raise UserError(f"{where}: eta must be > 0, got {group['eta']!r}")
        if group["nesterov"] and group["momentum"] == 0:
            raise UserError(f"{where}: nesterov needs momentum > 0; set optimizer.momentum (e.g. 0.9) or nesterov=False")

    def _adapts(self, group: dict[str, Any]) -> bool:
        return group["adapt"] and (self.no_decay_adapt or group["weight_decay"] != 0)

    def _step_group(self, entry: Collected, context: Any, record: bool, skip: Tensor | None) -> Stats | None:
        fn = self._group_foreach if self.foreach else self._group_per_tensor
        kept = self._kept(skip, entry.params)  # a first step's fresh buffers go when the host reads the flag
        stats = fn(entry.group, entry.params, entry.grads, record)
        kept.restore()
        return stats

    def _step_sharded(
        self, groups: list[Collected], shard_group: Any, context: Any, record: bool, skip: Tensor | None
    ) -> list[Stats | None]:
        """The foreach step on FSDP2-sharded parameters: the weight and gradient norms
        of every group are summed across the shard group in one collective
        (``largebatch.dtensors``), then each rank updates its slices."""
        kept = self._kept(skip, [p for entry in groups for p in entry.params])
        results = self._sharded_steps(groups, shard_group, record)
        kept.restore()
        return results

    def _sharded_steps(self, groups: list[Collected], shard_group: Any, record: bool) -> list[Stats | None]:
        reduction = dtensors.NormReduction(shard_group)
        handles = [
            (reduction.add(e.params), reduction.add(e.grads)) if e.params and (self._adapts(e.group) or record) else None for e in groups
        ]
        if any(h is not None for h in handles):
            reduction.reduce()
        results: list[Stats | None] = []
        for (group, params, grads, _), handle in zip(groups, handles):
            if not params:
                results.append(None)
                continue
            ratio = w_norm = g_norm = None
            if handle is not None:
                w_norm, g_norm = reduction.norms(handle[0]), reduction.norms(handle[1])
                ratio = self._ratios(group, w_norm, g_norm) if self._adapts(group) else torch.ones_like(w_norm)
            ratios = list(ratio.to(params[0].dtype).unbind()) if self._adapts(group) else None
            self._update_foreach(group, dtensors.locals_of(params), dtensors.locals_of(grads), ratios, keys=params)
            results.append((ratio, w_norm, g_norm))  # type: ignore[arg-type]
        return results

    def _ratios(self, group: dict[str, Any], w_norm: Tensor, g_norm: Tensor) -> Tensor:
        """``eta * ||x|| / (||g|| + wd * ||x|| + eps)``, 1 where either norm is zero."""
        wd = group["weight_decay"]
        ratio = group["eta"] * w_norm / (g_norm + wd * w_norm + group["eps"])
        return torch.where((w_norm > 0) & (g_norm > 0), ratio, torch.ones_like(ratio))

    def _group_per_tensor(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor], record: bool):
        """The algorithm written out per tensor: the reference path."""
        lr, wd, momentum = group["lr"], group["weight_decay"], group["momentum"]
        adapt = self._adapts(group)
        ratios, w_norms, g_norms = [], [], []
        for p, g in zip(params, grads):
            w_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(g)
            ratio = self._ratios(group, w_norm, g_norm) if adapt else torch.ones_like(w_norm)
            ratios.append(ratio)
            w_norms.append(w_norm)
            g_norms.append(g_norm)
            d = g + wd * p
            if adapt:
                d = d * ratio
            if momentum != 0:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = d.clone()
                else:
                    state["momentum_buffer"].mul_(momentum).add_(d)
                b = state["momentum_buffer"]
                d = d + momentum * b if group["nesterov"] else b
            p.add_(d, alpha=-lr)
        return (torch.stack(ratios), torch.stack(w_norms), torch.stack(g_norms)) if record else None

    def _group_foreach(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor], record: bool):
        """Multi-tensor step; buckets tensors by device and dtype."""
        buckets: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for i, p in enumerate(params):
            buckets.setdefault((p.device, p.dtype), []).append(i)
        parts = [(idx, self._bucket_foreach(group, [params[i] for i in idx], [grads[i] for i in idx], record)) for idx in buckets.values()]
        return in_order(parts) if record else None  # type: ignore[arg-type]

    def _bucket_foreach(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor], record: bool):
        adapt = self._adapts(group)
        ratio = w_norm = g_norm = None
        if adapt or record:
            w_norm = torch.stack(torch._foreach_norm(params))
            g_norm = torch.stack(torch._foreach_norm(grads))
            ratio = self._ratios(group, w_norm, g_norm) if adapt else torch.ones_like(w_norm)
        ratios = list(ratio.to(params[0].dtype).unbind()) if adapt else None
        for window in _windows(params, CPU_WINDOW_ELEMENTS if params[0].device.type == "cpu" else 0):
            self._update_foreach(
                group, [params[i] for i in window], [grads[i] for i in window], None if ratios is None else [ratios[i] for i in window]
            )
        return ratio, w_norm, g_norm

    def _update_foreach(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        ratios: list[Tensor] | None,
        keys: list[Tensor] | None = None,
    ) -> None:
        """``d = ratio (g + wd x)``, the momentum buffer and the parameter update, for one
        window. ``keys``: the parameters the state belongs to when ``params`` are their
        local slices (sharded); the buffers are then DTensors like the parameters."""
        lr, wd, momentum = group["lr"], group["weight_decay"], group["momentum"]
        keys = params if keys is None else keys
        updates = torch._foreach_add(grads, params, alpha=wd) if wd != 0 else torch._foreach_mul(grads, 1.0)
        if ratios is not None:
            torch._foreach_mul_(updates, ratios)
        if momentum != 0:
            fresh = [i for i, k in enumerate(keys) if "momentum_buffer" not in self.state[k]]
            for i in fresh:
                if keys is params:
                    self.state[keys[i]]["momentum_buffer"] = updates[i].clone()
                else:
                    buffer = torch.zeros_like(keys[i])
                    dtensors.local(buffer).copy_(updates[i])
                    self.state[keys[i]]["momentum_buffer"] = buffer
            fresh_set = set(fresh)
            old = [i for i in range(len(params)) if i not in fresh_set]
            if old:
                bufs = [dtensors.local(self.state[keys[i]]["momentum_buffer"]) for i in old]
                torch._foreach_mul_(bufs, momentum)
                torch._foreach_add_(bufs, [updates[i] for i in old])
            bufs = [dtensors.local(self.state[k]["momentum_buffer"]) for k in keys]
            if group["nesterov"]:
                torch._foreach_add_(updates, bufs, alpha=momentum)
            else:
                updates = bufs
        torch._foreach_add_(params, updates, alpha=-lr)


# On the CPU the update runs over windows of whole tensors of at most this many elements
# together (a larger tensor is a window on its own): the window's temporaries are freed
# and reused at the same size, instead of one parameter-sized temporary per step whose
# fresh pages cost more than the arithmetic (bench/lars_step.py). Elsewhere: one window.
CPU_WINDOW_ELEMENTS = 1 << 20


def _windows(params: list[Tensor], limit: int) -> list[list[int]]:
    """Indices of ``params`` in consecutive windows of at most ``limit`` elements (0: one window)."""
    if limit <= 0:
        return [list(range(len(params)))]
    windows: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, p in enumerate(params):
        if current and size + p.numel() > limit:
            windows.append(current)
            current, size = [], 0
        current.append(i)
        size += p.numel()
    if current:
        windows.append(current)
    return windows
