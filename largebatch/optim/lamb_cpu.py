"""LAMB's kernel for the CPU: cache-sized chunks on torch's fused Adam kernel.

On the CPU, foreach ops are loops of ordinary kernels, and a whole-step temporary the size
of the parameters costs more in page faults than the arithmetic. This kernel walks the
tensors in chunks of at most ``limit`` elements (a larger tensor is cut into flat pieces
whose norms are summed back) and updates each window of whole tensors as soon as its norms
are known, backwards, while its pieces are still in cache. Per chunk, torch's fused Adam
kernel computes the moments and ``r`` in one pass (``lamb_update.fused_directions``) into a
buffer kept between steps; the step sizes come from norms already in host memory (no
device sync). The kernel is private (``torch._fused_adam_``): ``kernel_usable`` probes it
once per dtype. The CPU's default: runs in CI (against the paper's update, and against the
multi-tensor kernel), timed by ``bench/lamb_step.py``.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from largebatch.optim.lamb_update import Kernel, Settings, Tensors, apply, clipped, contiguous, fused_directions, trust
from largebatch.optim.layerwise import Stats

# Elements per chunk: the five float32 streams of a chunk (10 MiB) stay in a server L3;
# 256Ki to 1Mi measured within noise of each other on ViT-B (bench/lamb_step.py).
CPU_CHUNK_ELEMENTS = 512 * 1024
DTYPES = (torch.float32, torch.float64)
Chunk = tuple[list[Tensor], ...]  # (params, grads, exp_avgs, exp_avg_sqs), whole tensors or flat pieces
Buffers = dict[tuple[torch.dtype, int], Tensor]  # by dtype and slot


@functools.cache
def kernel_usable(dtype: torch.dtype) -> bool:
    """Whether torch's fused Adam kernel exists on the CPU for ``dtype`` (of the parameters,
    gradients and moments) and adds ``r`` to its parameter as expected, probed on two numbers."""
    if dtype not in DTYPES or not hasattr(torch, "_fused_adam_"):
        return False
    grad, m, v = torch.tensor([1.0, -2.0], dtype=dtype), torch.zeros(2, dtype=dtype), torch.zeros(2, dtype=dtype)
    probe = Settings(
        lr=0.0, beta1=0.5, beta2=0.75, eps=0.0, corrections=(0.5, 0.25), step=1.0, coupled_wd=0.0, decay=1.0, bounds=None, record=False
    )
    try:
        (update,) = fused_directions(probe, ([grad], [grad], [m], [v]))
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    # After one step m_hat = g and v_hat = g^2, so r = sign(g).
    return torch.allclose(update, torch.tensor([1.0, -1.0], dtype=dtype), rtol=0, atol=1e-6)


class CpuChunks(Kernel):
    """The kernel, in chunks of at most ``limit`` elements in ``buffers`` (the optimizer's),
    for contiguous CPU tensors (the pieces are views) of a dtype ``kernel_usable`` accepts."""

    def __init__(self, limit: int, buffers: Buffers) -> None:
        self.limit, self.buffers = limit, buffers

    def applies(self, tensors: Tensors) -> bool:
        return contiguous(tensors, ("cpu",), DTYPES) and kernel_usable(tensors[0][0].dtype)

    def _buffer(self, dtype: torch.dtype, size: int, slot: int) -> Tensor:
        if (dtype, slot) not in self.buffers or self.buffers[dtype, slot].numel() < size:
            self.buffers[dtype, slot] = torch.empty(size, dtype=dtype)
        return self.buffers[dtype, slot]

    def step(self, settings: Settings, tensors: Tensors, clip: Tensor | None) -> Stats | None:
        windows = plan_windows(*tensors, limit=self.limit)
        dtype = tensors[0][0].dtype
        buffer = self._buffer(dtype, max(sum(p.numel() for ps, *_ in window for p in ps) for window in windows), 0)
        clip_buffer = self._buffer(dtype, self.limit, 1) if clip is not None else None
        count = torch.tensor(settings.step)  # the fused kernel's step count, made once
        results = [_step_window(settings, window, buffer, clip, clip_buffer, count) for window in windows]
        if not settings.record:
            return None
        return tuple(torch.cat([r[k] for r in results]).to(dtype) for k in range(3))  # type: ignore[index,return-value]


def _step_window(
    settings: Settings, window: list[Chunk], buffer: Tensor, clip: Tensor | None, clip_buffer: Tensor | None, count: Tensor
) -> Stats | None:
    """Per chunk, the kernel and the norms while the chunk is in cache; then the step,
    backwards. Returns the window's statistics (float64), or None when no norms were needed."""
    offset = 0
    x_parts: list[Tensor] = []
    u_parts: list[Tensor] = []
    updates: list[list[Tensor]] = []
    for ps, gs, ms, vs in window:
        us = _views(buffer, ps, offset)
        offset += sum(u.numel() for u in us)
        if clip is not None:
            gs = clipped(gs, clip, _views(clip_buffer, gs))
        fused_directions(settings, (ps, gs, ms, vs), us, count)
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
    stats = trust(settings, *(_whole(parts, len(window) > 1) for parts in (x_parts, u_parts)))
    sizes = [ratio * -settings.lr for ratio in stats[0].tolist()] if settings.bounds is not None else None
    # Backwards: the pieces touched last are the ones still in cache. A window of one chunk
    # holds its tensors whole; one of several, the pieces of a single tensor.
    for (ps, *_), us in reversed(list(zip(window, updates))):
        apply(ps, us, sizes[: len(ps)] if sizes is not None else None, settings.decay, -settings.lr)
    return stats


def _whole(norms: list[Tensor], pieces: bool) -> Tensor:
    """Whole tensors' norms, in float64, from theirs or from one tensor's ``pieces``' (the
    squares added in order, as Python floats)."""
    if not pieces:
        return torch.stack(norms).double()
    return torch.tensor([math.sqrt(sum(n * n for n in torch.stack(norms).tolist()))], dtype=torch.float64)


def plan_windows(*tensors: list[Tensor], limit: int) -> list[list[Chunk]]:
    """The bucket's tensors ``(params, grads, exp_avgs, exp_avg_sqs)`` in windows of chunks of
    at most ``limit`` elements: a tensor larger than ``limit`` is a window of flat pieces of
    ``limit`` elements, one chunk each; smaller tensors are packed whole into windows of one chunk."""
    windows: list[list[Chunk]] = []
    packed: list[tuple[Tensor, ...]] = []  # rows (param, grad, exp_avg, exp_avg_sq) of the next window
    size = 0
    for row in zip(*tensors):
        numel = row[0].numel()
        if packed and size + numel > limit:
            windows.append([tuple(map(list, zip(*packed)))])
            packed, size = [], 0
        if numel > limit:
            windows.append([tuple([t] for t in piece) for piece in zip(*(t.view(-1).split(limit) for t in row))])
        else:
            packed.append(row)
            size += numel
    if packed:
        windows.append([tuple(map(list, zip(*packed)))])
    return windows


def _views(buffer: Tensor, like: list[Tensor], offset: int = 0) -> list[Tensor]:
    """Consecutive views of ``buffer`` from ``offset`` on, shaped like ``like``."""
    sizes = [t.numel() for t in like]
    return [piece.view(t.shape) for piece, t in zip(buffer[offset : offset + sum(sizes)].split(sizes), like)]
