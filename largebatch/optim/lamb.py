"""LAMB: layer-wise adaptive moments for large-batch training.

Paper: You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76
minutes", ICLR 2020, arXiv:1904.00962, Algorithm 2. Per parameter tensor ``x``:

    m = b1 * m + (1 - b1) * g                  v = b2 * v + (1 - b2) * g^2
    m_hat = m / (1 - b1^t)                     v_hat = v / (1 - b2^t)
    r = m_hat / (sqrt(v_hat) + eps)            u = r + wd * x
    x = x - lr * phi(||x||) / ||u|| * u        (ratio = 1 when ||x|| or ||u|| is 0)

with ``phi`` the identity here (the paper leaves it open); the optional clamp acts on the
ratio. Where the switches come from:

* ``decoupled_weight_decay=True``: decay the weights AdamW-style, ``x = (1 - lr*wd) x``,
  then take the step with ``u = r`` (timm ``decoupled_decay=True``: the trust ratio sees
  the decayed weights, as here). Default: the paper's ``u = r + wd * x``, which is also
  NVIDIA apex / Habana ``FusedLamb``'s ``adam_w_mode=True`` and Colossal-AI's only mode.
* ``max_trust_ratio`` / ``min_trust_ratio``: clamp the ratio. timm ``trust_clip=True`` is
  ``max_trust_ratio=1.0`` (LAMBC). cybertronai / torch-optimizer clamp the *weight norm*
  at 10 instead, which is not offered.
* per-group ``adapt``: layer adaptation on for every group as in the paper; a group with
  ``adapt=False`` takes plain Adam(W) steps.
* ``no_decay_adapt=False``: ratio 1 for every group whose ``weight_decay`` is 0, as timm
  (``always_adapt=False``), NVIDIA apex (``use_nvlamb=False``) and Habana ``FusedLamb``
  (``use_lamb=False``) do by default: the no-decay group (biases, norms, embeddings)
  then takes Adam steps.
* ``adam=True``: ratio 1 everywhere (Colossal-AI / torch-optimizer ``adam=True``), for
  ablations.
* ``bias_correction``: the paper's ``m_hat`` / ``v_hat``. Colossal-AI and torch-optimizer
  default to no bias correction and, when it is on, fold it into the learning rate
  after the ratio, so their ratio differs from the paper's.
* ``max_grad_norm``: global-norm clipping inside ``step`` (timm, apex and Habana clip at
  1.0 by default). Off here: the engine clips once per step, after unscaling.

Implementation: the foreach path runs ``torch._foreach_*`` ops over all tensors of a
group, folds bias correction into scalars, computes norms with ``torch._foreach_norm``
and the ratios in one vectorised op, and on accelerators never reads a value back to the
host. On the CPU (where foreach ops are loops of ordinary kernels) it walks the tensors
in cache-sized chunks: a tensor above ``chunk_elements`` is cut into flat pieces whose
norms are summed back, and each window of whole tensors is updated as soon as its norms
are known, backwards, while its pieces are still in cache. The update is written into a
reusable buffer the size of the largest window (a fresh temporary per chunk costs more in
page faults than the arithmetic), and the step sizes are read as Python floats, a memory
read on the CPU rather than a device sync. The per-tensor path (``foreach=False``) writes
the algorithm out literally; it is the reference the foreach path is tested against.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from largebatch.errors import UserError
from largebatch.optim import sharded

# Elements per chunk on the CPU: the five float32 streams of a chunk (10 MiB) stay in a
# server L3; 256Ki to 1Mi measured within noise of each other on ViT-B (bench/).
CPU_CHUNK_ELEMENTS = 512 * 1024

_GROUP_KEYS = (
    "lr",
    "betas",
    "eps",
    "weight_decay",
    "bias_correction",
    "decoupled_weight_decay",
    "adapt",
    "max_trust_ratio",
    "min_trust_ratio",
)


# Optimizer-wide switches (not per group), kept by pickling and deepcopy.
_OPTIMIZER_KEYS = ("adam", "no_decay_adapt", "max_grad_norm", "foreach", "chunk_elements")


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019, Algorithm 2) with named switches for the peers' variants.

    Every option except ``adam``, ``no_decay_adapt``, ``max_grad_norm``, ``foreach`` and
    ``chunk_elements`` is also a per-group key. Groups may carry ``name`` and ``param_names`` (see
    ``largebatch.optim.param_groups.build_param_groups``); they are kept and used to
    label statistics. Gradients are read from ``.grad`` as they are (unscale them first
    when using ``torch.amp.GradScaler``); parameters whose ``.grad`` is ``None`` are
    skipped and their state does not advance.

    Statistics API (for hooks): ``optimizer.request_stats()`` makes the next ``step()``
    record, per group, the per-parameter trust ratios, weight norms and update norms
    (``||u||`` in the module docstring's notation) as device tensors without a host sync.
    After that step ``optimizer.last_stats`` is ``{group_name: {"param_names": [...],
    "trust_ratio": Tensor, "weight_norm": Tensor, "update_norm": Tensor}}``, one entry
    per parameter that had a gradient; unnamed groups are keyed ``"group<i>"``. A step
    that was not requested records nothing and costs nothing extra; ``last_stats`` then
    keeps the last recorded value.

    Args:
        params: parameters or parameter-group dicts.
        lr: learning rate.
        betas: decay rates of the first and second moments.
        eps: added to ``sqrt(v_hat)``.
        weight_decay: decay coefficient ``wd``.
        bias_correction: divide the moments by ``1 - beta^t`` as in the paper.
        decoupled_weight_decay: decay the weights outside the trust ratio (AdamW-style)
            instead of adding ``wd * x`` to the update.
        adapt: apply the layer-wise trust ratio (per group; ``False`` gives Adam(W)).
        max_trust_ratio: upper clamp of the ratio, ``None`` for none.
        min_trust_ratio: lower clamp of the ratio, ``None`` for none.
        adam: ratio 1 for every group, for ablations.
        no_decay_adapt: apply the trust ratio to groups whose ``weight_decay`` is 0 too
            (the paper, default); ``False`` gives them ratio 1 (timm, apex, Habana).
        max_grad_norm: clip all gradients by their global norm inside ``step`` (as
            ``torch.nn.utils.clip_grad_norm_`` would, without modifying ``.grad``);
            ``None`` (default) because the engine already clips once per step.
        foreach: multi-tensor path (default) or the per-tensor reference path.
        chunk_elements: foreach chunk size in elements; ``None`` picks
            ``CPU_CHUNK_ELEMENTS`` on the CPU and no chunking elsewhere, ``0`` disables.

    Raises:
        UserError: an option is out of range.
    """

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
        self.adam = adam
        self.no_decay_adapt = no_decay_adapt
        self.max_grad_norm = max_grad_norm
        self.foreach = foreach
        self.chunk_elements = chunk_elements
        self.last_stats: dict[str, dict[str, Any]] = {}
        self._stats_requested = False
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
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group and check its options.

        Args:
            param_group: a dict with ``params`` and optional per-group options.

        Raises:
            UserError: an option is out of range.
        """
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        where = f"param group {group.get('name', len(self.param_groups) - 1)!r}"
        if not group["lr"] >= 0:
            raise UserError(f"{where}: lr must be >= 0, got {group['lr']!r}")
        if not group["eps"] >= 0:
            raise UserError(f"{where}: eps must be >= 0, got {group['eps']!r}")
        if not group["weight_decay"] >= 0:
            raise UserError(f"{where}: weight_decay must be >= 0, got {group['weight_decay']!r}")
        betas = group["betas"]
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise UserError(f"{where}: betas must be two numbers in [0, 1), got {betas!r}")
        names = group.get("param_names")
        if names is not None and len(names) != len(group["params"]):
            raise UserError(
                f"{where}: param_names has {len(names)} names for {len(group['params'])} parameters; give one name per parameter, in order"
            )
        low, high = group["min_trust_ratio"], group["max_trust_ratio"]
        for key, value in (("min_trust_ratio", low), ("max_trust_ratio", high)):
            if value is not None and not value > 0:
                raise UserError(f"{where}: {key} must be > 0 or None, got {value!r}")
        if low is not None and high is not None and low > high:
            raise UserError(f"{where}: min_trust_ratio {low} is above max_trust_ratio {high}")

    def __getstate__(self) -> dict[str, Any]:
        # torch.optim.Optimizer pickles only defaults, state and groups; keep the
        # optimizer-wide switches too (copy.deepcopy, pickling).
        state = super().__getstate__()
        for key in _OPTIMIZER_KEYS:
            state[key] = getattr(self, key)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("no_decay_adapt", True)
        self.__dict__.setdefault("last_stats", {})
        self.__dict__.setdefault("_stats_requested", False)

    def request_stats(self) -> None:
        """Record trust ratios and norms during the next ``step()`` into ``last_stats``."""
        self._stats_requested = True

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Take one LAMB step on every parameter that has a gradient.

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
        record = self._stats_requested
        self._stats_requested = False
        groups = [self._collect(index, group) for index, group in enumerate(self.param_groups)]
        all_params = [p for _, params, _, _ in groups for p in params]
        shard_group = sharded.reduction_group(all_params)
        clip = self._clip_coefficient([g for _, _, grads, _ in groups for g in grads])
        if shard_group is not None and self.foreach:
            results = self._step_sharded(groups, shard_group, clip, record)
        else:
            fn = self._group_foreach if self.foreach else self._group_per_tensor
            results = [fn(group, params, grads, clip, record) if params else None for group, params, grads, _ in groups]
        stats: dict[str, dict[str, Any]] = {}
        for index, ((group, params, _, names), result) in enumerate(zip(groups, results)):
            if not params:
                continue
            if record:
                ratio, w_norm, u_norm = result
                stats[group.get("name", f"group{index}")] = {
                    "param_names": names,
                    "trust_ratio": ratio,
                    "weight_norm": w_norm,
                    "update_norm": u_norm,
                }
        if record:
            self.last_stats = stats
        return loss

    def _collect(self, index: int, group: dict[str, Any]) -> tuple[dict[str, Any], list[Tensor], list[Tensor], list[str]]:
        """The group's parameters with gradients, their gradients and names; inits state."""
        params, grads, names = [], [], []
        given = group.get("param_names")
        for i, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            name = given[i] if given is not None else f"group{index}.{i}"
            if p.grad.is_sparse:
                raise UserError(
                    f"Lamb got a sparse gradient for parameter {name!r}; LAMB needs dense gradients (e.g. nn.Embedding(..., sparse=False))"
                )
            state = self.state[p]
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            params.append(p)
            grads.append(p.grad)
            names.append(name)
        return group, params, grads, names

    def _clip_coefficient(self, grads: list[Tensor]) -> Tensor | None:
        """``min(1, max_norm / (global_norm + 1e-6))`` as ``clip_grad_norm_``, or None.
        Sharded gradients: the global norm across shards, in one collective."""
        if self.max_grad_norm is None or not grads:
            return None
        total = torch.linalg.vector_norm(sharded.grad_norms(grads))
        return (self.max_grad_norm / (total + 1e-6)).clamp(max=1.0)

    @staticmethod
    def _bias_scalars(group: dict[str, Any], step: int) -> tuple[float, float]:
        """``(scale, eps')`` with ``m_hat / (sqrt(v_hat) + eps) == scale * m / (sqrt(v) + eps')``:
        the bias corrections as scalars instead of passes over every tensor."""
        if not group["bias_correction"]:
            return 1.0, group["eps"]
        beta1, beta2 = group["betas"]
        bc1, bc2_sqrt = 1 - beta1**step, math.sqrt(1 - beta2**step)
        return bc2_sqrt / bc1, group["eps"] * bc2_sqrt

    def _step_sharded(self, groups: list, shard_group, clip: Tensor | None, record: bool) -> list[tuple[Tensor, Tensor, Tensor] | None]:
        """The foreach step on FSDP2-sharded parameters: each rank updates its slices,
        and every norm of the step (weights and updates of all groups) is summed across
        the shard group in one collective (``largebatch.optim.sharded``); ``clip`` from
        ``_clip_coefficient`` took a second one when ``max_grad_norm`` clips inside the
        step. Same arithmetic as the unchunked foreach path, so the trust ratios are the
        unsharded optimizer's."""
        reduction = sharded.NormReduction(shard_group)
        pending = []
        for group, params, grads, _ in groups:
            if not params:
                pending.append(None)
                continue
            beta1, beta2 = group["betas"]
            lr, wd, decoupled = group["lr"], group["weight_decay"], group["decoupled_weight_decay"]
            adapt = self._adapts(group)
            buckets: dict[int, list[int]] = {}
            for i, step in enumerate(self._advance(group, params)):
                buckets.setdefault(step, []).append(i)
            parts = []
            for step, idx in buckets.items():
                ps = sharded.locals_of(params[i] for i in idx)
                gs = sharded.locals_of(grads[i] for i in idx)
                ms = sharded.locals_of(self.state[params[i]]["exp_avg"] for i in idx)
                vs = sharded.locals_of(self.state[params[i]]["exp_avg_sq"] for i in idx)
                if clip is not None:
                    gs = torch._foreach_mul(gs, clip)
                scale, eps = self._bias_scalars(group, step)
                torch._foreach_lerp_(ms, gs, 1 - beta1)
                torch._foreach_mul_(vs, beta2)
                torch._foreach_addcmul_(vs, gs, gs, value=1 - beta2)
                us = torch._foreach_sqrt(vs)  # the step's only parameter-sized temporary
                torch._foreach_add_(us, eps)
                for u, m in zip(us, ms):
                    torch.div(m, u, out=u)  # in place: a foreach division would take a second one
                if not decoupled and wd != 0:
                    torch._foreach_add_(us, ps, alpha=wd / scale)  # u = scale * (us + wd / scale * x)
                handles = (reduction.add(ps), reduction.add(us)) if adapt or record else None
                parts.append((idx, ps, us, scale, 1 - lr * wd if decoupled else 1.0, handles))
            pending.append((group, adapt, parts, len(params)))
        if any(h is not None for entry in pending if entry for *_, h in entry[2]):
            reduction.reduce()
        results: list[tuple[Tensor, Tensor, Tensor] | None] = []
        for entry in pending:
            if entry is None:
                results.append(None)
                continue
            group, adapt, parts, count = entry
            lr = group["lr"]
            collected = []
            for idx, ps, us, scale, decay, handles in parts:
                if decay != 1.0:
                    torch._foreach_mul_(ps, decay)
                if handles is None:
                    torch._foreach_add_(ps, us, alpha=-lr * scale)
                    continue
                w_norm = reduction.norms(handles[0]) * abs(decay)
                u_norm = reduction.norms(handles[1]) * scale
                ratio = self._ratio(group, w_norm, u_norm) if adapt else torch.ones_like(w_norm)
                if adapt:
                    sizes = (ratio * (-lr * scale)).to(ps[0].dtype).unbind(0) if ps else []
                    torch._foreach_addcmul_(ps, us, list(sizes))
                else:
                    torch._foreach_add_(ps, us, alpha=-lr * scale)
                collected.append((idx, ratio, w_norm, u_norm))
            if not record:
                results.append(None)
                continue
            order = torch.tensor([i for idx, *_ in collected for i in idx]).argsort()
            results.append(tuple(torch.cat([c[k] for c in collected])[order.to(collected[0][1].device)] for k in (1, 2, 3)))  # type: ignore[arg-type]
        return results

    def _adapts(self, group: dict[str, Any]) -> bool:
        """Whether the group's step is scaled by the trust ratio."""
        if self.adam or not group["adapt"]:
            return False
        return self.no_decay_adapt or group["weight_decay"] != 0

    @staticmethod
    def _ratio_bounds(group: dict[str, Any]) -> tuple[float | None, float | None]:
        return group["min_trust_ratio"], group["max_trust_ratio"]

    def _ratio(self, group: dict[str, Any], w_norm: Tensor, u_norm: Tensor) -> Tensor:
        """Trust ratios ``||x|| / ||u||`` (clamped), 1 where either norm is zero."""
        ratio = w_norm / u_norm
        if group["min_trust_ratio"] is not None or group["max_trust_ratio"] is not None:
            ratio = ratio.clamp(min=group["min_trust_ratio"], max=group["max_trust_ratio"])
        return torch.where((w_norm > 0) & (u_norm > 0), ratio, torch.ones_like(ratio))

    def _scratch(self, device: torch.device, dtype: torch.dtype, size: int, slot: int = 0) -> Tensor:
        """A reusable flat buffer of ``size`` elements (not part of the state)."""
        key = (device, dtype, slot)
        buffers: dict[tuple[Any, ...], Tensor] = self.__dict__.setdefault("_buffers", {})
        if key not in buffers or buffers[key].numel() < size:
            buffers[key] = torch.empty(size, device=device, dtype=dtype)
        return buffers[key]

    def _advance(self, group: dict[str, Any], params: list[Tensor]) -> list[int]:
        steps = []
        for p in params:
            self.state[p]["step"] += 1
            steps.append(self.state[p]["step"])
        return steps

    def _group_per_tensor(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        clip: Tensor | None,
        record: bool,
    ) -> tuple[Tensor, Tensor, Tensor] | None:
        """Algorithm 2 written out per tensor: the reference path."""
        beta1, beta2 = group["betas"]
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        adapt = self._adapts(group)
        ratios, w_norms, u_norms = [], [], []
        for p, g, step in zip(params, grads, self._advance(group, params)):
            state = self.state[p]
            m, v = state["exp_avg"], state["exp_avg_sq"]
            if clip is not None:
                g = g * clip
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            if group["bias_correction"]:
                m_hat, v_hat = m / (1 - beta1**step), v / (1 - beta2**step)
            else:
                m_hat, v_hat = m, v
            update = m_hat / (v_hat.sqrt() + eps)
            if group["decoupled_weight_decay"]:
                p.mul_(1 - lr * wd)
            elif wd != 0:
                update.add_(p, alpha=wd)
            if adapt or record:
                w_norm, u_norm = (
                    torch.linalg.vector_norm(p),
                    torch.linalg.vector_norm(update),
                )
                ratio = self._ratio(group, w_norm, u_norm) if adapt else torch.ones_like(w_norm)
                ratios.append(ratio)
                w_norms.append(w_norm)
                u_norms.append(u_norm)
            if adapt:
                p.add_(update * (-lr * ratio))
            else:
                p.add_(update, alpha=-lr)
        if not record:
            return None
        return torch.stack(ratios), torch.stack(w_norms), torch.stack(u_norms)

    def _group_foreach(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        clip: Tensor | None,
        record: bool,
    ) -> tuple[Tensor, Tensor, Tensor] | None:
        """Multi-tensor step; buckets tensors by device, dtype and step count."""
        buckets: dict[tuple[Any, ...], list[int]] = {}
        for i, (p, step) in enumerate(zip(params, self._advance(group, params))):
            buckets.setdefault((p.device, p.dtype, step), []).append(i)
        parts = []
        for (device, _, step), idx in buckets.items():
            result = self._bucket_foreach(
                group,
                [params[i] for i in idx],
                [grads[i] for i in idx],
                step,
                device,
                clip,
                record,
            )
            parts.append((idx, result))
        if not record:
            return None
        if len(parts) == 1:
            return parts[0][1]
        order = torch.tensor([i for idx, _ in parts for i in idx]).argsort()
        device = params[0].device
        return tuple(torch.cat([r[k].to(device) for _, r in parts])[order.to(device)] for k in range(3))  # type: ignore[return-value]

    def _bucket_foreach(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        step: int,
        device: torch.device,
        clip: Tensor | None,
        record: bool,
    ) -> tuple[Tensor, Tensor, Tensor] | None:
        beta1, beta2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        decoupled = group["decoupled_weight_decay"]
        adapt = self._adapts(group)
        limit = self.chunk_elements
        if limit is None:
            limit = CPU_CHUNK_ELEMENTS if device.type == "cpu" else 0
        states = [self.state[p] for p in params]
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        # On the CPU, torch's fused Adam kernel (what Adam(fused=True) runs) computes the
        # moments and r = m_hat / (sqrt(v_hat) + eps) in one pass; given lr = -1 it adds r
        # to its "parameter", here the update buffer. Bias correction off = step at inf.
        fused = (
            limit > 0
            and device.type == "cpu"
            and params[0].dtype in (torch.float32, torch.float64)
            and hasattr(torch, "_fused_adam_")
            and all(t.is_contiguous() for tensors in (params, grads, exp_avgs, exp_avg_sqs) for t in tensors)
        )
        if fused:
            scale, eps = 1.0, group["eps"]
            step_tensor = torch.tensor(float(step) if group["bias_correction"] else math.inf)
        else:
            scale, eps = self._bias_scalars(group, step)
        coupled_wd = 0.0 if decoupled else wd / scale  # u = scale * (u' + coupled_wd x)
        # Decoupled decay scales the weights by a scalar, so the decayed weight norm is
        # decay * ||x|| and the decay itself is done in the final pass over the weights.
        decay = 1 - lr * wd if decoupled else 1.0
        states = [self.state[p] for p in params]
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        windows = _plan_windows(params, grads, exp_avgs, exp_avg_sqs, limit)
        need_norms = adapt or record

        dtype = params[0].dtype
        # On the CPU a fresh temporary per chunk costs more in page faults than the math:
        # the update goes into a buffer kept between steps, sized to the largest window.
        buffer = None
        if limit:
            buffer = self._scratch(device, dtype, max(w.numel for w in windows))
        clip_buffer = self._scratch(device, dtype, limit, slot=1) if limit and clip is not None else None
        offset = 0

        def direction(ps: list[Tensor], ms: list[Tensor], vs: list[Tensor]) -> list[Tensor]:
            nonlocal offset
            if buffer is None:
                us = torch._foreach_sqrt(vs)
                torch._foreach_add_(us, eps)
                us = torch._foreach_div(ms, us)
            else:
                # foreach ops have no out= form; writing straight into the buffer saves
                # the copy in and the reciprocal a foreach version needs.
                us = _views(buffer, vs, offset)
                offset += sum(u.numel() for u in us)
                for u, m, v in zip(us, ms, vs):
                    torch.sqrt(v, out=u)
                    u.add_(eps)
                    torch.div(m, u, out=u)
            if coupled_wd != 0:
                torch._foreach_add_(us, ps, alpha=coupled_wd)
            return us

        def apply(ps: list[Tensor], us: list[Tensor], sizes: list[Tensor] | list[float] | None) -> None:
            if decay != 1.0:
                torch._foreach_mul_(ps, decay)
            if sizes is None:
                torch._foreach_add_(ps, us, alpha=-lr * scale)
            elif isinstance(sizes[0], float):
                for p, u, size in zip(ps, us, sizes):
                    p.add_(u, alpha=size)
            else:
                torch._foreach_addcmul_(ps, us, sizes)

        # A foreach multiply by a Python number takes a temporary per tensor on the CPU;
        # by a 0-dim tensor it is in place.
        beta2_scalar: float | Tensor = torch.tensor(beta2, dtype=dtype) if buffer is not None else beta2
        results: list[tuple[Tensor, ...]] = []
        on_host = device.type == "cpu" and buffer is not None
        for window in windows:
            offset = 0
            w_parts: list[Tensor] = []
            u_parts: list[Tensor] = []
            updates: list[list[Tensor]] = []
            for ps, gs, ms, vs in window.chunks:
                if clip is not None:
                    if clip_buffer is None:
                        gs = torch._foreach_mul(gs, clip)
                    else:
                        clipped = _views(clip_buffer, gs)
                        torch._foreach_copy_(clipped, gs)
                        torch._foreach_mul_(clipped, clip)
                        gs = clipped
                if fused:
                    us = _views(buffer, ps, offset)
                    offset += sum(u.numel() for u in us)
                    if coupled_wd != 0:
                        for u, p in zip(us, ps):
                            torch.mul(p, coupled_wd, out=u)
                    else:
                        torch._foreach_zero_(us)
                    torch._fused_adam_(
                        us, gs, ms, vs, [], [step_tensor] * len(us),
                        lr=-1.0, beta1=beta1, beta2=beta2, weight_decay=0.0,
                        eps=eps, amsgrad=False, maximize=False,
                    )  # fmt: skip
                else:
                    torch._foreach_lerp_(ms, gs, 1 - beta1)
                    torch._foreach_mul_(vs, beta2_scalar)
                    torch._foreach_addcmul_(vs, gs, gs, value=1 - beta2)
                    us = direction(ps, ms, vs)
                if need_norms:
                    norms = torch._foreach_norm([*ps, *us])  # one call for both
                    w_parts.extend(norms[: len(ps)])
                    u_parts.extend(norms[len(ps) :])
                    updates.append(us)
                else:
                    apply(ps, us, None)  # no ratio to wait for: one pass
            if not need_norms:
                continue
            sizes: list[float] | list[Tensor] | None = None
            if on_host:
                # On the CPU the norms are host memory already (tolist() is a read, not a
                # device sync): the few scalars per tensor are cheaper in Python than as
                # a dozen tiny tensor ops, and float step sizes make the final update one
                # op per piece (multiplying by 0-dim tensors takes a temporary there).
                ratios, w_norms, u_norms = _host_ratios(
                    self._ratio_bounds(group) if adapt else None,
                    torch.stack(w_parts).tolist(),
                    torch.stack(u_parts).tolist(),
                    window.owner,
                    window.count,
                    abs(decay),
                    scale,
                )
                if record:
                    results.append(tuple(torch.tensor(x, dtype=dtype) for x in (ratios, w_norms, u_norms)))
                if adapt:
                    sizes = [ratios[i] * (-lr * scale) for i in window.owner]
            else:
                # Built only when a tensor was split (not on the unchunked path, where
                # it would be a host-to-device copy every step).
                owner = None
                if len(window.owner) != window.count:
                    owner = torch.tensor(window.owner, device=device)
                w_norm = _per_tensor_norm(w_parts, owner, window.count) * abs(decay)
                u_norm = _per_tensor_norm(u_parts, owner, window.count) * scale
                ratio = self._ratio(group, w_norm, u_norm) if adapt else torch.ones_like(w_norm)
                results.append((ratio, w_norm, u_norm))
                if adapt:
                    step_size = ratio * (-lr * scale)
                    if owner is not None:
                        step_size = step_size[owner]
                    sizes = list(step_size.unbind(0))
            # Backwards: the pieces touched last are the ones still in cache.
            end = len(sizes) if sizes is not None else 0
            for (ps, *_), us in reversed(list(zip(window.chunks, updates))):
                apply(ps, us, sizes[end - len(ps) : end] if sizes is not None else None)
                end -= len(ps)
        if not record:
            return None
        if len(results) == 1:
            return results[0]
        return tuple(torch.cat([r[k] for r in results]) for k in range(3))  # type: ignore[return-value]


