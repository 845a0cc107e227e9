"""LAMB's step on the CPU: cache-sized chunks on torch's fused Adam kernel.

On the CPU, foreach ops are loops of ordinary kernels, and a whole-step temporary the
size of the parameters costs more in page faults than the arithmetic. This path walks
the tensors in chunks of ``chunk_elements`` (``CPU_CHUNK_ELEMENTS`` by default): a tensor
above that is cut into flat pieces whose norms are summed back, and each window of whole
tensors is updated as soon as its norms are known, backwards, while its pieces are still
in cache. Per chunk, torch's fused Adam kernel (what ``torch.optim.Adam(fused=True)``
runs) computes the moments and ``r = m_hat / (sqrt(v_hat) + eps)`` in one pass; given
``lr = -1`` it adds ``r`` to its "parameter", here a view of a reusable buffer that
already holds ``wd * x``. The step sizes are Python floats, read from norms that are host
memory already (a memory read on the CPU, not a device sync).

The kernel is private (``torch._fused_adam_``). ``kernel_usable`` probes it once per
dtype and ``applies`` says whether a bucket of tensors can take this path; where it
cannot, ``largebatch.optim.lamb.Lamb`` takes its plain multi-tensor path, whose steps
are the same to rounding.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

# Elements per chunk: the five float32 streams of a chunk (10 MiB) stay in a server L3;
# 256Ki to 1Mi measured within noise of each other on ViT-B (bench/lamb_step.py).
CPU_CHUNK_ELEMENTS = 512 * 1024


@functools.cache
def kernel_usable(dtype: torch.dtype) -> bool:
    """Whether torch's fused Adam kernel exists on the CPU for ``dtype`` and adds ``r``
    to its parameter as this module expects (probed once per dtype on two numbers).

    Args:
        dtype: the dtype of the parameters, gradients and moments.

    Returns:
        ``True`` when this path may run on tensors of ``dtype``.
    """
    if dtype not in (torch.float32, torch.float64) or not hasattr(torch, "_fused_adam_"):
        return False
    update = torch.zeros(2, dtype=dtype)
    grad = torch.tensor([1.0, -2.0], dtype=dtype)
    try:
        torch._fused_adam_(
            [update], [grad], [torch.zeros_like(grad)], [torch.zeros_like(grad)], [], [torch.tensor(1.0)],
            lr=-1.0, beta1=0.5, beta2=0.75, weight_decay=0.0, eps=0.0, amsgrad=False, maximize=False,
        )  # fmt: skip
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    # After one step m_hat = g and v_hat = g^2, so r = sign(g).
    return torch.allclose(update, torch.tensor([1.0, -1.0], dtype=dtype), rtol=0, atol=1e-6)


def applies(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor]) -> bool:
    """Whether a bucket (one device, dtype and step) can take this path: CPU tensors of a
    dtype the kernel handles, all contiguous (the flat pieces are views)."""
    first = params[0]
    if first.device.type != "cpu" or not kernel_usable(first.dtype):
        return False
    return all(t.is_contiguous() for tensors in (params, grads, exp_avgs, exp_avg_sqs) for t in tensors)


class Settings(NamedTuple):
    """One bucket's hyperparameters, as the kernel and the update take them."""

    beta1: float
    beta2: float
    eps: float
    step: Tensor  # the kernel's step count; inf turns bias correction off
    coupled_wd: float  # u = r + coupled_wd * x
    decay: float  # x = decay * x before the step (decoupled weight decay)
    lr: float
    bounds: tuple[float | None, float | None] | None  # trust-ratio clamp; None: ratio 1
    record: bool

    @classmethod
    def of(cls, group: dict[str, Any], step: int, adapt: bool, record: bool) -> Settings:
        beta1, beta2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        decoupled = group["decoupled_weight_decay"]
        return cls(
            beta1=beta1,
            beta2=beta2,
            eps=group["eps"],
            step=torch.tensor(float(step) if group["bias_correction"] else math.inf),
            coupled_wd=0.0 if decoupled else wd,
            decay=1 - lr * wd if decoupled else 1.0,
            lr=lr,
            bounds=(group["min_trust_ratio"], group["max_trust_ratio"]) if adapt else None,
            record=record,
        )

    @property
    def needs_norms(self) -> bool:
        return self.bounds is not None or self.record


