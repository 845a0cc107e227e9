"""LAMB's update written once: its arithmetic, the kernels' interface, the portable kernels.

Paper: You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76
minutes", ICLR 2020, arXiv:1904.00962, Algorithm 2. Per parameter tensor ``x``:

    m = b1 * m + (1 - b1) * g                  v = b2 * v + (1 - b2) * g^2
    m_hat = m / (1 - b1^t)                     v_hat = v / (1 - b2^t)
    r = m_hat / (sqrt(v_hat) + eps)            u = r + wd * x
    x = x - lr * phi(||x||) / ||u|| * u        (ratio = 1 when ||x|| or ||u|| is 0)

with ``phi`` the identity (``largebatch.optim.lamb`` has the variants' switches). Every
kernel takes its scalars from ``Settings`` (the bias corrections folded into two,
``r = scale * m / (sqrt(v) + eps')``), its moments from ``advance_moments`` or from
torch's fused Adam kernel (``fused_directions``), its ratios from ``trust`` and its step
from ``apply``; the Triton kernel (``lamb_triton``) computes the same lines per element.
A ``Kernel`` takes a bucket (tensors of one device, dtype and step count) that ``applies``
accepts: ``begin`` advances the moments and returns the step's second half (``Pending``),
which gives the norms and ``finish``es with the trust ratios; the sharded step sums every
bucket's norms across ranks in between. On a GPU the step is bound by memory traffic:
``AdamW(fused=True)`` moves 7 parameter-sized streams per element, ``MultiTensor`` about
26, ``FusedAdam`` 14, the Triton kernel 10.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from largebatch.optim.layerwise import Stats

Tensors = tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor]]  # params, grads, exp_avgs, exp_avg_sqs
# Devices whose buckets ``FusedAdam`` takes (where the Triton kernel does not), and its dtypes.
FUSED_DEVICES = ("cuda",)
_FUSED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


class Settings(NamedTuple):
    """One bucket's hyperparameters: its group's at one step count."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    corrections: tuple[float, float]  # 1 - b1^t and 1 - b2^t; (1, 1) without bias correction
    step: float  # the fused Adam kernel's step count; inf turns its bias correction off
    coupled_wd: float  # u = r + coupled_wd * x (0 with decoupled decay)
    decay: float  # x = decay * x before the step: 1 - lr * wd with decoupled decay
    bounds: tuple[float | None, float | None] | None  # the ratio's clamps; None: ratio 1
    record: bool  # statistics were asked for

    @classmethod
    def of(cls, group: dict[str, Any], step: int, adapt: bool, record: bool) -> Settings:
        (b1, b2), lr, wd, decoupled = group["betas"], group["lr"], group["weight_decay"], group["decoupled_weight_decay"]
        corrected, bounds = group["bias_correction"], (group["min_trust_ratio"], group["max_trust_ratio"]) if adapt else None
        corrections = (1 - b1**step, 1 - b2**step) if corrected else (1.0, 1.0)
        count = float(step) if corrected else math.inf
        return cls(
            lr, b1, b2, group["eps"], corrections, count, 0.0 if decoupled else wd, 1 - lr * wd if decoupled else 1.0, bounds, record
        )

    @property
    def needs_norms(self) -> bool:
        return self.bounds is not None or self.record

    @property
    def folded(self) -> tuple[float, float]:
        """``(scale, eps')`` with ``m_hat / (sqrt(v_hat) + eps) == scale * m / (sqrt(v) + eps')``."""
        root = math.sqrt(self.corrections[1])
        return root / self.corrections[0], self.eps * root


def trust(settings: Settings, x_norm: Tensor, u_norm: Tensor) -> Stats:
    """``(ratio, ||x||, ||u||)`` from the norms of the weights before decoupled decay (a scalar
    factor: ``||decay * x|| = |decay| ||x||``) and of the updates: the trust ratios
    ``||x|| / ||u||`` clamped to the bounds, 1 where a norm is 0; 1 without bounds."""
    w_norm = x_norm if settings.decay == 1.0 else x_norm * abs(settings.decay)
    if settings.bounds is None:
        return torch.ones_like(w_norm), w_norm, u_norm
    ratio = w_norm / u_norm if settings.bounds == (None, None) else (w_norm / u_norm).clamp(*settings.bounds)
    return torch.where(torch.minimum(w_norm, u_norm) > 0, ratio, 1.0), w_norm, u_norm  # false for a NaN norm too


def contiguous(tensors: Tensors, devices: tuple[str, ...], dtypes: tuple[torch.dtype, ...]) -> bool:
    """Whether a bucket's tensors are contiguous, of one dtype among ``dtypes``, on a device type among ``devices``."""
    first = tensors[0][0]
    if first.device.type not in devices or first.dtype not in dtypes:
        return False
    return all(t.dtype == first.dtype and t.is_contiguous() for ts in tensors for t in ts)