class _Window(NamedTuple):
    """Whole tensors whose update is applied as soon as their norms are known."""

    chunks: list[tuple[list[Tensor], ...]]  # (params, grads, exp_avgs, exp_avg_sqs) pieces
    owner: list[int]  # for each piece, the index of its tensor within the window
    count: int  # tensors in the window
    numel: int


def _plan_windows(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    limit: int,
) -> list[_Window]:
    """Split the tensors into windows of chunks of at most ``limit`` elements.

    A tensor larger than ``limit`` is cut into flat pieces of ``limit`` elements (when
    all four tensors are contiguous), one chunk each, and forms a window on its own;
    smaller tensors are packed into chunks of whole tensors, one window each. With
    ``limit`` 0 everything is one chunk in one window.
    """
    if limit == 0:
        owner = list(range(len(params)))
        numel = sum(p.numel() for p in params)
        return [_Window([(params, grads, exp_avgs, exp_avg_sqs)], owner, len(params), numel)]
    windows: list[_Window] = []
    current: tuple[list[Tensor], ...] = ([], [], [], [])
    size = 0

    def flush() -> None:
        nonlocal current, size
        if current[0]:
            owner = list(range(len(current[0])))
            windows.append(_Window([current], owner, len(current[0]), size))
        current, size = ([], [], [], []), 0

    for tensors in zip(params, grads, exp_avgs, exp_avg_sqs):
        numel = tensors[0].numel()
        if numel > limit and all(t.is_contiguous() for t in tensors):
            flush()
            pieces = list(zip(*(t.view(-1).split(limit) for t in tensors)))
            chunks = [tuple([t] for t in piece) for piece in pieces]
            owner = [0] * len(pieces)
            windows.append(_Window(chunks, owner, 1, numel))
            continue
        if size and size + numel > limit:
            flush()
        for lst, t in zip(current, tensors):
            lst.append(t)
        size += numel
    flush()
    return windows


