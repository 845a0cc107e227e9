"""The accumulated gradient equals the full-batch gradient (float64), in one process and
under 2-process gloo DDP (2 ranks x A=2 against one batch of the same 4 micro-batches)."""

import os
import pathlib

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from largebatch.engine.hook import Hook
from tests.conftest import free_port
from tests.engine.helpers import make_engine

MICRO, FEATURES, CLASSES = 5, 7, 3


def make_model() -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES)).double()


def make_micro_batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(99)
    return [
        (torch.randn(MICRO, FEATURES, generator=gen, dtype=torch.float64), torch.randint(CLASSES, (MICRO,), generator=gen))
        for _ in range(count)
    ]


def full_batch_gradient(batches) -> dict[str, torch.Tensor]:
    model = make_model()
    inputs = torch.cat([b[0] for b in batches])
    labels = torch.cat([b[1] for b in batches])
    torch.nn.functional.cross_entropy(model(inputs), labels).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


class GradCapture(Hook):
    """Copies the gradients the optimizer is about to use, then skips the update."""

    def __init__(self):
        super().__init__()
        self.grads = None

    def before_optimizer_step(self, state):
        self.grads = {name: p.grad.clone() for name, p in state.run.model.named_parameters()}
        state.current.request_skip("capturing the gradient only")


@pytest.mark.parametrize("accumulation", [1, 2, 4])
def test_accumulated_gradient_equals_full_batch_gradient(accumulation):
    batches = make_micro_batches(4)
    capture = GradCapture()
    # One optimizer step over the first A micro-batches.
    engine = make_engine(
        make_model(),
        batches[:accumulation],
        global_batch_size=MICRO * accumulation,
        micro_batch_size=MICRO,
        num_samples=MICRO * accumulation,
        hooks=[capture],
        **{"data.num_classes": CLASSES},
    )
    engine.run()
    expected = full_batch_gradient(batches[:accumulation])
    assert capture.grads.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(capture.grads[name], grad, rtol=0, atol=1e-12)


def test_partial_window_gradient_is_the_mean_over_its_samples():
    """partial_window='step': the short last window averages over its own samples."""
    batches = make_micro_batches(5)
    grads = []

    class Capture(GradCapture):
        def before_optimizer_step(self, state):
            super().before_optimizer_step(state)
            grads.append(self.grads)

    engine = make_engine(
        make_model(),
        batches,
        global_batch_size=MICRO * 3,
        micro_batch_size=MICRO,
        num_samples=MICRO * 5,
        hooks=[Capture()],
        partial_window="step",
        **{"data.num_classes": CLASSES},
    )
    engine.run()
    assert len(grads) == 2
    for captured, window in zip(grads, (batches[:3], batches[3:])):
        for name, grad in full_batch_gradient(window).items():
            torch.testing.assert_close(captured[name], grad, rtol=0, atol=1e-12)


def _ddp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        batches = make_micro_batches(4)
        mine = batches[2 * rank : 2 * rank + 2]  # sharding: rank r reads the r-th slice of the window
        capture = GradCapture()
        engine = make_engine(
            make_model(),
            mine,
            global_batch_size=4 * MICRO,
            micro_batch_size=MICRO,
            num_samples=4 * MICRO,
            world_size=world,
            rank=rank,
            hooks=[capture],
            **{"data.num_classes": CLASSES},
        )
        reductions = []

        def counting_allreduce(process_group, bucket):
            reductions.append(bucket.index())
            return default_hooks.allreduce_hook(process_group, bucket)

        engine.state.run.train_model.register_comm_hook(None, counting_allreduce)
        engine.run()
        result = {"grads": capture.grads, "micro_steps": engine.state.micro_step, "steps": engine.state.step, "reductions": reductions}
        torch.save(result, pathlib.Path(out_dir) / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.dist
def test_ddp_two_ranks_accumulating_equal_full_batch_gradient(tmp_path):
    mp.spawn(_ddp_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    expected = full_batch_gradient(make_micro_batches(4))
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt")  # the body ran: its file exists
        assert result["micro_steps"] == 2 and result["steps"] == 1
        assert result["reductions"] == [0]  # one all-reduce per step: no_sync on the first micro-step
        for name, grad in expected.items():
            torch.testing.assert_close(result["grads"][name], grad, rtol=0, atol=1e-12)
