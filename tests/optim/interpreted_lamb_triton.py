"""LAMB's Triton path (largebatch.optim.lamb_triton) on CPU tensors through Triton's
interpreter, against the paper's update written out (``tests.optim.test_lamb``).

Not collected on its own: the interpreter must be on before Triton is imported, so
``tests/optim/test_lamb_triton.py`` runs this file in a fresh pytest with
``TRITON_INTERPRET=1``. The kernel is float32 only, so the reference runs in float64
from the same starting values and the steps agree to float32 rounding.
"""

from __future__ import annotations

import pytest
import torch

from largebatch.optim import lamb_triton
from largebatch.optim.lamb import Lamb
from tests.optim.conftest import count_calls
from tests.optim.test_lamb import BETAS, EPS, LR, make_grads, make_params, reference_step
from tests.optim.test_lamb_cpu import OPTIONS

STEPS = 5
TOLERANCE = 2e-6  # float32 rounding over a few steps of values of order 1


@pytest.fixture(autouse=True)
def interpreted(monkeypatch):
    """CPU buckets take the path; chunks of 16 elements in vectors of 8, so tensors span
    several chunks and a chunk ends inside a vector. Returns how many buckets took it."""
    if not lamb_triton._interpreting():
        pytest.fail("run with TRITON_INTERPRET=1 set before Triton is imported")
    monkeypatch.setattr(lamb_triton, "DEVICES", ("cpu",))
    monkeypatch.setattr(lamb_triton, "CHUNK_ELEMENTS", 16)
    monkeypatch.setattr(lamb_triton, "BLOCK_ELEMENTS", 8)
    return count_calls(monkeypatch, lamb_triton.Bucket, "__init__")


def run_against_reference(bias_correction, decoupled, clamp, adapt_second, *, max_grad_norm=None, record=True, betas=BETAS):
    """``STEPS`` steps of two groups (the second without decay, maybe without adaptation)
    with float32 tensors on the path, and the same steps written out in float64; returns
    the largest weight error and the statistics' largest errors."""
    wd = 0.1
    params = make_params(dtype=torch.float32)
    groups = [
        {"params": params[:3], "name": "first"},
        {"params": params[3:], "name": "second", "weight_decay": 0.0, "adapt": adapt_second},
    ]
    optimizer = Lamb(
        groups, lr=LR, betas=betas, eps=EPS, weight_decay=wd, bias_correction=bias_correction,
        decoupled_weight_decay=decoupled, max_trust_ratio=clamp and clamp[1], min_trust_ratio=clamp and clamp[0],
        max_grad_norm=max_grad_norm, chunk_elements=0,
    )  # fmt: skip
    ref = [p.detach().double() for p in params]
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in ref]
    stat_error = 0.0
    for t in range(1, STEPS + 1):
        grads = make_grads(t)
        for p, g in zip(params, grads):
            p.grad = g.float()
        if record:
            optimizer.request_stats()
        optimizer.step()
        if max_grad_norm is not None:
            total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
            grads = [g * min(1.0, max_grad_norm / (total.item() + 1e-6)) for g in grads]
        stats = []
        for i, g in enumerate(grads):
            second = i >= 3
            ref[i], m, v, *stat = reference_step(
                ref[i], g, *moments[i], t, wd=0.0 if second else wd, bias_correction=bias_correction,
                decoupled=decoupled, adapt=adapt_second if second else True, clamp=clamp,
            )  # fmt: skip
            moments[i] = (m, v)
            stats.append(stat)
        if record:
            got = [optimizer.last_stats[name][key] for name in ("first", "second") for key in ("trust_ratio", "weight_norm", "update_norm")]
            want = [torch.stack([s[k] for s in part]) for part in (stats[:3], stats[3:]) for k in range(3)]
            stat_error = max(stat_error, *((g.double() - w).abs().max().item() / max(1.0, w.abs().max().item()) for g, w in zip(got, want)))
    weight_error = max((p.detach().double() - r).abs().max().item() for p, r in zip(params, ref))
    return weight_error, stat_error


@pytest.mark.parametrize("bias_correction,decoupled,clamp,adapt_second", OPTIONS)
def test_matches_paper_update(interpreted, bias_correction, decoupled, clamp, adapt_second):
    weights, stats = run_against_reference(bias_correction, decoupled, clamp, adapt_second)
    assert weights < TOLERANCE
    assert stats < TOLERANCE
    assert len(interpreted) == 2 * STEPS  # both groups' buckets, every step


def test_clipping_inside_the_step_matches(interpreted):
    weights, stats = run_against_reference(True, False, None, True, max_grad_norm=0.5)
    assert weights < TOLERANCE and stats < TOLERANCE