def _views(buffer: Tensor, like: list[Tensor], offset: int = 0) -> list[Tensor]:
    """Consecutive views of ``buffer`` from ``offset`` on, shaped like ``like``."""
    out = []
    for t in like:
        out.append(buffer[offset : offset + t.numel()].view(t.shape))
        offset += t.numel()
    return out


def _host_ratios(
    bounds: tuple[float | None, float | None] | None,
    w_parts: list[float],
    u_parts: list[float],
    owner: list[int],
    count: int,
    w_factor: float,
    u_factor: float,
) -> tuple[list[float], list[float], list[float]]:
    """``Lamb._ratio`` in Python floats, from the norms of pieces; bounds None: ratio 1."""
    if len(w_parts) == count:
        w_norms, u_norms = list(w_parts), list(u_parts)
    else:
        w_sq, u_sq = [0.0] * count, [0.0] * count
        for i, w, u in zip(owner, w_parts, u_parts):
            w_sq[i] += w * w
            u_sq[i] += u * u
        w_norms, u_norms = [math.sqrt(x) for x in w_sq], [math.sqrt(x) for x in u_sq]
    w_norms = [w * w_factor for w in w_norms]
    u_norms = [u * u_factor for u in u_norms]
    ratios = [1.0] * count
    if bounds is not None:
        low, high = bounds
        for i, (w, u) in enumerate(zip(w_norms, u_norms)):
            if w > 0 and u > 0:
                ratio = w / u
                if low is not None:
                    ratio = max(ratio, low)
                if high is not None:
                    ratio = min(ratio, high)
                ratios[i] = ratio
    return ratios, w_norms, u_norms


def _per_tensor_norm(parts: list[Tensor], owner: Tensor | None, count: int) -> Tensor:
    """Combine the L2 norms of pieces into the norm of each whole tensor."""
    norms = torch.stack(parts)
    if owner is None:
        return norms
    total = torch.zeros(count, dtype=norms.dtype, device=norms.device)
    return total.index_add_(0, owner, norms * norms).sqrt()