def clipped(grads: list[Tensor], clip: Tensor | None, out: list[Tensor] | None = None) -> list[Tensor]:
    """The gradients times the clipping coefficient, as new tensors or into ``out`` (``.grad`` stays as it was)."""
    if clip is None:
        return grads
    if out is None:
        return list(torch._foreach_mul(grads, clip))
    torch._foreach_copy_(out, grads)
    torch._foreach_mul_(out, clip)
    return out


def advance_moments(settings: Settings, ms: list[Tensor], vs: list[Tensor], gs: list[Tensor]) -> None:
    torch._foreach_lerp_(ms, gs, 1 - settings.beta1)
    torch._foreach_mul_(vs, settings.beta2)
    torch._foreach_addcmul_(vs, gs, gs, value=1 - settings.beta2)


def directions(ms: list[Tensor], vs: list[Tensor], eps: float, ps: list[Tensor], wd: float, in_place: bool = False) -> list[Tensor]:
    """``m / (sqrt(v) + eps) + wd * x`` per tensor, as new tensors; ``in_place`` divides tensor
    by tensor into the roots: one parameter-sized temporary instead of two, more launches."""
    us = list(torch._foreach_sqrt(vs))
    torch._foreach_add_(us, eps)
    if in_place:
        for u, m in zip(us, ms):
            torch.div(m, u, out=u)
    else:
        us = list(torch._foreach_div(ms, us))
    if wd != 0:
        torch._foreach_add_(us, ps, alpha=wd)
    return us


def fused_directions(settings: Settings, tensors: Tensors, us: list[Tensor] | None = None, count: Tensor | None = None) -> list[Tensor]:
    """Advance the moments and return ``u = r + coupled_wd * x`` (into ``us`` if given) from
    torch's fused Adam kernel (``torch.optim.Adam(fused=True)``'s): given ``coupled_wd * x``
    as its "parameter" and ``lr = -1`` it adds ``r``, in one pass with the moments. Its step
    count is a 0-dim float32 tensor (``count``, else filled on the device): nothing is read back."""
    ps, gs, ms, vs = tensors
    wd = settings.coupled_wd
    if us is None:
        us = [torch.empty_like(p) for p in ps] if wd == 0 else list(torch._foreach_mul(ps, wd))
    elif wd != 0:
        for u, p in zip(us, ps):
            torch.mul(p, wd, out=u)
    if wd == 0:
        torch._foreach_zero_(us)
    count = torch.full((), settings.step, dtype=torch.float32, device=ps[0].device) if count is None else count
    steps = [count] * len(us)
    torch._fused_adam_(
        us, gs, ms, vs, [], steps, lr=-1.0, beta1=settings.beta1, beta2=settings.beta2, weight_decay=0.0,
        eps=settings.eps, amsgrad=False, maximize=False,
    )  # fmt: skip
    return us


def apply(params: list[Tensor], us: list[Tensor], sizes: list[Any] | None, decay: float, step_size: float) -> None:
    """``x = decay * x + size * u`` per tensor (``sizes``: 0-dim tensors or floats; None: ``step_size``)."""
    if decay != 1.0:
        torch._foreach_mul_(params, decay)
    if sizes is None:
        torch._foreach_add_(params, us, alpha=step_size)
    elif isinstance(sizes[0], Tensor):
        torch._foreach_addcmul_(params, us, sizes)
    else:
        for p, u, size in zip(params, us, sizes):
            p.add_(u, alpha=size)


class Pending:
    """A bucket's step between its halves. A kernel implements ``finish`` and one of
    ``norms`` (of the weights before decay and of the updates held here) and ``squares``
    (the local sums of squares a sharded step adds across ranks)."""

    scale = 1.0  # the update is ``scale`` times what ``norms`` measured

    def norms(self) -> tuple[Tensor, Tensor]:
        x, u = self.squares()
        return x.sqrt(), u.sqrt()

    def squares(self) -> tuple[Tensor, Tensor]:
        x, u = self.norms()
        return x.square(), u.square()

    def finish(self, ratios: Tensor | None) -> None:
        """The step with per-tensor trust ratios (None: ratio 1)."""
        raise NotImplementedError

    def complete(self, settings: Settings, x_norm: Tensor, u_norm: Tensor) -> Stats:
        """The step, given the whole tensors' norms; returns the statistics."""
        stats = trust(settings, x_norm, u_norm * self.scale)
        self.finish(stats[0] if settings.bounds is not None else None)
        return stats