def test_one_pass_without_ratios_or_statistics(interpreted, monkeypatch):
    launches, real = [], lamb_triton._kernel()

    class Counting:
        def __getitem__(self, grid):
            def launch(*args, **switches):
                launches.append((switches["MOMENTS"], switches["NORMS"], switches["APPLY"]))
                return real[grid](*args, **switches)

            return launch

    monkeypatch.setattr(lamb_triton, "_kernel", Counting)
    weights, _ = run_against_reference(True, True, None, False, record=False)
    assert weights < TOLERANCE
    # the first group adapts: moments and norms, then the step; the second neither adapts
    # nor records: moments and step in one pass
    two_pass, one_pass = [(True, True, False), (False, False, True)], [(True, False, True)]
    assert launches == (two_pass + one_pass) * STEPS


def test_a_wrong_moment_is_caught(interpreted):
    """The comparison can fail: a kernel given a slightly different beta1 is off."""
    weights, _ = run_against_reference(True, False, None, True, betas=(BETAS[0] + 1e-3, BETAS[1]))
    assert weights > 10 * TOLERANCE


def test_zero_sized_and_zero_valued_tensors_take_ratio_one(interpreted):
    params = [torch.zeros(0, requires_grad=True), torch.zeros(20, requires_grad=True), torch.ones(33, requires_grad=True)]
    optimizer = Lamb(params, lr=0.1, weight_decay=0.1, chunk_elements=0)
    for p in params:
        p.grad = torch.full_like(p, 0.5)
    optimizer.request_stats()
    optimizer.step()
    ratio = optimizer.last_stats["group0"]["trust_ratio"]
    assert ratio[:2].tolist() == [1.0, 1.0] and ratio[2] > 0
    # Adam's first step moves each element by lr * sign(g): exactly -0.1 from zero weights
    torch.testing.assert_close(params[1].detach(), torch.full((20,), -0.1), rtol=0, atol=1e-6)


def test_taken_before_the_fused_adam_path(interpreted, monkeypatch):
    """On CUDA both paths apply to a float32 bucket; the Triton one is chosen."""
    from largebatch.optim import lamb_update

    monkeypatch.setattr(lamb_update, "FUSED_DEVICES", ("cpu",))
    fused = count_calls(monkeypatch, lamb_update.FusedAdam, "begin")
    weights, _ = run_against_reference(True, False, None, True)
    assert weights < TOLERANCE
    assert len(interpreted) == 2 * STEPS and not fused


def test_a_bucket_of_empty_slices_launches_nothing(interpreted, monkeypatch):
    """A rank can hold only empty slices of a bucket under FSDP2; CUDA refuses an empty grid."""

    def no_launch():
        raise AssertionError("launched a kernel over no elements")

    monkeypatch.setattr(lamb_triton, "_kernel", no_launch)
    empty = [torch.zeros(0, requires_grad=True), torch.zeros(0, 3, requires_grad=True)]
    optimizer = Lamb(empty, lr=0.1, weight_decay=0.1, chunk_elements=0)
    for p in empty:
        p.grad = torch.zeros_like(p)
    for stats in (True, False):
        if stats:
            optimizer.request_stats()
        optimizer.step()
    assert len(interpreted) == 2
    assert optimizer.last_stats["group0"]["trust_ratio"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("clip", [None, 1.0])
@pytest.mark.parametrize("stats", [False, True])
@pytest.mark.parametrize("found_inf", [False, True])
def test_the_step_reads_nothing_back(interpreted, clip, stats, found_inf):
    """Nothing the step dispatches reads a device value back to the host (the interpreter
    runs the kernel itself outside torch's dispatch)."""
    from tests.optim.test_no_host_sync import groups, model, steps_read_back

    net = model()
    optimizer = Lamb(groups(net), lr=1e-2, weight_decay=0.05, max_grad_norm=clip, chunk_elements=0)
    assert steps_read_back(net, optimizer, stats, found_inf) == []
    assert interpreted


@pytest.mark.parametrize("decoupled", [False, True])
def test_matches_the_fused_adam_path_on_misaligned_and_multi_chunk_tensors(interpreted, monkeypatch, decoupled):
    """What ``pytest -m gpu`` checks on a GPU, here with the CPU standing in for both paths."""
    from largebatch.optim import lamb_update
    from tests.optim.test_lamb_triton import compare_paths

    monkeypatch.setattr(lamb_update, "FUSED_DEVICES", ("cpu",))
    compare_paths(monkeypatch, "cpu", [(24, 40), (40,), (24,), (50, 24), (5,)], decoupled)


def test_the_kernel_reads_found_inf(interpreted, monkeypatch):
    """A flagged step (the first and a later one) changes nothing and a 0.0 flag is the plain
    step, bit for bit, with the kernel reading the flag itself: nothing is copied around it."""
    from largebatch.optim import layerwise
    from tests.optim.test_found_inf import check_flagged_steps, check_zero_flags

    given = []

    class Recorded(layerwise.Kept):
        def __init__(self, skip, tensors):
            given.append(skip)
            super().__init__(skip, tensors)

    monkeypatch.setattr(layerwise, "Kept", Recorded)
    check_flagged_steps("lamb-multi-tensor", monkeypatch, torch.float32)
    check_zero_flags("lamb-multi-tensor", monkeypatch, torch.float32)
    assert interpreted and given and all(skip is None for skip in given)
