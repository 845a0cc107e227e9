"""LAMB's kernel for CUDA float32: two passes of one Triton kernel that never writes ``u``.

Pass 1 reads ``x, g, m, v``, writes ``m, v`` and sums ``||u||^2`` and ``||x||^2`` per chunk
without storing ``u``; pass 2 reads ``x, m, v``, computes ``u`` again and writes ``x``: 10
parameter-sized streams per element, about 1.43x ``AdamW(fused=True)``'s 7. Without ratios
or statistics to wait for, one pass does it all (7). Both passes are one kernel with
compile-time switches; a program takes one chunk of one tensor (``CHUNK_ELEMENTS``), so one
launch covers a bucket, the tensors' addresses in a small int64 table made each step. The
per-tensor sums are added up from the chunks' in chunk order (a gather, no atomics: a step
is deterministic), and the ratios come from ``lamb_update.trust`` on the device: nothing is
read back. Per element it computes ``lamb_update``'s lines in their folded form (``_block``).
Given the step's ``found_inf`` flag (``Triton(skip)``), every program of both passes loads
it first and returns at once where it is non-zero: the moments and the weights are not
touched, the norms are 0 and the ratios 1 (written against Triton's documented language;
untested on a GPU so far: run under Triton's interpreter and compiled for sm_80 and sm_90
in the tests).

Ran on an NVIDIA H200 (torch 2.11, Triton 3.6, 2026-11-26): ``pytest -m gpu`` passed
(equal to the fused-Adam kernel and the paper's update on ViT-B-sized tensors), the step at
1.53x ``AdamW(fused=True)``'s on ViT-B/16 (1.62x on an earlier visit). The tests run it on
the CPU through Triton's interpreter against the paper's update, and compile it for sm_80
and sm_90.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import Tensor

from largebatch.optim.lamb_update import Kernel, Pending, Settings, Tensors, contiguous

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - torch's CUDA wheels bring Triton
    triton = None

# Devices whose buckets take this path. With "cpu" added, CPU buckets run the kernel
# through Triton's interpreter when it is on (the tests); never by default.
DEVICES = ("cuda",)
# Elements per program, and per vector operation inside it.
CHUNK_ELEMENTS = 64 * 1024
BLOCK_ELEMENTS = 1024


def _jit(fn):
    return fn if triton is None else triton.jit(fn)


@_jit
def _block(
    x_ptr, g_ptr, m_ptr, v_ptr, offsets, mask, other, clip, size, sum_u, sum_x, beta1, beta2, scale, eps, wd, decay,
    HAS_CLIP: tl.constexpr, MOMENTS: tl.constexpr, NORMS: tl.constexpr, APPLY: tl.constexpr, COUPLED: tl.constexpr,
):  # fmt: skip
    """One vector of elements; ``mask`` and ``other`` are None (whole aligned vectors load and
    store unmasked) but for a chunk's last, partial vector."""
    x = tl.load(x_ptr + offsets, mask=mask, other=other)
    m = tl.load(m_ptr + offsets, mask=mask, other=other)
    v = tl.load(v_ptr + offsets, mask=mask, other=other)
    if MOMENTS:
        g = tl.load(g_ptr + offsets, mask=mask, other=other)
        if HAS_CLIP:
            g = g * clip
        m = beta1 * m + (1.0 - beta1) * g
        v = beta2 * v + (1.0 - beta2) * g * g
        tl.store(m_ptr + offsets, m, mask=mask)
        tl.store(v_ptr + offsets, v, mask=mask)
    u = scale * m / (tl.sqrt(v) + eps)
    if COUPLED:
        u = u + wd * x
    if NORMS:
        sum_u += u * u  # masked lanes hold m = v = x = 0, so u = 0 there
        sum_x += x * x
    if APPLY:
        tl.store(x_ptr + offsets, decay * x + size * u, mask=mask)
    return sum_u, sum_x


@_jit
def _address(table, t, ALIGNED: tl.constexpr):
    """Tensor ``t``'s float32 pointer from an address table; 16-byte aligned if ``ALIGNED``
    (whole vectors then load and store 16 bytes at a time)."""
    pointer = tl.load(table + t).to(tl.pointer_type(tl.float32), bitcast=True)
    if ALIGNED:
        pointer = tl.multiple_of(pointer, 16)
    return pointer