class Scratch:
    """Flat buffers kept between steps (not optimizer state): a fresh temporary per
    chunk would cost more in page faults than the arithmetic."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[torch.dtype, int], Tensor] = {}

    def get(self, dtype: torch.dtype, size: int, slot: int = 0) -> Tensor:
        key = (dtype, slot)
        if key not in self._buffers or self._buffers[key].numel() < size:
            self._buffers[key] = torch.empty(size, dtype=dtype)
        return self._buffers[key]


class _Window(NamedTuple):
    """Whole tensors whose update is applied as soon as their norms are known."""

    chunks: list[tuple[list[Tensor], ...]]  # (params, grads, exp_avgs, exp_avg_sqs) pieces
    owner: list[int]  # for each piece, the index of its tensor within the window
    count: int  # tensors in the window
    numel: int


def step(
    settings: Settings,
    tensors: tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor]],
    clip: Tensor | None,
    limit: int,
    scratch: Scratch,
) -> tuple[Tensor, Tensor, Tensor] | None:
    """One LAMB step of a bucket for which ``applies`` holds.

    Args:
        settings: the bucket's hyperparameters.
        tensors: parameters, gradients, first and second moments, in that order.
        clip: the gradients' clipping coefficient (a 0-dim tensor), or ``None``.
        limit: elements per chunk, > 0.
        scratch: the optimizer's buffers.

    Returns:
        Per tensor, the trust ratios, weight norms and update norms when
        ``settings.record``, else ``None``.
    """
    windows = plan_windows(*tensors, limit)
    dtype = tensors[0][0].dtype
    buffer = scratch.get(dtype, max(w.numel for w in windows))
    clip_buffer = scratch.get(dtype, limit, slot=1) if clip is not None else None
    results = [_step_window(settings, window, buffer, clip, clip_buffer) for window in windows]
    if not settings.record:
        return None
    return tuple(torch.tensor([x for r in results for x in r[k]], dtype=dtype) for k in range(3))  # type: ignore[return-value]


def _step_window(
    settings: Settings, window: _Window, buffer: Tensor, clip: Tensor | None, clip_buffer: Tensor | None
) -> tuple[list[float], list[float], list[float]] | None:
    """Per chunk, the kernel and the norms while the chunk is in cache; then the step,
    backwards. Returns the window's ratios and norms, or None when none were needed."""
    offset = 0
    w_parts: list[Tensor] = []
    u_parts: list[Tensor] = []
    updates: list[list[Tensor]] = []
    for ps, gs, ms, vs in window.chunks:
        us = _views(buffer, ps, offset)
        offset += sum(u.numel() for u in us)
        if clip is not None:
            gs = _clipped(gs, clip, clip_buffer)
        _direction(settings, ps, gs, ms, vs, us)
        if not settings.needs_norms:
            _apply(ps, us, None, settings)  # no ratio to wait for: one pass
            continue
        norms = torch._foreach_norm([*ps, *us])  # one call for both
        w_parts.extend(norms[: len(ps)])
        u_parts.extend(norms[len(ps) :])
        updates.append(us)
    if not settings.needs_norms:
        return None
    ratios, w_norms, u_norms = host_ratios(
        settings.bounds,
        torch.stack(w_parts).tolist(),
        torch.stack(u_parts).tolist(),
        window.owner,
        window.count,
        abs(settings.decay),
    )
    sizes = [ratios[i] * -settings.lr for i in window.owner] if settings.bounds is not None else None
    # Backwards: the pieces touched last are the ones still in cache.
    end = len(window.owner)
    for (ps, *_), us in reversed(list(zip(window.chunks, updates))):
        _apply(ps, us, sizes[end - len(ps) : end] if sizes is not None else None, settings)
        end -= len(ps)
    return ratios, w_norms, u_norms


