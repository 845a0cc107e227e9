"""LAMB's Triton path for CUDA (largebatch.optim.lamb_triton). No GPU here: its kernel
runs on CPU tensors through Triton's interpreter, in a fresh pytest of
``tests/optim/interpreted_lamb_triton.py`` (the interpreter must be on before Triton is
imported), against the paper's update; this file checks when the path is taken."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from largebatch.optim import lamb_triton
from tests.conftest import REPO, clean_env

pytestmark = pytest.mark.skipif(lamb_triton.triton is None, reason="Triton is not installed")


@pytest.mark.slow
def test_kernel_matches_the_paper_update_under_the_interpreter():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/optim/interpreted_lamb_triton.py"],
        cwd=REPO, env=clean_env(TRITON_INTERPRET="1"), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ passed in [0-9.]+s(?: \(.*\))?", summary), summary  # none skipped
    assert int(summary.split()[0]) >= 25


def test_taken_only_for_float32_contiguous_tensors_on_its_devices(monkeypatch):
    def bucket(device="meta", dtype=torch.float32, transpose=False):
        t = torch.empty((4, 3), device=device, dtype=dtype)
        t = t.t() if transpose else t
        return [t], [t], [t], [t]

    assert not lamb_triton.Triton().applies(bucket())  # meta is not among its devices
    monkeypatch.setattr(lamb_triton, "DEVICES", ("meta", "cpu"))
    assert lamb_triton.Triton().applies(bucket())
    assert not lamb_triton.Triton().applies(bucket(dtype=torch.bfloat16))  # to lamb_update.FusedAdam
    assert not lamb_triton.Triton().applies(bucket(dtype=torch.float64))
    assert not lamb_triton.Triton().applies(bucket(transpose=True))
    offset = torch.empty(13, device="meta")[1:]  # misaligned: still taken, without the vector hints
    assert lamb_triton.Triton().applies(([offset], [offset], [offset], [offset]))
    # the CPU only through the interpreter, which is off in this process
    assert not lamb_triton._interpreting()
    assert not lamb_triton.Triton().applies(bucket(device="cpu"))


def test_chunk_layout_sums_each_tensor_in_chunk_order():
    layout = lamb_triton._Layout((5, 0, 16, 17), 8, torch.device("cpu"))
    assert layout.chunks == 1 + 0 + 2 + 3
    assert layout.chunk_tensor.tolist() == [0, 2, 2, 3, 3, 3]
    assert layout.chunk_start.tolist() == [0, 0, 8, 0, 8, 16]
    partial = torch.arange(1.0, layout.chunks + 1).repeat_interleave(2).view(-1, 2)
    partial = torch.cat([partial, torch.zeros(1, 2)])  # the padding row
    sums = partial[layout.gather].sum(dim=1)[:, 0]
    assert sums.tolist() == [1.0, 0.0, 2.0 + 3.0, 4.0 + 5.0 + 6.0]


POINTERS = ("x_addrs", "g_addrs", "m_addrs", "v_addrs", "numels", "chunk_tensor", "chunk_start")
# The launches ``step`` makes: moments and norms, the step after the ratios, and both in one.
PASSES = [
    {"MOMENTS": True, "NORMS": True, "APPLY": False, "PER_TENSOR": False},
    {"MOMENTS": False, "NORMS": False, "APPLY": True, "PER_TENSOR": True},
    {"MOMENTS": True, "NORMS": False, "APPLY": True, "PER_TENSOR": False},
]


def compile_for(capability: int, switches: dict) -> dict:
    """The kernel compiled for a CUDA GPU of ``capability`` (no GPU needed); its assembly."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = lamb_triton._kernel()
    names = list(kernel.arg_names)
    constants = {"CHUNK": lamb_triton.CHUNK_ELEMENTS, "BLOCK": lamb_triton.BLOCK_ELEMENTS, **switches}
    signature = {name: "*i64" if name in POINTERS else "*fp32" for name in names[:11]}
    signature |= {name: "fp32" for name in names[11:18]} | {name: "constexpr" for name in constants}
    source = ASTSource(fn=kernel, signature=signature, constexprs={(names.index(k),): v for k, v in constants.items()})
    return triton.compile(source, target=GPUTarget("cuda", capability, 32)).asm