@_jit
def _lamb_kernel(
    x_addrs, g_addrs, m_addrs, v_addrs, numels, chunk_tensor, chunk_start, clip_ptr, size_ptr, partial_ptr, skip_ptr,
    beta1, beta2, scale, eps, wd, decay, step_size,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, HAS_CLIP: tl.constexpr, MOMENTS: tl.constexpr,
    NORMS: tl.constexpr, APPLY: tl.constexpr, COUPLED: tl.constexpr, PER_TENSOR: tl.constexpr,
    ALIGNED: tl.constexpr, HAS_SKIP: tl.constexpr,
):  # fmt: skip
    """One chunk of one tensor: advance the moments (``MOMENTS``), store the chunk's
    ``(sum u^2, sum x^2)`` (``NORMS``), take the step (``APPLY``). Chunks start at
    multiples of ``CHUNK``, itself a multiple of 16. Nothing where ``HAS_SKIP`` and the
    flag at ``skip_ptr`` is non-zero (the partial sums stay as the caller zeroed them)."""
    if HAS_SKIP:
        if tl.load(skip_ptr) != 0.0:
            return
    chunk = tl.program_id(0)
    t = tl.load(chunk_tensor + chunk)
    start = tl.multiple_of(tl.load(chunk_start + chunk), 16)
    count = tl.minimum(tl.load(numels + t) - start, CHUNK)
    x_ptr = _address(x_addrs, t, ALIGNED) + start
    m_ptr = _address(m_addrs, t, ALIGNED) + start
    v_ptr = _address(v_addrs, t, ALIGNED) + start
    g_ptr = x_ptr
    if MOMENTS:
        g_ptr = _address(g_addrs, t, ALIGNED) + start
    clip = 1.0
    if HAS_CLIP:
        clip = tl.load(clip_ptr)
    size = step_size
    if PER_TENSOR:
        size = tl.load(size_ptr + t)
    sum_u = tl.zeros([BLOCK], dtype=tl.float32)
    sum_x = tl.zeros([BLOCK], dtype=tl.float32)
    whole = count // BLOCK * BLOCK
    for offset in range(0, whole, BLOCK):
        offsets = tl.multiple_of(offset, BLOCK) + tl.arange(0, BLOCK)
        sum_u, sum_x = _block(
            x_ptr, g_ptr, m_ptr, v_ptr, offsets, None, None, clip, size, sum_u, sum_x, beta1, beta2, scale,
            eps, wd, decay, HAS_CLIP, MOMENTS, NORMS, APPLY, COUPLED,
        )  # fmt: skip
    if whole < count:
        offsets = whole + tl.arange(0, BLOCK)
        sum_u, sum_x = _block(
            x_ptr, g_ptr, m_ptr, v_ptr, offsets, offsets < count, 0.0, clip, size, sum_u, sum_x, beta1, beta2, scale,
            eps, wd, decay, HAS_CLIP, MOMENTS, NORMS, APPLY, COUPLED,
        )  # fmt: skip
    if NORMS:
        tl.store(partial_ptr + 2 * chunk, tl.sum(sum_u, axis=0))
        tl.store(partial_ptr + 2 * chunk + 1, tl.sum(sum_x, axis=0))


def _kernel():
    """The kernel: compiled for the GPU, or run by Triton's interpreter on CPU tensors
    when ``TRITON_INTERPRET=1`` was set before this module was imported (the tests do)."""
    return _lamb_kernel


def _interpreting() -> bool:
    return triton is not None and bool(triton.knobs.runtime.interpret)


class _Layout:
    """A bucket's chunks on the device: each chunk's tensor and first element, the
    tensors' sizes, a ``[tensors, most chunks]`` gather of the chunk rows (the padding
    points at a zero row) that sums the partials per tensor in chunk order, and a spare
    float for the pointer arguments a pass does not read."""

    def __init__(self, numels: tuple[int, ...], chunk: int, device: torch.device) -> None:
        owner, starts, rows = [], [], []
        for t, numel in enumerate(numels):
            first = len(starts)
            for start in range(0, numel, chunk):
                owner.append(t)
                starts.append(start)
            rows.append(list(range(first, len(starts))))
        self.chunks = len(starts)
        width = max(1, max(len(r) for r in rows))
        pad = [r + [self.chunks] * (width - len(r)) for r in rows]
        self.chunk_tensor = torch.tensor(owner, dtype=torch.int64).to(device)
        self.chunk_start = torch.tensor(starts, dtype=torch.int64).to(device)
        self.numels = torch.tensor(numels, dtype=torch.int64).to(device)
        self.gather = torch.tensor(pad, dtype=torch.int64).to(device)
        self.spare = torch.zeros(1, dtype=torch.float32, device=device)


