"""LAMB behind torch.amp's GradScaler and under real two-process DDP (gloo)."""

from __future__ import annotations

import os
import pathlib

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from largebatch.optim.lamb import Lamb
from tests.conftest import free_port

STEPS, BATCH = 4, 16


def make_model(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 3)).to(dtype)


def make_batch(step: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, 6, generator=gen, dtype=dtype), torch.randint(3, (BATCH,), generator=gen)


def make_lamb(model: nn.Module) -> Lamb:
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    return Lamb([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=0.02)


def loss_of(model: nn.Module, step: int, dtype: torch.dtype, rows: slice = slice(None)) -> torch.Tensor:
    images, labels = make_batch(step, dtype)
    return nn.functional.cross_entropy(model(images[rows]), labels[rows])


def test_grad_scaler_unscaled_gradients_and_skipped_step():
    plain_model, scaled_model = make_model(torch.float32), make_model(torch.float32)
    plain, scaled = make_lamb(plain_model), make_lamb(scaled_model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=1000)
    for step in range(STEPS):
        plain.zero_grad()
        loss_of(plain_model, step, torch.float32).backward()
        plain.step()

        scaled.zero_grad()
        scaler.scale(loss_of(scaled_model, step, torch.float32)).backward()
        scaler.unscale_(scaled)  # where the engine clips
        scaler.step(scaled)
        scaler.update()
        # Scaling by a power of two and back is exact: the same steps, bit for bit.
        for p, q in zip(plain_model.parameters(), scaled_model.parameters()):
            assert torch.equal(p, q)

        if step == 1:
            # An overflowing step: the scaler skips it and LAMB's state stays as it was.
            before_params = [p.detach().clone() for p in scaled_model.parameters()]
            before_state = {k: {n: t.clone() if torch.is_tensor(t) else t for n, t in s.items()} for k, s in scaled.state.items()}
            scaled.zero_grad()
            scaler.scale(loss_of(scaled_model, 99, torch.float32)).backward()
            next(scaled_model.parameters()).grad[0, 0] = float("inf")
            scale = scaler.get_scale()
            scaler.step(scaled)
            scaler.update()
            assert scaler.get_scale() == scale / 2
            for p, before in zip(scaled_model.parameters(), before_params):
                assert torch.equal(p, before)
            for key, state in scaled.state.items():
                assert state["step"] == before_state[key]["step"] == step + 1
                assert torch.equal(state["exp_avg"], before_state[key]["exp_avg"])
                assert torch.equal(state["exp_avg_sq"], before_state[key]["exp_avg_sq"])


def _ddp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = make_model(torch.float64)
        ddp = nn.parallel.DistributedDataParallel(model)
        optimizer = make_lamb(model)
        half = BATCH // world
        for step in range(STEPS):
            optimizer.zero_grad()
            loss_of(ddp, step, torch.float64, slice(rank * half, (rank + 1) * half)).backward()
            optimizer.step()
        torch.save([p.detach() for p in model.parameters()], pathlib.Path(out_dir) / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
@pytest.mark.dist
def test_ddp_two_ranks_equal_single_process_on_the_full_batch(tmp_path):
    mp.spawn(_ddp_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    model = make_model(torch.float64)
    optimizer = make_lamb(model)
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, step, torch.float64).backward()
        optimizer.step()
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]  # the bodies ran
    start = list(make_model(torch.float64).parameters())
    for p, p0, r0, r1 in zip(model.parameters(), start, *ranks):
        assert torch.equal(r0, r1)  # all-reduced gradients: every rank takes the same step
        assert not torch.equal(r0, p0)  # and it moved
        torch.testing.assert_close(r0, p.detach(), rtol=0, atol=1e-12)
