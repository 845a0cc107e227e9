"""LAMB: layer-wise adaptive moments for large-batch training.

Paper: You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76
minutes", ICLR 2020, arXiv:1904.00962, Algorithm 2 (written out in ``lamb_update``):
``u = r + wd * x`` with ``r`` Adam's bias-corrected direction, ``x = x - lr ||x|| / ||u|| u``.
Where the switches come from:

* ``decoupled_weight_decay=True``: ``x = (1 - lr wd) x``, then the step with ``u = r`` (timm
  ``decoupled_decay``; the ratio sees the decayed weights). The default ``u = r + wd x`` is
  also apex's and Habana's ``adam_w_mode=True`` and Colossal-AI's only mode.
* ``max_trust_ratio`` / ``min_trust_ratio`` clamp the ratio (timm ``trust_clip`` is
  ``max_trust_ratio=1.0``, LAMBC); torch-optimizer's clamp of the weight norm is not offered.
* per-group ``adapt=False``: Adam(W) steps for that group; ``adam=True``: for every group
  (Colossal-AI / torch-optimizer ``adam=True``), for ablations.
* ``no_decay_adapt=False``: ratio 1 for groups whose ``weight_decay`` is 0, the default of
  timm (``always_adapt``), apex (``use_nvlamb``) and Habana (``use_lamb``).
* ``bias_correction``: the paper's ``m_hat``, ``v_hat``; Colossal-AI and torch-optimizer
  default to none and, when on, fold it into the lr after the ratio, unlike the paper.
* ``max_grad_norm``: clipping inside ``step`` (timm, apex and Habana clip at 1.0 by
  default); off here, as the engine clips once per step, after unscaling.

``Lamb`` owns the options, the state and the step's order (its skeleton is LARS's too:
``largebatch.optim.layerwise``); ``choose``, the one place where an implementation is
picked, gives each bucket its kernel (``lamb_update``: the update and the kernels' interface).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from largebatch import dtensors
from largebatch.errors import UserError
from largebatch.optim import lamb_cpu, lamb_update
from largebatch.optim.lamb_update import Kernel, Settings, Tensors
from largebatch.optim.layerwise import Collected, LayerwiseOptimizer, Stats, in_order

REFERENCE, FUSED_ADAM = lamb_update.Reference(), lamb_update.FusedAdam()
MULTI_TENSOR, MULTI_TENSOR_IN_PLACE = lamb_update.MultiTensor(), lamb_update.MultiTensor(in_place=True)


def choose(
    tensors: Tensors,
    *,
    foreach: bool = True,
    chunk_elements: int | None = None,
    buffers: lamb_cpu.Buffers | None = None,
    sharded: bool = False,
    skip: Tensor | None = None,
) -> Kernel:
    """LAMB's implementation for a bucket ``(params, grads, exp_avgs, exp_avg_sqs)``, decided
    here only (the Triton kernel given the step's ``found_inf`` flag ``skip``, which it reads:
    ``Kernel.reads_skip``): the first that applies of

    1. the per-tensor reference (``lamb_update.Reference``) when not ``foreach``;
    2. ``lamb_cpu``'s chunks of ``chunk_elements`` (``None``: ``CPU_CHUNK_ELEMENTS``; 0: off) in
       the optimizer's ``buffers``, for whole tensors (not ``sharded`` slices);
    3. the Triton kernel (``lamb_triton``), then torch's fused Adam kernel (``lamb_update.FusedAdam``);
    4. plain multi-tensor ops (``lamb_update.MultiTensor``), which take anything (in place on
       ``sharded`` slices).
    """
    if not foreach or not tensors[0]:
        return REFERENCE
    from largebatch.optim import lamb_triton  # at the first step, not with the package: Triton takes ~0.15 s to import

    limit = lamb_cpu.CPU_CHUNK_ELEMENTS if chunk_elements is None else chunk_elements
    chunks = [lamb_cpu.CpuChunks(limit, buffers)] if limit and buffers is not None and not sharded else []
    for kernel in (*chunks, lamb_triton.Triton(skip), FUSED_ADAM):
        if kernel.applies(tensors):
            return kernel
    return MULTI_TENSOR_IN_PLACE if sharded else MULTI_TENSOR


class Lamb(LayerwiseOptimizer):
    """LAMB (You et al. 2019, Algorithm 2) with named switches for the peers' variants.

    Every option but the ``SWITCHES`` is also a per-group key; groups may carry ``name`` and
    ``param_names`` (``largebatch.optim.param_groups``), which label the statistics
    (``request_stats()``, ``last_stats``: ``largebatch.optim.layerwise``; ``||u||`` is
    ``update_norm``). Gradients are read from ``.grad`` as they are (unscale them first under
    ``GradScaler``); a parameter without one is skipped and its state does not advance.

    Args:
        params: parameters or parameter-group dicts.
        lr: learning rate.
        betas: decay rates of the first and second moments.
        eps: added to ``sqrt(v_hat)``.
        weight_decay: decay coefficient ``wd``.
        bias_correction: divide the moments by ``1 - beta^t`` as in the paper.
        decoupled_weight_decay: decay the weights outside the trust ratio (AdamW-style).
        adapt: apply the layer-wise trust ratio (per group; ``False`` gives Adam(W)).
        max_trust_ratio: upper clamp of the ratio, ``None`` for none.
        min_trust_ratio: lower clamp of the ratio, ``None`` for none.
        adam: ratio 1 for every group, for ablations.
        no_decay_adapt: apply the trust ratio to groups whose ``weight_decay`` is 0 too.
        max_grad_norm: clip all gradients by their global norm inside ``step``, as
            ``clip_grad_norm_`` would, leaving ``.grad`` as it was; ``None``: the engine clips.
        foreach: multi-tensor path (default) or the per-tensor reference path.
        chunk_elements: elements per chunk of the CPU kernel (``lamb_cpu``): ``None`` is
            ``CPU_CHUNK_ELEMENTS``, ``0`` turns it off (the plain multi-tensor kernel).

    Raises:
        UserError: an option is out of range.
    """

    SWITCHES = ("adam", "no_decay_adapt", "max_grad_norm", "foreach", "chunk_elements")

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        bias_correction: bool = True,
        *,
        decoupled_weight_decay: bool = False,
        adapt: bool = True,
        max_trust_ratio: float | None = None,
        min_trust_ratio: float | None = None,
        adam: bool = False,
        no_decay_adapt: bool = True,
        max_grad_norm: float | None = None,
        foreach: bool = True,
        chunk_elements: int | None = None,
    ) -> None:
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise UserError(f"max_grad_norm must be > 0 or None, got {max_grad_norm!r}; use None to leave clipping to the engine")
        if chunk_elements is not None and chunk_elements < 0:
            raise UserError(f"chunk_elements must be >= 0 or None, got {chunk_elements!r}")
        self._buffers: lamb_cpu.Buffers = {}  # the CPU kernel's, kept between steps
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "bias_correction": bias_correction,
            "decoupled_weight_decay": decoupled_weight_decay,
            "adapt": adapt,
            "max_trust_ratio": max_trust_ratio,
            "min_trust_ratio": min_trust_ratio,
        }
        self.adam, self.no_decay_adapt, self.max_grad_norm, self.foreach = adam, no_decay_adapt, max_grad_norm, foreach
        self.chunk_elements = chunk_elements
        super().__init__(params, defaults)

    def _check(self, group: dict[str, Any], where: str) -> None:
        betas = group["betas"]
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise UserError(f"{where}: betas must be two numbers in [0, 1), got {betas!r}")
        low, high = group["min_trust_ratio"], group["max_trust_ratio"]
        for key, value in (("min_trust_ratio", low), ("max_trust_ratio", high)):
            if value is not None and not value > 0:
                raise UserError(f"{where}: {key} must be > 0 or None, got {value!r}")
        if low is not None and high is not None and low > high:
            raise UserError(f"{where}: min_trust_ratio {low} is above max_trust_ratio {high}")

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._buffers = {}  # the CPU kernel's scratch space is not pickled (copy.deepcopy): made anew

    def _init_state(self, param: Tensor, state: dict[str, Any]) -> None:
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)

    def _prepare(self, groups: list[Collected]) -> Tensor | None:
        """The clipping coefficient, ``min(1, max_norm / (global_norm + 1e-6))`` as
        ``clip_grad_norm_``'s, or None; of sharded gradients in one collective."""
        grads = [g for entry in groups for g in entry.grads]
        if self.max_grad_norm is None or not grads:
            return None
        return (self.max_grad_norm / (torch.linalg.vector_norm(dtensors.grad_norms(grads)) + 1e-6)).clamp(max=1.0)

    def _buckets(self, entry: Collected, record: bool) -> list[tuple[list[int], Settings, Tensors]]:
        """Count a step for each parameter; the group's buckets: indices, settings, tensors."""
        keys: dict[tuple[Any, ...], list[int]] = {}
        for i, p in enumerate(entry.params):
            self.state[p]["step"] += 1
            keys.setdefault((p.device, p.dtype, self.state[p]["step"]), []).append(i)
        adapt = not self.adam and entry.group["adapt"] and (self.no_decay_adapt or entry.group["weight_decay"] != 0)
        out = []
        for (_, _, step), idx in keys.items():
            ps, states = [entry.params[i] for i in idx], [self.state[entry.params[i]] for i in idx]
            tensors = (ps, [entry.grads[i] for i in idx], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states])
            out.append((idx, Settings.of(entry.group, step, adapt, record), tensors))
        return out

    def _step_group(self, entry: Collected, context: Tensor | None, record: bool, skip: Tensor | None) -> Stats | None:
        parts = []
        for idx, settings, tensors in self._buckets(entry, record):
            kernel = choose(tensors, foreach=self.foreach, chunk_elements=self.chunk_elements, buffers=self._buffers, skip=skip)
            kept = self._kept(None if kernel.reads_skip else skip, tensors[0])
            parts.append((idx, kernel.step(settings, tensors, context)))
            kept.restore()
        return in_order(parts) if record else None  # type: ignore[arg-type]

    def _step_sharded(
        self, groups: list[Collected], shard_group: Any, context: Tensor | None, record: bool, skip: Tensor | None
    ) -> list[Stats | None]:
        """Every bucket begins on this rank's slices; one collective adds up all their sums of
        squares (clipping took another); then every bucket finishes with the whole norms."""
        reduction, begun, kept = dtensors.NormReduction(shard_group), [], []
        for g, entry in enumerate(groups):
            for idx, settings, tensors in self._buckets(entry, record):
                local: Tensors = tuple(dtensors.locals_of(ts) for ts in tensors)  # type: ignore[assignment]
                kernel = choose(local, sharded=True, skip=skip)
                kept.append(self._kept(None if kernel.reads_skip else skip, tensors[0]))
                pending = kernel.begin(settings, local, context)
                handles = [reduction.add_squares(s) for s in pending.squares()] if settings.needs_norms else []
                begun.append((g, idx, settings, pending, handles))
        if any(handles for *_, handles in begun):
            reduction.reduce()
        done: list[list[tuple[list[int], Stats]]] = [[] for _ in groups]
        for g, idx, settings, pending, handles in begun:
            if not handles:
                pending.finish(None)
            else:
                done[g].append((idx, pending.complete(settings, *(reduction.norms(h) for h in handles))))
        for bucket in kept:
            bucket.restore()
        return [in_order(parts) if record and parts else None for parts in done]