_layout = functools.lru_cache(maxsize=64)(_Layout)  # the layouts of recent buckets


class Triton(Kernel):
    """The kernel (``Bucket`` holds a step between its halves), for float32 contiguous buckets
    on ``DEVICES`` when Triton imports (torch's CUDA wheels bring it). Nothing that decides
    depends on a rank's own slices (their addresses, say): under FSDP2 every rank takes the
    same kernel and the same collective. ``skip``: the step's ``found_inf`` flag (a 0-dim
    tensor on the bucket's device), which every launch reads, or None."""

    reads_skip = True

    def __init__(self, skip: Tensor | None = None) -> None:
        self.skip = skip

    def applies(self, tensors: Tensors) -> bool:
        on_cpu = tensors[0][0].device.type == "cpu"  # only through the interpreter
        return triton is not None and (not on_cpu or _interpreting()) and contiguous(tensors, DEVICES, (torch.float32,))

    def begin(self, settings: Settings, tensors: Tensors, clip: Tensor | None) -> Pending:
        return Bucket(settings, tensors, clip, self.skip)


class Bucket(Pending):
    """A bucket's step: ``squares`` runs the first pass, ``finish`` the second, or the whole
    step in one pass when no norms were asked for. ``clip`` and ``skip`` (non-zero: the step
    changes nothing): 0-dim tensors on the device, or None."""

    def __init__(self, settings: Settings, tensors: Tensors, clip: Tensor | None, skip: Tensor | None = None) -> None:
        params = tensors[0]
        self.device = params[0].device
        self.layout = _layout(tuple(p.numel() for p in params), CHUNK_ELEMENTS, self.device)
        self.lr, self.passed = settings.lr, False
        scale, eps = settings.folded
        # as floats: Triton would compile a Python int (a weight decay of 0, say) as an integer argument
        self.scalars = tuple(float(v) for v in (settings.beta1, settings.beta2, scale, eps, settings.coupled_wd, settings.decay))
        table = [[t.data_ptr() for t in ts] for ts in tensors]
        self.flags = {
            "CHUNK": CHUNK_ELEMENTS,
            "BLOCK": BLOCK_ELEMENTS,
            "COUPLED": settings.coupled_wd != 0,
            "ALIGNED": all(address % 16 == 0 for row in table for address in row),
        }
        self.addresses = torch.tensor(table, dtype=torch.int64).to(self.device, non_blocking=True)
        self.clip = None if clip is None else clip.to(torch.float32).reshape(1)
        self.skip = None if skip is None else skip.to(self.device, torch.float32).reshape(1)

    def _launch(self, size: Tensor | None, partial: Tensor | None, step_size: float, **switches: bool) -> None:
        layout, spare = self.layout, self.layout.spare  # spare: the float pointers a pass does not read
        if not layout.chunks:  # only empty slices here (FSDP2): nothing to launch, and CUDA refuses an empty grid
            return
        clip = self.clip if switches["MOMENTS"] else None
        # Triton launches on the current CUDA device, which need not be the tensors'.
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            _kernel()[(layout.chunks,)](
                *self.addresses, layout.numels, layout.chunk_tensor, layout.chunk_start,
                spare if clip is None else clip, spare if size is None else size, spare if partial is None else partial,
                spare if self.skip is None else self.skip, *self.scalars, step_size,
                HAS_CLIP=clip is not None, PER_TENSOR=size is not None, HAS_SKIP=self.skip is not None, **self.flags, **switches,
            )  # fmt: skip

    def squares(self) -> tuple[Tensor, Tensor]:
        """The first pass: advance the moments; each tensor's ``sum x^2`` (weights before
        decoupled decay) and ``sum u^2`` over the elements held here."""
        self.passed = True
        partial = torch.zeros((self.layout.chunks + 1, 2), dtype=torch.float32, device=self.device)  # last row: 0
        self._launch(None, partial, 0.0, MOMENTS=True, NORMS=True, APPLY=False)
        sums = partial[self.layout.gather].sum(dim=1)
        return sums[:, 1], sums[:, 0]

    def finish(self, ratios: Tensor | None) -> None:
        """The step ``x = decay * x - lr * ratio * u``, ``u`` computed again from the moments
        after the first pass; without one (no ratios), the moments and the step in one pass."""
        sizes = None if ratios is None else (ratios.to(torch.float32) * -self.lr).contiguous()
        self._launch(sizes, None, -float(self.lr), MOMENTS=not self.passed, NORMS=False, APPLY=True)
