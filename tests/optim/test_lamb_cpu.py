"""LAMB's CPU kernel path (largebatch.optim.lamb_cpu): its capability check, the path
itself against the paper's update, and the plain foreach fallback when the kernel is off."""

from __future__ import annotations

import itertools

import pytest
import torch

from largebatch.optim import lamb_cpu
from largebatch.optim.lamb import Lamb
from tests.optim.conftest import count_calls
from tests.optim.test_lamb import MODES, assert_matches_paper_update, make_grads, make_params

OPTIONS = list(itertools.product([True, False], [False, True], [None, (0.01, 0.5)], [True, False]))


def cpu_applies(*tensors):
    return lamb_cpu.CpuChunks(16, {}).applies(tensors)


@pytest.fixture
def kernel_calls(monkeypatch):
    """How many buckets went through the CPU kernel path."""
    return count_calls(monkeypatch, lamb_cpu.CpuChunks, "step")


@pytest.mark.skipif(not lamb_cpu.kernel_usable(torch.float64), reason="this torch has no usable CPU fused Adam kernel")
@pytest.mark.parametrize("mode", ["foreach", "chunked"])
@pytest.mark.parametrize("bias_correction,decoupled,clamp,adapt_second", OPTIONS)
def test_kernel_path_matches_paper_update(kernel_calls, mode, bias_correction, decoupled, clamp, adapt_second):
    assert_matches_paper_update(MODES[mode], bias_correction, decoupled, clamp, adapt_second)
    assert kernel_calls  # the path under test ran


@pytest.mark.parametrize("mode", ["foreach", "chunked"])
@pytest.mark.parametrize("bias_correction,decoupled,clamp,adapt_second", OPTIONS)
def test_without_the_kernel_the_foreach_path_matches_paper_update(
    monkeypatch, kernel_calls, mode, bias_correction, decoupled, clamp, adapt_second
):
    monkeypatch.setattr(lamb_cpu, "kernel_usable", lambda dtype: False)
    assert_matches_paper_update(MODES[mode], bias_correction, decoupled, clamp, adapt_second)
    assert not kernel_calls


@pytest.mark.skipif(not lamb_cpu.kernel_usable(torch.float64), reason="this torch has no usable CPU fused Adam kernel")
def test_kernel_and_fallback_take_the_same_steps_and_record_the_same_statistics(monkeypatch):
    def run(usable):
        monkeypatch.setattr(lamb_cpu, "kernel_usable", lambda dtype: usable)
        params = make_params()
        optimizer = Lamb([{"params": params, "name": "all"}], lr=0.01, weight_decay=0.1, max_grad_norm=1.0, chunk_elements=16)
        for t in range(1, 6):
            for p, g in zip(params, make_grads(t)):
                p.grad = g
            optimizer.request_stats()
            optimizer.step()
        return params, optimizer.last_stats["all"]

    (kernel, kernel_stats), (fallback, fallback_stats) = run(True), run(False)
    for p, q in zip(kernel, fallback):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)
    for key in ("trust_ratio", "weight_norm", "update_norm"):
        torch.testing.assert_close(kernel_stats[key], fallback_stats[key], rtol=1e-12, atol=1e-12)


def test_capability_is_probed_once_per_dtype_and_refuses_what_it_cannot_do(monkeypatch):
    lamb_cpu.kernel_usable(torch.float32)
    before = lamb_cpu.kernel_usable.cache_info()
    lamb_cpu.kernel_usable(torch.float32)
    after = lamb_cpu.kernel_usable.cache_info()
    assert (after.hits, after.misses) == (before.hits + 1, before.misses)
    probe = lamb_cpu.kernel_usable.__wrapped__
    assert not probe(torch.bfloat16)  # the chunked path is kept to float32 and float64

    def broken(*args, **kwargs):
        raise RuntimeError("no CPU implementation")

    monkeypatch.setattr(torch, "_fused_adam_", broken, raising=False)
    assert not probe(torch.float32)
    monkeypatch.delattr(torch, "_fused_adam_")
    assert not probe(torch.float32)


def test_the_kernel_path_applies_only_to_contiguous_cpu_tensors(monkeypatch):
    monkeypatch.setattr(lamb_cpu, "kernel_usable", lambda dtype: True)
    tensors = [[torch.zeros(3, 4)] for _ in range(4)]
    assert cpu_applies(*tensors)
    tensors[2] = [torch.zeros(4, 3).t()]
    assert not cpu_applies(*tensors)
    meta = [[torch.zeros(3, 4, device="meta")] for _ in range(4)]
    assert not cpu_applies(*meta)


def test_windows_cover_every_element_once():
    sizes = [5, 4, 40, 3, 16, 17, 2]
    tensors = [torch.arange(n, dtype=torch.float32) for n in sizes]
    windows = lamb_cpu.plan_windows(tensors, tensors, tensors, tensors, limit=16)
    pieces = [piece for window in windows for chunk in window for piece in chunk[0]]
    assert torch.equal(torch.cat(pieces), torch.cat(tensors))
    assert all(piece.numel() <= 16 for piece in pieces)
    # Small tensors share a window of one chunk while they fit; a larger one is a window of pieces.
    assert [[[p.numel() for p in chunk[0]] for chunk in window] for window in windows] == [
        [[5, 4]],
        [[16], [16], [8]],
        [[3]],
        [[16]],
        [[16], [1]],
        [[2]],
    ]
