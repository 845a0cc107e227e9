"""LAMB and LARS over FSDP2-sharded parameters (real processes, gloo, CPU).

The reference is the same optimizer over the unsharded model, fed the full-batch
gradient: after every step the gathered sharded weights, the recorded trust ratios and
norms must equal the reference's (float64, up to reduction order). The profiler counts
the collectives inside ``step()``: one all-reduce for all norms of the step (the
per-tensor path over DTensors, one reduction per norm, shows the count can fail).
Under HSDP (2 x 2 mesh) the norms are reduced over the shard group only. A last step
under ``found_inf`` 1.0 (NaN gradients) leaves the weights and the state as they were.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from largebatch.engine.update import step_unless
from largebatch.optim.lamb import Lamb
from largebatch.optim.lars import Lars
from largebatch.optim.param_groups import build_param_groups
from tests.conftest import free_port

STEPS, BATCH = 2, 8
pytestmark = [pytest.mark.dist, pytest.mark.slow]


def make_model():
    import timm

    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", img_size=28, patch_size=7, in_chans=1, embed_dim=24, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=5
    )
    return model.double()


def make_optimizer(kind: str, model, foreach: bool = True, eps: float = 1e-6):
    groups = build_param_groups(model, weight_decay=0.05)
    if kind == "lamb":
        return Lamb(groups, lr=0.02, eps=eps, foreach=foreach)
    return Lars(groups, lr=0.5, momentum=0.9, nesterov=True, foreach=foreach)


def batch(step: int):
    gen = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, 1, 28, 28, generator=gen, dtype=torch.float64), torch.randint(5, (BATCH,), generator=gen)


def collectives_in(fn) -> int:
    from torch.profiler import profile

    with profile() as prof:
        fn()
    return sum(1 for e in prof.events() if e.name.startswith("c10d::"))


def shard(model, mesh):
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _worker(rank: int, world: int, port: int, kind: str, mesh_shape: tuple[int, ...]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    fused_calls, dtype, tolerance, eps = None, torch.float64, {"rtol": 1e-10, "atol": 1e-12}, 1e-6
    if kind == "lamb-fused":  # CUDA's path (torch's fused Adam kernel) on the slices, the CPU standing in
        from largebatch.optim import lamb_update
        from tests.optim.conftest import count_calls

        monkeypatch = pytest.MonkeyPatch()
        monkeypatch.setattr(lamb_update, "FUSED_DEVICES", ("cpu",))
        fused_calls, kind = count_calls(monkeypatch, lamb_update.FusedAdam, "begin"), "lamb"
    if kind == "lamb-triton":  # CUDA's float32 path (two Triton passes) on the slices, through Triton's interpreter
        from largebatch.optim import lamb_triton
        from tests.optim.conftest import count_calls

        assert lamb_triton._interpreting(), "TRITON_INTERPRET=1 must reach the worker"
        monkeypatch = pytest.MonkeyPatch()
        monkeypatch.setattr(lamb_triton, "DEVICES", ("cpu",))
        monkeypatch.setattr(lamb_triton, "CHUNK_ELEMENTS", 64)  # tensors span several chunks
        monkeypatch.setattr(lamb_triton, "BLOCK_ELEMENTS", 16)
        fused_calls, kind = count_calls(monkeypatch, lamb_triton.Bucket, "squares"), "lamb"
        # float32 against the unsharded optimizer's float32 CPU path: equal to rounding. A
        # larger eps: the full-batch and the sharded gradients differ by float32 rounding
        # (about 1e-9 here), and where a gradient is that small, r = g / (|g| + eps) with
        # eps = 1e-6 would turn that rounding into differences of 1e-3 in the step.
        dtype, tolerance, eps = torch.float32, {"rtol": 2e-5, "atol": 2e-6}, 1e-3
    if len(mesh_shape) > 1:
        # HSDP averages the gradients in two reductions (within the shard group, then
        # across replicas), in another order than the full batch's sum: float64 rounding
        # of about 1e-17, which r = g / (|g| + eps) multiplies by 1 / eps where a gradient
        # is near zero (2e-12 in the step on an AVX-512 Xeon with eps = 1e-6). A larger eps
        # keeps that far below the tolerance; the trust ratios and norms are unchanged in kind.
        eps = 1e-3
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor

        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("replicate", "shard")[-len(mesh_shape) :])
        reference, model = make_model().to(dtype), shard(make_model().to(dtype), mesh)
        ref_opt, opt = make_optimizer(kind, reference, eps=eps), make_optimizer(kind, model, eps=eps)
        rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)  # FSDP/HSDP average over all ranks
        for step in range(STEPS):
            images, labels = batch(step)
            images = images.to(dtype)
            ref_opt.zero_grad()
            torch.nn.functional.cross_entropy(reference(images), labels).backward()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(images[rows]), labels[rows]).backward()
            ref_opt.request_stats()
            opt.request_stats()
            ref_opt.step()
            assert collectives_in(opt.step) == 1, "all norms of a step in one collective"
            for (name, ref_param), param in zip(reference.named_parameters(), model.parameters()):
                torch.testing.assert_close(param.full_tensor(), ref_param.detach(), **tolerance, msg=f"{name} after step {step}")
            assert opt.last_stats.keys() == ref_opt.last_stats.keys()
            for group, ref_stats in ref_opt.last_stats.items():
                stats = opt.last_stats[group]
                assert stats["param_names"] == ref_stats["param_names"]
                for key in ("trust_ratio", "weight_norm", "update_norm"):  # the norms, not only their ratios
                    torch.testing.assert_close(stats[key], ref_stats[key], **tolerance, msg=f"{group} {key}")
        # a step under found_inf 1.0: the weights and the state as they were, still one collective
        held = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in _flat_state(opt).items()}
        weights = [p.full_tensor() for p in model.parameters()]
        for param in model.parameters():
            param.grad.to_local().fill_(float("nan"))
        assert collectives_in(lambda: step_unless(opt, torch.tensor(1.0))) == 1
        assert all(torch.equal(p.full_tensor(), w) for p, w in zip(model.parameters(), weights))
        now = _flat_state(opt)
        assert now.keys() == held.keys()
        assert all(torch.equal(now[k].full_tensor(), v) if isinstance(v, torch.Tensor) else now[k] == v for k, v in held.items())
        # the state is sharded like the parameters (DCP saves it shard by shard)
        assert all(isinstance(t, DTensor) for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.ndim)
        # the per-tensor path over DTensors is correct too, but reduces once per norm
        slow_model = shard(make_model(), mesh)
        slow = make_optimizer(kind, slow_model, foreach=False)
        images, labels = batch(0)
        torch.nn.functional.cross_entropy(slow_model(images[rows]), labels[rows]).backward()
        assert collectives_in(slow.step) > len(list(slow_model.parameters()))
        assert fused_calls is None or fused_calls  # the path under test ran
    finally:
        torch.distributed.destroy_process_group()


def _flat_state(optimizer) -> dict:
    return {(i, k): v for i, entry in optimizer.state_dict()["state"].items() for k, v in entry.items()}


@pytest.mark.parametrize("kind", ["lamb", "lars", "lamb-fused", "lamb-triton"])
def test_sharded_step_matches_the_unsharded_optimizer_with_one_collective(kind, monkeypatch):
    if kind == "lamb-triton":
        from largebatch.optim import lamb_triton

        if lamb_triton.triton is None:
            pytest.skip("Triton is not installed")
        monkeypatch.setenv("TRITON_INTERPRET", "1")  # read by the workers' fresh imports of Triton
    mp.spawn(_worker, args=(2, free_port(), kind, (2,)), nprocs=2)


def test_hsdp_reduces_the_norms_over_the_shard_group_only():
    mp.spawn(_worker, args=(4, free_port(), "lamb", (2, 2)), nprocs=4)