class Kernel:
    """One way to run the update on a bucket; ``largebatch.optim.lamb.choose`` picks it.
    ``reads_skip``: it was given the step's ``found_inf`` flag and leaves the bucket as it
    was where the flag is non-zero by itself; around the others the caller keeps the
    bucket's tensors (``largebatch.optim.layerwise.Kept``)."""

    reads_skip = False

    def applies(self, tensors: Tensors) -> bool:
        return True

    def begin(self, settings: Settings, tensors: Tensors, clip: Tensor | None) -> Pending:
        """Advance the moments, the gradients times ``clip`` (a 0-dim tensor) when given."""
        raise NotImplementedError(f"{type(self).__name__} takes whole steps only")

    def step(self, settings: Settings, tensors: Tensors, clip: Tensor | None) -> Stats | None:
        """The bucket's step; its statistics when ``settings.record``."""
        pending = self.begin(settings, tensors, clip)
        if not settings.needs_norms:
            pending.finish(None)  # no ratio to wait for
            return None
        stats = pending.complete(settings, *pending.norms())
        return stats if settings.record else None


class Reference(Kernel):
    """Algorithm 2 tensor by tensor, the moments bias-corrected as written: the reference
    (``foreach=False``) the kernels are tested against, on any device (on FSDP2's DTensors
    it reduces once per norm). Runs in the CPU tests."""

    def step(self, settings: Settings, tensors: Tensors, clip: Tensor | None) -> Stats | None:
        stats = []
        decayed = settings._replace(decay=1.0)  # the norms are taken after the decay
        for p, g, m, v in zip(*tensors):
            advance_moments(settings, [m], [v], clipped([g], clip))
            m_hat, v_hat = m / settings.corrections[0], v / settings.corrections[1]
            (update,) = directions([m_hat], [v_hat], settings.eps, [p], settings.coupled_wd)
            if settings.decay != 1.0:
                p.mul_(settings.decay)
            if settings.needs_norms:
                stats.append(trust(decayed, torch.linalg.vector_norm(p), torch.linalg.vector_norm(update)))
            if settings.bounds is not None:
                p.add_(update * (-settings.lr * stats[-1][0]))
            else:
                p.add_(update, alpha=-settings.lr)
        return tuple(torch.stack(column) for column in zip(*stats)) if settings.record else None  # type: ignore[return-value]


class Directions(Pending):
    """The multi-tensor step between its halves: ``u = scale * us``."""

    def __init__(self, settings: Settings, params: list[Tensor], us: list[Tensor], scale: float) -> None:
        self.settings, self.params, self.us, self.scale = settings, params, us, scale

    def norms(self) -> tuple[Tensor, Tensor]:
        norms = torch._foreach_norm([*self.params, *self.us])  # one call for both
        return torch.stack(norms[: len(self.params)]), torch.stack(norms[len(self.params) :])

    def finish(self, ratios: Tensor | None) -> None:
        step_size = -self.settings.lr * self.scale
        sizes = None if ratios is None else list((ratios * step_size).to(self.params[0].dtype).unbind(0))
        apply(self.params, self.us, sizes, self.settings.decay, step_size)


class MultiTensor(Kernel):
    """``torch._foreach_*`` ops over any bucket, the bias corrections folded, both norms from
    one ``_foreach_norm``, the ratios in one vectorised op; nothing is read back to the host.
    Runs in the CPU tests; on an NVIDIA H200 (torch 2.11, 2026-11-26) 2.95x
    ``AdamW(fused=True)``'s step on ViT-B/16."""

    def __init__(self, in_place: bool = False) -> None:
        self.in_place = in_place

    def begin(self, settings: Settings, tensors: Tensors, clip: Tensor | None) -> Pending:
        ps, gs, ms, vs = tensors
        scale, eps = settings.folded
        advance_moments(settings, ms, vs, clipped(gs, clip))
        us = directions(ms, vs, eps, ps, settings.coupled_wd / scale, self.in_place)  # u = scale * (us + wd / scale * x)
        return Directions(settings, ps, us, scale)


class FusedAdam(Kernel):
    """The moments and ``r`` from torch's fused Adam kernel over whole tensors, the norms and
    the step as ``MultiTensor``'s, for contiguous buckets of one dtype on ``FUSED_DEVICES``.
    Ran on an NVIDIA H200 (torch 2.11, Triton 3.6, 2026-11-26) in ``pytest -m gpu``, which
    passed, as the Triton kernel's reference, and at 2.52x ``AdamW(fused=True)``'s step on
    ViT-B/16. The tests run it on the CPU."""

    def applies(self, tensors: Tensors) -> bool:
        return hasattr(torch, "_fused_adam_") and contiguous(tensors, FUSED_DEVICES, _FUSED_DTYPES)

    def begin(self, settings: Settings, tensors: Tensors, clip: Tensor | None) -> Pending:
        ps, gs, ms, vs = tensors
        return Directions(settings, ps, fused_directions(settings, (ps, clipped(gs, clip), ms, vs)), 1.0)