def _clipped(grads: list[Tensor], clip: Tensor, buffer: Tensor) -> list[Tensor]:
    """The gradients times ``clip``, in the buffer (``.grad`` is left as it was)."""
    out = _views(buffer, grads)
    torch._foreach_copy_(out, grads)
    torch._foreach_mul_(out, clip)
    return out


def _direction(settings: Settings, ps: list[Tensor], gs: list[Tensor], ms: list[Tensor], vs: list[Tensor], us: list[Tensor]) -> None:
    """Advance the moments and write ``u = r + coupled_wd * x`` into ``us``."""
    if settings.coupled_wd != 0:
        for u, p in zip(us, ps):
            torch.mul(p, settings.coupled_wd, out=u)
    else:
        torch._foreach_zero_(us)
    torch._fused_adam_(
        us, gs, ms, vs, [], [settings.step] * len(us),
        lr=-1.0, beta1=settings.beta1, beta2=settings.beta2, weight_decay=0.0,
        eps=settings.eps, amsgrad=False, maximize=False,
    )  # fmt: skip


def _apply(ps: list[Tensor], us: list[Tensor], sizes: list[float] | None, settings: Settings) -> None:
    """``x = decay * x + size * u``, with ``size = -lr`` where ``sizes`` is None."""
    if settings.decay != 1.0:
        torch._foreach_mul_(ps, settings.decay)
    if sizes is None:
        torch._foreach_add_(ps, us, alpha=-settings.lr)
        return
    for p, u, size in zip(ps, us, sizes):
        p.add_(u, alpha=size)


def plan_windows(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    limit: int,
) -> list[_Window]:
    """Split the tensors into windows of chunks of at most ``limit`` elements.

    A tensor larger than ``limit`` is cut into flat pieces of ``limit`` elements, one
    chunk each, and forms a window on its own; smaller tensors are packed into chunks of
    whole tensors, one window each.
    """
    windows: list[_Window] = []
    current: tuple[list[Tensor], ...] = ([], [], [], [])
    size = 0

    def flush() -> None:
        nonlocal current, size
        if current[0]:
            count = len(current[0])
            windows.append(_Window([current], list(range(count)), count, size))
        current, size = ([], [], [], []), 0

    for tensors in zip(params, grads, exp_avgs, exp_avg_sqs):
        numel = tensors[0].numel()
        if numel > limit:
            flush()
            pieces = list(zip(*(t.view(-1).split(limit) for t in tensors)))
            chunks = [tuple([t] for t in piece) for piece in pieces]
            windows.append(_Window(chunks, [0] * len(pieces), 1, numel))
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


def host_ratios(
    bounds: tuple[float | None, float | None] | None,
    w_parts: list[float],
    u_parts: list[float],
    owner: list[int],
    count: int,
    decay: float,
) -> tuple[list[float], list[float], list[float]]:
    """Trust ratios, weight norms and update norms of whole tensors in Python floats,
    from the norms of their pieces (``owner``: each piece's tensor); the weight norms
    are scaled by ``decay``. As ``Lamb._ratio``: clamped to ``bounds``, 1 where either
    norm is 0, and 1 everywhere when ``bounds`` is None (no adaptation)."""
    if len(w_parts) == count:
        w_norms, u_norms = list(w_parts), list(u_parts)
    else:
        w_sq, u_sq = [0.0] * count, [0.0] * count
        for i, w, u in zip(owner, w_parts, u_parts):
            w_sq[i] += w * w
            u_sq[i] += u * u
        w_norms, u_norms = [math.sqrt(x) for x in w_sq], [math.sqrt(x) for x in u_sq]
    w_norms = [w * decay for w in w_norms]
    ratios = [1.0] * count
    if bounds is None:
        return ratios, w_norms, u_norms
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