@pytest.mark.parametrize("capability", [80, 90])
@pytest.mark.parametrize("switches", PASSES, ids=["norms", "step", "one-pass"])
@pytest.mark.parametrize("clip,coupled,skip", [(True, True, True), (False, False, False)])
def test_compiles_for_a100_and_h100_with_whole_vector_loads(capability, switches, clip, coupled, skip):
    """Triton's own compiler and ptxas, without a GPU: every pass the step launches builds
    to a cubin, with and without the ``found_inf`` flag's early return; with aligned tensors
    the unmasked vectors load 16 bytes at a time (the alignment hints hold), without, one
    float at a time."""
    vector_load = re.compile(r"ld\.global(\.\S+)*\.v4\.b32")
    for aligned in (True, False):
        asm = compile_for(capability, switches | {"HAS_CLIP": clip, "COUPLED": coupled, "ALIGNED": aligned, "HAS_SKIP": skip})
        assert asm["cubin"]
        assert bool(vector_load.search(asm["ptx"])) == aligned


on_a_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
VIT_SHAPES = [(768, 3072), (3072,), (768,), (1000, 768), (5,)]


def compare_paths(monkeypatch, device: str, shapes: list[tuple[int, ...]], decoupled: bool) -> None:
    """The Triton path on ``device`` (one tensor a misaligned view, so both compiled
    variants run), 5 steps with clipping and a no-decay group, against the fused-Adam path
    on the same device and the per-tensor reference in float64 on the CPU; the caller has
    put ``device`` in both paths' device lists."""
    from largebatch.optim import lamb_update
    from largebatch.optim.lamb import Lamb
    from tests.optim.conftest import count_calls

    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(s, generator=gen) * 0.02 for s in shapes]
    grads = [[torch.randn(s, generator=gen) * 1e-3 for s in shapes] for _ in range(5)]

    def run(device, dtype, **options):
        params = [t.to(device, dtype, copy=True).requires_grad_() for t in start]
        if dtype == torch.float32:  # a view one float in: not 16-byte aligned
            tail = torch.zeros(start[2].numel() + 1, device=device, dtype=dtype)[1:]
            params[2] = tail.copy_(start[2]).requires_grad_()
        groups = [{"params": params[:-1]}, {"params": params[-1:], "weight_decay": 0.0}]
        optimizer = Lamb(
            groups, lr=1e-2, weight_decay=0.05, max_grad_norm=1.0, decoupled_weight_decay=decoupled, chunk_elements=0, **options
        )
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.to(device, dtype)
            optimizer.request_stats()
            optimizer.step()
        return [p.detach().double().cpu() for p in params], optimizer.last_stats

    taken = count_calls(monkeypatch, lamb_triton.Bucket, "squares")
    triton_weights, triton_stats = run(device, torch.float32)
    assert len(taken) == 10  # both groups, every step
    monkeypatch.setattr(lamb_triton, "DEVICES", ())
    fused = count_calls(monkeypatch, lamb_update.FusedAdam, "begin")
    fused_weights, fused_stats = run(device, torch.float32)
    assert fused
    monkeypatch.setattr(lamb_update, "FUSED_DEVICES", ())
    reference, _ = run("cpu", torch.float64, foreach=False)
    assert len(taken) == 10
    for ours, other, exact in zip(triton_weights, fused_weights, reference):
        torch.testing.assert_close(ours, other, rtol=0, atol=1e-6)
        torch.testing.assert_close(ours, exact, rtol=0, atol=2e-6)
    for group in ("group0", "group1"):
        for key in ("trust_ratio", "weight_norm", "update_norm"):
            torch.testing.assert_close(triton_stats[group][key], fused_stats[group][key], rtol=1e-5, atol=0)


@pytest.mark.gpu
@on_a_gpu
@pytest.mark.parametrize("decoupled", [False, True])
def test_on_a_gpu_the_kernel_matches_the_fused_adam_path_and_the_paper_update(monkeypatch, decoupled):
    """On real hardware, with ViT-B-sized tensors spanning many 64Ki-element chunks."""
    compare_paths(monkeypatch, "cuda", VIT_SHAPES, decoupled)


def test_scalar_arguments_reach_the_kernel_as_floats():
    """Triton compiles a Python int argument as an integer: a weight decay given as 0 or
    betas given as ints must still arrive as floats."""
    group = {"lr": 1, "betas": (0, 1), "eps": 1e-6, "weight_decay": 0, "decoupled_weight_decay": True, "bias_correction": False}
    from largebatch.optim.lamb_update import Settings

    t = [torch.zeros(3)]
    bucket = lamb_triton.Bucket(Settings.of(group, 1, adapt=False, record=False), (t, t, t, t), None)
    assert all(type(value) is float for value in bucket.scalars)
    assert bucket.flags["COUPLED"] is False
