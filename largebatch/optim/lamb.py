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

Implementation, three paths with the same arithmetic (tested against each other and
against the update written out):

* per tensor (``foreach=False``): the algorithm written out literally, the reference.
* multi-tensor (``foreach=True``, the default): ``torch._foreach_*`` ops over all tensors
  of a group, bias correction folded into two scalars, the norms from one
  ``torch._foreach_norm`` and the ratios in one vectorised op; on accelerators it never
  reads a value back to the host. On the CPU a bucket whose tensors allow it goes to
  ``largebatch.optim.lamb_cpu`` instead: cache-sized chunks on torch's fused Adam
  kernel, taken only where ``lamb_cpu.applies`` says the private kernel is there and
  usable (otherwise this path runs). On CUDA a float32 bucket takes a two-pass Triton
  kernel that never writes the update (``largebatch.optim.lamb_triton``: about 1.43x
  fused AdamW's memory traffic); other CUDA buckets take the moments and ``r`` from the
  same fused kernel as the CPU over whole tensors (``largebatch.optim.lamb_fused``: half
  the memory traffic of plain foreach ops), the norms and the step as here.
* sharded (FSDP2's DTensors, ``_step_sharded``): the multi-tensor path on each rank's
  slices (on CUDA with ``lamb_triton``'s two passes, or ``lamb_fused``'s moments), with
  every norm of the step summed across the shard group in one collective
  (``largebatch.optim.sharded``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from largebatch.errors import UserError
from largebatch.optim import lamb_cpu, lamb_fused, lamb_triton, sharded
from largebatch.optim.lamb_cpu import CPU_CHUNK_ELEMENTS

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
        chunk_elements: chunk size in elements of the CPU kernel
            (``largebatch.optim.lamb_cpu``); ``None`` picks ``CPU_CHUNK_ELEMENTS``, ``0``
            turns the kernel off (the plain foreach path). Other devices do not chunk.

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
        self._scratch = lamb_cpu.Scratch()
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
        self.__dict__.setdefault("_scratch", lamb_cpu.Scratch())

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
        shard_group = sharded.reduction_group([p for entry in groups for p in entry.params])
        clip = self._clip_coefficient([g for entry in groups for g in entry.grads])
        if shard_group is not None and self.foreach:
            results = self._step_sharded(groups, shard_group, clip, record)
        else:
            fn = self._group_foreach if self.foreach else self._group_per_tensor
            results = [fn(entry.group, entry.params, entry.grads, clip, record) if entry.params else None for entry in groups]
        if record:
            self.last_stats = _stats_by_name(groups, results)
        return loss

    def _collect(self, index: int, group: dict[str, Any]) -> _Collected:
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
        return _Collected(group, params, grads, names)

    def _clip_coefficient(self, grads: list[Tensor]) -> Tensor | None:
        """``min(1, max_norm / (global_norm + 1e-6))`` as ``clip_grad_norm_``, or None.
        Sharded gradients: the global norm across shards, in one collective."""
        if self.max_grad_norm is None or not grads:
            return None
        total = torch.linalg.vector_norm(sharded.grad_norms(grads))
        return (self.max_grad_norm / (total + 1e-6)).clamp(max=1.0)

    def _adapts(self, group: dict[str, Any]) -> bool:
        """Whether the group's step is scaled by the trust ratio."""
        if self.adam or not group["adapt"]:
            return False
        return self.no_decay_adapt or group["weight_decay"] != 0

    def _ratio(self, group: dict[str, Any], w_norm: Tensor, u_norm: Tensor) -> Tensor:
        """Trust ratios ``||x|| / ||u||`` (clamped), 1 where either norm is zero."""
        ratio = w_norm / u_norm
        if group["min_trust_ratio"] is not None or group["max_trust_ratio"] is not None:
            ratio = ratio.clamp(min=group["min_trust_ratio"], max=group["max_trust_ratio"])
        return torch.where((w_norm > 0) & (u_norm > 0), ratio, torch.ones_like(ratio))

    def _advance(self, params: list[Tensor]) -> list[int]:
        """Count one more step for each parameter; returns the new counts."""
        steps = []
        for p in params:
            self.state[p]["step"] += 1
            steps.append(self.state[p]["step"])
        return steps

    def _moments(self, params: Iterable[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        states = [self.state[p] for p in params]
        return [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]

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
        for p, g, step in zip(params, grads, self._advance(params)):
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
                w_norm, u_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(update)
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
        for i, (p, step) in enumerate(zip(params, self._advance(params))):
            buckets.setdefault((p.device, p.dtype, step), []).append(i)
        parts = []
        for (_, _, step), idx in buckets.items():
            stats = self._bucket_foreach(group, step, [params[i] for i in idx], [grads[i] for i in idx], clip, record)
            parts.append((idx, stats))
        return _in_order(parts) if record else None

    def _bucket_foreach(
        self,
        group: dict[str, Any],
        step: int,
        params: list[Tensor],
        grads: list[Tensor],
        clip: Tensor | None,
        record: bool,
    ) -> tuple[Tensor, Tensor, Tensor] | None:
        """One bucket (device, dtype, step count): the CPU kernel where it applies, the
        two-pass Triton kernel on CUDA (``lamb_triton``), the fused Adam kernel for the
        moments on accelerators (``lamb_fused``), else foreach ops."""
        exp_avgs, exp_avg_sqs = self._moments(params)
        adapt = self._adapts(group)
        limit = CPU_CHUNK_ELEMENTS if self.chunk_elements is None else self.chunk_elements
        if limit and lamb_cpu.applies(params, grads, exp_avgs, exp_avg_sqs):
            settings = lamb_cpu.Settings.of(group, step, adapt, record)
            return lamb_cpu.step(settings, (params, grads, exp_avgs, exp_avg_sqs), clip, limit, self._scratch)
        if lamb_triton.applies(params, grads, exp_avgs, exp_avg_sqs):
            bucket = lamb_triton.Bucket(group, step, (params, grads, exp_avgs, exp_avg_sqs), clip)
            if not (adapt or record):
                bucket.one_pass()
                return None
            sums = bucket.first_pass()
            return self._finish_bucket(group, bucket, sums[:, 1].sqrt(), sums[:, 0].sqrt())
        us, scale, decay = _directions(group, step, params, grads, exp_avgs, exp_avg_sqs, clip)
        if not (adapt or record):
            _apply(params, us, None, decay, -group["lr"] * scale)  # no ratio to wait for: one pass
            return None
        norms = torch._foreach_norm([*params, *us])  # one call for both
        w_norm, u_norm = torch.stack(norms[: len(params)]), torch.stack(norms[len(params) :])
        return self._adapt_and_apply(group, adapt, params, us, (w_norm, u_norm), scale, decay)

    def _adapt_and_apply(
        self,
        group: dict[str, Any],
        adapt: bool,
        params: list[Tensor],
        us: list[Tensor],
        norms: tuple[Tensor, Tensor],
        scale: float,
        decay: float,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The trust ratios from ``norms`` (of the weights before decay and of ``us``, with
        ``u = scale * us``), then the step; returns ``(ratio, ||x||, ||u||)`` per tensor.

        Decoupled decay scales the weights by a scalar, so the decayed weight norm is
        ``decay * ||x||`` and the decay itself is done in the same pass as the step."""
        lr = group["lr"]
        ratio, w_norm, u_norm = self._trust(group, adapt, norms[0], norms[1] * scale, decay)
        sizes = list((ratio * (-lr * scale)).to(params[0].dtype).unbind(0)) if adapt else None
        _apply(params, us, sizes, decay, -lr * scale)
        return ratio, w_norm, u_norm

    def _trust(self, group: dict[str, Any], adapt: bool, x_norm: Tensor, u_norm: Tensor, decay: float) -> tuple[Tensor, Tensor, Tensor]:
        """``(ratio, ||x||, ||u||)`` per tensor from the norms of the weights before decay
        and of the updates: ``||x||`` after decoupled decay (a scalar factor), ratio 1
        without ``adapt``."""
        w_norm = x_norm * abs(decay)
        ratio = self._ratio(group, w_norm, u_norm) if adapt else torch.ones_like(w_norm)
        return ratio, w_norm, u_norm

    def _finish_bucket(
        self, group: dict[str, Any], bucket: lamb_triton.Bucket, x_norm: Tensor, u_norm: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The Triton path's second pass once the whole tensors' norms are known; returns
        ``(ratio, ||x||, ||u||)`` per tensor."""
        adapt = self._adapts(group)
        ratio, w_norm, u_norm = self._trust(group, adapt, x_norm, u_norm, bucket.decay)
        bucket.finish(ratio if adapt else None)
        return ratio, w_norm, u_norm

    def _step_sharded(
        self, groups: list[_Collected], shard_group: Any, clip: Tensor | None, record: bool
    ) -> list[tuple[Tensor, Tensor, Tensor] | None]:
        """The foreach step on FSDP2-sharded parameters: each rank updates its slices,
        and every norm of the step (weights and updates of all groups) is summed across
        the shard group in one collective (``largebatch.optim.sharded``); ``clip`` from
        ``_clip_coefficient`` took a second one when ``max_grad_norm`` clips inside the
        step. Same arithmetic as the foreach path, so the trust ratios are the unsharded
        optimizer's."""
        reduction = sharded.NormReduction(shard_group)
        pending = [self._sharded_directions(entry, clip, record, reduction) if entry.params else [] for entry in groups]
        if any(part.norms is not None for parts in pending for part in parts):
            reduction.reduce()
        results: list[tuple[Tensor, Tensor, Tensor] | None] = []
        for entry, parts in zip(groups, pending):
            done = [(part.idx, self._sharded_apply(entry.group, part, reduction)) for part in parts]
            results.append(_in_order(done) if record and parts else None)  # type: ignore[arg-type]
        return results

    def _sharded_directions(
        self, entry: _Collected, clip: Tensor | None, record: bool, reduction: sharded.NormReduction
    ) -> list[_ShardedPart]:
        """Per step count, the moments advanced and the update directions of this rank's
        slices, their norms queued in ``reduction``."""
        group, params = entry.group, entry.params
        buckets: dict[int, list[int]] = {}
        for i, step in enumerate(self._advance(params)):
            buckets.setdefault(step, []).append(i)
        parts = []
        for step, idx in buckets.items():
            ps = sharded.locals_of(params[i] for i in idx)
            gs = sharded.locals_of(entry.grads[i] for i in idx)
            ms, vs = (sharded.locals_of(moments) for moments in self._moments(params[i] for i in idx))
            needs_norms = self._adapts(group) or record
            if lamb_triton.applies(ps, gs, ms, vs):  # CUDA: the moments now, the step once the norms are summed
                bucket = lamb_triton.Bucket(group, step, (ps, gs, ms, vs), clip)
                if not needs_norms:
                    bucket.one_pass()
                    continue
                sums = bucket.first_pass()
                norms = (reduction.add_squares(sums[:, 1]), reduction.add_squares(sums[:, 0]))
                parts.append(_ShardedPart(idx, ps, [], 1.0, bucket.decay, norms, bucket))
                continue
            # Dividing in place keeps the step's parameter-sized temporaries at one.
            us, scale, decay = _directions(group, step, ps, gs, ms, vs, clip, in_place=True)
            norms = (reduction.add(ps), reduction.add(us)) if needs_norms else None
            parts.append(_ShardedPart(idx, ps, us, scale, decay, norms))
        return parts

    def _sharded_apply(
        self, group: dict[str, Any], part: _ShardedPart, reduction: sharded.NormReduction
    ) -> tuple[Tensor, Tensor, Tensor] | None:
        """The step of one part, once the norms are reduced; its statistics, if it had norms."""
        if part.norms is None:
            _apply(part.params, part.us, None, part.decay, -group["lr"] * part.scale)
            return None
        norms = reduction.norms(part.norms[0]), reduction.norms(part.norms[1])
        if part.bucket is not None:
            return self._finish_bucket(group, part.bucket, norms[0], norms[1])
        return self._adapt_and_apply(group, self._adapts(group), part.params, part.us, norms, part.scale, part.decay)


class _Collected(NamedTuple):
    """A group's parameters that have gradients, their gradients and names."""

    group: dict[str, Any]
    params: list[Tensor]
    grads: list[Tensor]
    names: list[str]


class _ShardedPart(NamedTuple):
    """One step count's slices of a group, between their directions and their step."""

    idx: list[int]  # the tensors' indices within the group
    params: list[Tensor]
    us: list[Tensor]
    scale: float
    decay: float
    norms: tuple[int, int] | None  # NormReduction handles of the weights and of us
    bucket: lamb_triton.Bucket | None = None  # the Triton path's step, between its passes (us is then empty)


def bias_scalars(group: dict[str, Any], step: int) -> tuple[float, float]:
    """``(scale, eps')`` with ``m_hat / (sqrt(v_hat) + eps) == scale * m / (sqrt(v) + eps')``:
    the bias corrections as scalars instead of passes over every tensor."""
    if not group["bias_correction"]:
        return 1.0, group["eps"]
    beta1, beta2 = group["betas"]
    bc1, bc2_sqrt = 1 - beta1**step, math.sqrt(1 - beta2**step)
    return bc2_sqrt / bc1, group["eps"] * bc2_sqrt


def _directions(
    group: dict[str, Any],
    step: int,
    ps: list[Tensor],
    gs: list[Tensor],
    ms: list[Tensor],
    vs: list[Tensor],
    clip: Tensor | None,
    in_place: bool = False,
) -> tuple[list[Tensor], float, float]:
    """Advance the moments; returns ``(us, scale, decay)``: the update is ``u = scale * us``
    and decoupled weight decay multiplies the weights by ``decay``.

    ``in_place`` divides tensor by tensor into the square roots: one parameter-sized
    temporary instead of two, for a kernel launch per tensor instead of one. Where
    ``lamb_fused.applies`` (CUDA), torch's fused Adam kernel does the work, scale 1."""
    if lamb_fused.applies(ps, gs, ms, vs):
        us, decay = lamb_fused.directions(group, step, ps, gs, ms, vs, clip)
        return us, 1.0, decay
    beta1, beta2 = group["betas"]
    lr, wd, decoupled = group["lr"], group["weight_decay"], group["decoupled_weight_decay"]
    if clip is not None:
        gs = torch._foreach_mul(gs, clip)
    scale, eps = bias_scalars(group, step)
    torch._foreach_lerp_(ms, gs, 1 - beta1)
    torch._foreach_mul_(vs, beta2)
    torch._foreach_addcmul_(vs, gs, gs, value=1 - beta2)
    us = torch._foreach_sqrt(vs)
    torch._foreach_add_(us, eps)
    if in_place:
        for u, m in zip(us, ms):
            torch.div(m, u, out=u)
    else:
        us = torch._foreach_div(ms, us)
    if not decoupled and wd != 0:
        torch._foreach_add_(us, ps, alpha=wd / scale)  # u = scale * (us + wd / scale * x)
    return us, scale, 1 - lr * wd if decoupled else 1.0


def _apply(params: list[Tensor], us: list[Tensor], sizes: list[Tensor] | None, decay: float, step_size: float) -> None:
    """``x = decay * x + size * u`` per tensor, with ``step_size`` for every tensor where ``sizes`` is None."""
    if decay != 1.0:
        torch._foreach_mul_(params, decay)
    if sizes is None:
        torch._foreach_add_(params, us, alpha=step_size)
    else:
        torch._foreach_addcmul_(params, us, sizes)


def _in_order(parts: list[tuple[list[int], Any]]) -> tuple[Tensor, Tensor, Tensor]:
    """Per-tensor statistics of a group's buckets ``(indices, (ratio, ||x||, ||u||))``,
    back in the group's order."""
    if len(parts) == 1:
        return parts[0][1]
    device = parts[0][1][0].device
    order = torch.tensor([i for idx, _ in parts for i in idx]).argsort().to(device)
    return tuple(torch.cat([stats[k].to(device) for _, stats in parts])[order] for k in range(3))  # type: ignore[return-value]


def _stats_by_name(groups: list[_Collected], results: list[Any]) -> dict[str, dict[str, Any]]:
    """``last_stats``: per group with gradients, its parameters' names and statistics."""
    stats: dict[str, dict[str, Any]] = {}
    for index, (entry, result) in enumerate(zip(groups, results)):
        if entry.params:
            ratio, w_norm, u_norm = result
            stats[entry.group.get("name", f"group{index}")] = {
                "param_names": entry.names,
                "trust_ratio": ratio,
                "weight_norm": w_norm,
                "update_norm": u_norm,
            }
    return stats
