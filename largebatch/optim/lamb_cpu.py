"""LAMB's kernel for the CPU: cache-sized chunks on torch's fused Adam kernel.

On the CPU, foreach ops are loops of ordinary kernels, and a whole-step temporary the size
of the parameters costs more in page faults than the arithmetic. This kernel walks the
tensors in chunks of at most ``limit`` elements (a larger tensor is cut into flat pieces
whose norms are summed back) and updates each window of whole tensors as soon as its norms
are known, backwards, while its pieces are still in cache. Per chunk, torch's fused Adam
kernel computes the moments and ``r`` in one pass (``lamb_update.fused_directions``) into a
reusable buffer; the step sizes come from norms already in host memory (no device sync).
The kernel is private (``torch._fused_adam_``): ``kernel_usable`` probes it once per dtype,
and where it or ``applies`` says no, ``largebatch.optim.lamb.choose`` picks the plain
multi-tensor kernel, the same steps to rounding. The CPU's default: runs in CI (against the
paper's update, and against the multi-tensor kernel), timed by ``bench/lamb_step.py``.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
from torch import Tensor

from largebatch.optim.lamb_update import Kernel, Settings, Tensors, apply, fused_directions, trust
from largebatch.optim.layerwise import Stats

# Elements per chunk: the five float32 streams of a chunk (10 MiB) stay in a server L3;
# 256Ki to 1Mi measured within noise of each other on ViT-B (bench/lamb_step.py).
CPU_CHUNK_ELEMENTS = 512 * 1024


@functools.cache
def kernel_usable(dtype: torch.dtype) -> bool:
    """Whether torch's fused Adam kernel exists on the CPU for ``dtype`` (of the parameters,
    gradients and moments) and adds ``r`` to its parameter as expected, probed on two numbers."""
    if dtype not in (torch.float32, torch.float64) or not hasattr(torch, "_fused_adam_"):
        return False
    grad, moments = torch.tensor([1.0, -2.0], dtype=dtype), [torch.zeros(2, dtype=dtype) for _ in range(2)]
    probe = Settings(
        lr=0.0, beta1=0.5, beta2=0.75, eps=0.0, corrections=(0.5, 0.25), step=1.0, coupled_wd=0.0, decay=1.0, bounds=None, record=False
    )
    try:
        (update,) = fused_directions(probe, [grad], [grad], *([m] for m in moments))
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    # After one step m_hat = g and v_hat = g^2, so r = sign(g).
    return torch.allclose(update, torch.tensor([1.0, -1.0], dtype=dtype), rtol=0, atol=1e-6)


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


class CpuChunks(Kernel):
    """The kernel, in chunks of at most ``limit`` elements in ``scratch``'s buffers (the optimizer's)."""

    def __init__(self, limit: int, scratch: Scratch) -> None:
        self.limit, self.scratch = limit, scratch

    def applies(self, tensors: Tensors) -> bool:
        """Contiguous CPU tensors (the pieces are views) of a dtype ``kernel_usable`` accepts."""
        first = tensors[0][0]
        return first.device.type == "cpu" and kernel_usable(first.dtype) and all(t.is_contiguous() for ts in tensors for t in ts)

    def step(self, settings: Settings, tensors: Tensors, clip: Tensor | None) -> Stats | None:
        windows = plan_windows(*tensors, self.limit)
        dtype = tensors[0][0].dtype
        buffer = self.scratch.get(dtype, max(w.numel for w in windows))
        clip_buffer = self.scratch.get(dtype, self.limit, slot=1) if clip is not None else None
        count = torch.tensor(settings.step)  # the fused kernel's step count, made once
        results = [_step_window(settings, window, buffer, clip, clip_buffer, count) for window in windows]
        if not settings.record:
            return None
        return tuple(torch.cat([r[k] for r in results]).to(dtype) for k in range(3))  # type: ignore[index,return-value]


class _Window(NamedTuple):
    """Whole tensors whose update is applied as soon as their norms are known."""

    chunks: list[tuple[list[Tensor], ...]]  # (params, grads, exp_avgs, exp_avg_sqs) pieces
    owner: list[int]  # for each piece, the index of its tensor within the window
    count: int  # tensors in the window
    numel: int


def _step_window(
    settings: Settings, window: _Window, buffer: Tensor, clip: Tensor | None, clip_buffer: Tensor | None, count: Tensor
) -> Stats | None:
    """Per chunk, the kernel and the norms while the chunk is in cache; then the step,
    backwards. Returns the window's statistics (float64), or None when no norms were needed."""
    offset = 0
    x_parts: list[Tensor] = []
    u_parts: list[Tensor] = []
    updates: list[list[Tensor]] = []
    for ps, gs, ms, vs in window.chunks:
        us = _views(buffer, ps, offset)
        offset += sum(u.numel() for u in us)
        if clip is not None:
            gs = _clipped(gs, clip, clip_buffer)
        fused_directions(settings, ps, gs, ms, vs, us, count)
        if not settings.needs_norms:
            apply(ps, us, None, settings.decay, -settings.lr)  # no ratio to wait for: one pass
            continue
        norms = torch._foreach_norm([*ps, *us])  # one call for both
        x_parts.extend(norms[: len(ps)])
        u_parts.extend(norms[len(ps) :])
        updates.append(us)
    if not settings.needs_norms:
        return None
    # in float64, the precision of the Python floats the step sizes become
    stats = trust(settings, *(_whole(parts, window) for parts in (x_parts, u_parts)))
    ratios = stats[0].tolist() if settings.bounds is not None else None
    sizes = [ratios[i] * -settings.lr for i in window.owner] if ratios is not None else None
    # Backwards: the pieces touched last are the ones still in cache.
    end = len(window.owner)
    for (ps, *_), us in reversed(list(zip(window.chunks, updates))):
        apply(ps, us, sizes[end - len(ps) : end] if sizes is not None else None, settings.decay, -settings.lr)
        end -= len(ps)
    return stats


def _whole(norms: list[Tensor], window: _Window) -> Tensor:
    """Whole tensors' norms from their pieces', in float64."""
    if len(norms) == window.count:
        return torch.stack(norms).double()
    # one tensor in pieces (``plan_windows``): the squares added in order, as Python floats
    return torch.tensor([math.sqrt(sum(n * n for n in torch.stack(norms).tolist()))], dtype=torch.float64)


def _clipped(grads: list[Tensor], clip: Tensor, buffer: Tensor) -> list[Tensor]:
    """The gradients times ``clip``, in the buffer (``.grad`` is left as it was)."""
    out = _views(buffer, grads)
    torch._foreach_copy_(out, grads)
    torch._foreach_mul_(out, clip)
    return out


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
