"""LAMB's accelerator kernel (largebatch.optim.lamb_update.FusedAdam): torch's fused Adam
kernel for the moments, then the norms and the step of the multi-tensor kernel. No GPU here: the same code
runs on the CPU, where the kernel also exists, with the CPU's own chunked path turned off
(``chunk_elements=0``) and the CPU counted among the fused devices."""

from __future__ import annotations

import pytest
import torch

from largebatch.optim import lamb_cpu, lamb_update
from largebatch.optim.lamb import Lamb
from tests.optim.conftest import count_calls
from tests.optim.test_lamb import MODES, assert_matches_paper_update, make_grads, make_params
from tests.optim.test_lamb_cpu import OPTIONS
from tests.optim.test_no_host_sync import groups, model, steps_read_back

pytestmark = pytest.mark.skipif(not lamb_cpu.kernel_usable(torch.float64), reason="this torch has no CPU fused Adam kernel")


def fused_applies(*tensors):
    return lamb_update.FusedAdam().applies(tensors)


@pytest.fixture
def fused_on_cpu(monkeypatch):
    """The path on CPU tensors; returns how many buckets took it."""
    monkeypatch.setattr(lamb_update, "FUSED_DEVICES", ("cpu",))
    return count_calls(monkeypatch, lamb_update.FusedAdam, "begin")


@pytest.mark.parametrize("bias_correction,decoupled,clamp,adapt_second", OPTIONS)
def test_fused_path_matches_paper_update(fused_on_cpu, bias_correction, decoupled, clamp, adapt_second):
    assert_matches_paper_update(MODES["unchunked"], bias_correction, decoupled, clamp, adapt_second)
    assert fused_on_cpu  # the path under test ran


def test_fused_and_foreach_paths_take_the_same_steps_and_statistics_with_clipping(monkeypatch):
    def run(fused):
        monkeypatch.setattr(lamb_update, "FUSED_DEVICES", ("cpu",) if fused else ("cuda",))
        params = make_params()
        groups = [{"params": params[:3], "name": "decay"}, {"params": params[3:], "name": "no_decay", "weight_decay": 0.0}]
        optimizer = Lamb(groups, lr=0.01, weight_decay=0.1, max_grad_norm=0.5, chunk_elements=0)
        grads = []
        for t in range(1, 6):
            for p, g in zip(params, make_grads(t)):
                p.grad = g
            grads.append([g.clone() for g in make_grads(t)])
            optimizer.request_stats()
            optimizer.step()
            assert all(torch.equal(p.grad, g) for p, g in zip(params, grads[-1]))  # .grad left as it was
        return params, optimizer.last_stats

    (fused, fused_stats), (plain, plain_stats) = run(True), run(False)
    for p, q in zip(fused, plain):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)
    for name in ("decay", "no_decay"):
        for key in ("trust_ratio", "weight_norm", "update_norm"):
            torch.testing.assert_close(fused_stats[name][key], plain_stats[name][key], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lower_precision_tensors_stay_close_to_the_float64_steps(monkeypatch, dtype):
    monkeypatch.setattr(lamb_update, "FUSED_DEVICES", ("cpu",))
    exact, low = make_params(), [p.detach().to(dtype).requires_grad_() for p in make_params()]
    optimizers = [Lamb([{"params": ps}], lr=0.01, weight_decay=0.1, chunk_elements=0) for ps in (exact, low)]
    for t in range(1, 4):
        for p, q, g in zip(exact, low, make_grads(t)):
            p.grad, q.grad = g, g.to(dtype)
        for optimizer in optimizers:
            optimizer.step()
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for p, q in zip(exact, low):
        assert q.dtype == dtype
        torch.testing.assert_close(q.double(), p, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("clip", [None, 1.0])
@pytest.mark.parametrize("stats", [False, True])
@pytest.mark.parametrize("found_inf", [False, True])
def test_fused_path_reads_nothing_back(fused_on_cpu, clip, stats, found_inf):
    net = model()
    optimizer = Lamb(groups(net), lr=1e-2, weight_decay=0.05, max_grad_norm=clip, chunk_elements=0)
    assert steps_read_back(net, optimizer, stats, found_inf) == []
    assert fused_on_cpu


def test_the_path_takes_only_its_devices_one_dtype_and_contiguous_tensors(monkeypatch):
    cpu = [torch.zeros(4) for _ in range(4)]
    assert not fused_applies(*[[t] for t in cpu])  # the CPU is not a fused device by default
    meta = [torch.empty(4, device="meta") for _ in range(4)]
    assert not fused_applies(*[[t] for t in meta])
    monkeypatch.setattr(lamb_update, "FUSED_DEVICES", ("cpu",))
    assert fused_applies(*[[t] for t in cpu])
    assert not fused_applies([torch.zeros(4, 4).t()], *[[t] for t in cpu[1:]])  # a transposed view
    assert not fused_applies([cpu[0]], [cpu[1].double()], [cpu[2]], [cpu[3]])  # mixed dtypes
    assert not fused_applies(*[[t.int()] for t in cpu])
