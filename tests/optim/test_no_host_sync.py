"""The optimizers' accelerator paths never read a value back to the host inside ``step()``.

On CUDA or an HPU a read-back (``.item()``, ``float(t)``, ``if t:``, ``torch.equal``,
``nonzero``) waits for the queued kernels, and once per tensor it costs more than the
update. On accelerators other than CUDA LAMB takes its multi-tensor path (the CPU kernel
of ``lamb_cpu`` takes CPU tensors only), so that path runs here on the CPU, with the
CPU kernel turned off (``chunk_elements=0``), under a dispatch mode that records every
operator that materialises a tensor's value on the host. CUDA's kernel (``lamb_update.FusedAdam``) is
checked the same way in ``test_lamb_fused.py``.
"""

from __future__ import annotations

import pytest
import torch

from largebatch.engine.update import step_unless
from largebatch.optim import lamb_cpu
from largebatch.optim.lamb import Lamb
from largebatch.optim.lars import Lars
from tests.support.host_reads import HostReads


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    with torch.no_grad():
        net[3].bias.zero_()  # a zero tensor: the trust ratio's special case
    return net


def groups(net: torch.nn.Module) -> list[dict]:
    decay = [p for p in net.parameters() if p.ndim > 1]
    no_decay = [p for p in net.parameters() if p.ndim <= 1]
    return [{"params": decay, "name": "decay"}, {"params": no_decay, "name": "no_decay", "weight_decay": 0.0}]


def steps_read_back(net: torch.nn.Module, optimizer: torch.optim.Optimizer, stats: bool, found_inf: bool = False) -> list[str]:
    """Three steps; with ``found_inf`` under the flag 0.0, 1.0, 0.0 (the deferred non-finite
    check's ``step_unless``: the second step is undone on the device, its step counts when
    the third settles it)."""
    seen = []
    for flag in (0.0, 1.0, 0.0):
        optimizer.zero_grad()
        net(torch.randn(8, 16)).square().mean().backward()
        if stats:
            optimizer.request_stats()
        with HostReads() as mode:
            if found_inf:
                step_unless(optimizer, torch.tensor(flag))
            else:
                optimizer.step()
        seen += mode.seen
    return seen


@pytest.mark.parametrize("clip", [None, 1.0])
@pytest.mark.parametrize("stats", [False, True])
@pytest.mark.parametrize("found_inf", [False, True])
def test_lamb_multi_tensor_path_reads_nothing_back(clip, stats, found_inf):
    net = model()
    optimizer = Lamb(groups(net), lr=1e-2, weight_decay=0.05, max_grad_norm=clip, chunk_elements=0)
    assert steps_read_back(net, optimizer, stats, found_inf) == []
    assert optimizer.state_dict()["state"][0]["step"] == (2 if found_inf else 3)


@pytest.mark.parametrize("stats", [False, True])
@pytest.mark.parametrize("found_inf", [False, True])
def test_lars_reads_nothing_back(stats, found_inf):
    net = model()
    optimizer = Lars(groups(net), lr=0.5, momentum=0.9, weight_decay=5e-4)
    assert steps_read_back(net, optimizer, stats, found_inf) == []


def test_the_detector_sees_a_read_back_and_the_cpu_kernel_never_takes_accelerator_tensors():
    with HostReads() as mode:
        float(torch.ones(2).sum())
        bool(torch.ones(()) > 0)
    assert len(mode.seen) == 2  # the check above can fail
    on_meta = [torch.empty(4, device="meta") for _ in range(4)]
    assert not lamb_cpu.CpuChunks(16, {}).applies(
        (on_meta[:1], on_meta[1:2], on_meta[2:3], on_meta[3:])
    )  # other devices: multi-tensor path
