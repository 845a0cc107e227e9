"""The adaptive batch's ``branch`` criterion: short forks at B and 2B from the exact state.

At each check of ``batch_schedule.type = 'adaptive'`` with ``criterion = 'branch'``
(``largebatch.batch_schedule``), every rank measures what the critical-batch study's
branch mode measures from a checkpoint (Merrill et al. 2025, "Critical Batch Size
Revisited", arXiv:2505.23971; ``largebatch.study.branches``), in-process:

1. the training state is copied in memory (the parameters, buffers and gradients, the
   optimizer's state and groups, the grad scaler, Python's, NumPy's and torch's global
   generators; the counters, the loader and the hooks are not touched by a fork);
2. the held-out loss ``L0`` of the model is measured on the evaluation split;
3. a fork trains ``branch_samples`` samples at the batch in force B, at a constant learning
   rate: the schedule's at the current position times the rule's multiplier at B
   (``BatchSchedule.lr_multiplier``, the section's ``lr_scaling``), and its held-out loss
   ``L(1)`` is measured; the state is restored, and a fork at 2B (the multiplier at 2B)
   trains on the same samples in the same order and gives ``L(2)``;
4. the state is restored exactly, and the study's rule decides (``batch_schedule.critical_k``,
   which ``largebatch.study.branches.critical`` applies to a study's branches):
   2B is efficient when ``L0 - L(2) >= (1 - branch_tolerance) (L0 - L(1))``. The criterion logged
   (``batch/criterion``) is that efficiency, ``(L0 - L(2)) / (L0 - L(1))``.

The forks' data is a second training loader over the training split, with a seed mixed
from the run's seed (``derive_seed(seed, BRANCH_DATA)``) and epoch ``decision x E``
(``E`` the epochs one fork spans): a function of the seed and the decision's index, and
the run's own loader never moves. The held-out loss is the study's: the evaluation split
(``data.eval_split``), whole, with the task's loss; a multi-epoch training loss over the
fork's last steps would be biased by the samples the model has just fitted.

Cost: each decision trains ``2 x branch_samples`` samples and evaluates the held-out
split three times (docs/large-batch.md, "The branch criterion").
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from largebatch import dtensors
from largebatch.batch_schedule import branch_efficiency, critical_k
from largebatch.engine.accumulation import micro_loss_weight, sync_context
from largebatch.errors import UserError
from largebatch.randomness import derive_seed, seeded_globals

# The fork's streams: mixed with the run's seed, apart from every other stream of the run.
BRANCH_DATA, BRANCH_FORWARD, BRANCH_MIXUP = 11, 12, 13


def heldout_loader(run: Any) -> Any:
    """A cached loader over the evaluation split (every sample once across ranks), as the
    study's branches and this criterion read the held-out loss."""
    from largebatch import data as data_mod

    cfg = run.config
    return data_mod.build_eval_loader(
        cfg.data,
        batch_size=cfg.eval.batch_size or cfg.micro_batch_size,
        rank=run.rank,
        world_size=run.world_size,
        device=run.backend.device,
        cache=True,
    )


def heldout_loss(run: Any, loader: Any) -> float | None:
    """The model's held-out loss over ``loader`` with the task's loss (None: not finite)."""
    value = float(run.task.evaluate(run.model, loader, run.backend, prefix="eval").get("eval/loss", math.nan))
    return value if math.isfinite(value) else None


class Snapshot:
    """An exact in-memory copy of what an optimizer step changes, restored in place (so the
    same tensors, wrapped by DDP, keep their identity)."""

    def __init__(self, run: Any) -> None:
        model, optimizer = run.model, run.optimizer
        _reshard(model)
        settle = getattr(optimizer, "settle", None)  # LAMB, LARS: what a skipped step changed on the host, put back
        if settle is not None:
            settle()
        self.params = list(model.parameters())
        self.tensors = [*self.params, *model.buffers()]
        self.values = [t.detach().clone() for t in self.tensors]
        self.grads = [None if p.grad is None else p.grad.detach().clone() for p in self.params]
        self.optimizer_state = {p: {k: _clone(v) for k, v in s.items()} for p, s in optimizer.state.items()}
        self.groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        self.scaler = None if run.scaler is None else copy.deepcopy(run.scaler.state_dict())
        self.generators = (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
        device = run.backend.device
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def restore(self, run: Any) -> None:
        _reshard(run.model)
        with torch.no_grad():
            for tensor, value in zip(self.tensors, self.values):
                tensor.copy_(value)
        for param, grad in zip(self.params, self.grads):
            param.grad = None if grad is None else grad.clone()
        optimizer = run.optimizer
        optimizer.state.clear()
        for param, state in self.optimizer_state.items():
            optimizer.state[param] = {k: _clone(v) for k, v in state.items()}
        for group, saved in zip(optimizer.param_groups, self.groups):
            group.update(copy.deepcopy(saved))
        if self.scaler is not None:
            run.scaler.load_state_dict(copy.deepcopy(self.scaler))
        python, numpy_state, torch_state = self.generators
        random.setstate(python)
        np.random.set_state(numpy_state)
        torch.random.set_rng_state(torch_state)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, run.backend.device)


def _reshard(model: torch.nn.Module) -> None:
    """Under FSDP2, put every module's sharded parameters back in place: an evaluation's
    forward leaves the root's unsharded until the next backward, and the copy is of the
    shards."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _clone(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)


class BranchCriterion:
    """The ``branch`` criterion of one run: its forks' loader and the held-out loader,
    built with the engine, before training starts (``close`` releases them).

    Raises:
        UserError: the evaluation split has no samples (the held-out loss needs it), or the
            parameters are sharded (fsdp, hsdp: the forks are not supported there).
    """

    def __init__(self, state: Any) -> None:
        from largebatch import data as data_mod

        run = state.run
        if data_mod.count_samples(run.config.data, "eval") == 0:
            raise UserError(
                f"batch_schedule.criterion 'branch' measures the held-out loss on data.eval_split {run.config.data.eval_split!r}, "
                "which has no samples; set data.eval_split to a split with samples, or use criterion 'noise_scale'"
            )
        self.loader = data_mod.build_train_loader(
            run.config.data, run.plan, rank=run.rank, seed=derive_seed(run.config.seed, BRANCH_DATA) % 2**31, device=run.backend.device
        )
        self.heldout = heldout_loader(run)

    def close(self) -> None:
        for loader in (self.loader, self.heldout):
            close = getattr(loader, "close", None)
            if close is not None:
                close()

    def measure(self, state: Any, decision: int) -> tuple[float, bool]:
        """Fork at B and 2B from the current state, restore it, and return ``(efficiency of
        2B, whether 2B is efficient)`` by the study's rule (``batch_schedule.critical_k``)."""
        run = state.run
        schedule, batch = run.batch.schedule, run.batch.batch
        run.guard.settle()  # the step just taken is the fork's start: its update is settled
        snapshot = Snapshot(run)
        position = schedule.position(state.samples_seen, state.step)
        base_lr = run.schedule.lr_between(position, position + batch / schedule.reference_batch)
        try:
            start = heldout_loss(run, self.heldout)
            losses = {}
            for k in (1, 2):
                self._fork(state, decision, k * batch, base_lr * run.batch.lr_multiplier(k * batch))
                end = heldout_loss(run, self.heldout)
                losses[k] = math.inf if end is None else end  # a diverged fork is worse than any
                snapshot.restore(run)
        finally:
            snapshot.restore(run)
        efficiency = None if start is None else branch_efficiency(start, losses)
        if efficiency is None:  # no start, or the B fork made no progress: nothing to compare with
            return math.nan, False
        return efficiency[2], critical_k(efficiency, batch, schedule.branch_tolerance)[0] == 2

    def _fork(self, state: Any, decision: int, batch: int, lr: float) -> None:
        """Train ``branch_samples`` samples at ``batch`` with a constant ``lr``."""
        run = state.run
        schedule, optimizer, model = run.batch.schedule, run.optimizer, run.train_model
        window = schedule.accumulation(batch)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if schedule.keep_wd_timescale:
            from largebatch.batch_schedule import apply_weight_decay

            apply_weight_decay(optimizer, schedule.weight_decay_multiplier(batch))
        micro_batches = self._micro_batches(run, decision)
        mixup = np.random.Generator(np.random.PCG64(derive_seed(run.random.seed, run.rank, decision, BRANCH_MIXUP)))
        sync_all = run.config.dist.reduce_every_micro_batch
        with seeded_globals(derive_seed(run.random.seed, run.rank, decision, BRANCH_FORWARD), run.backend.device):
            for _ in range(schedule.branch_samples // batch):
                optimizer.zero_grad(set_to_none=True)
                for micro in range(window):
                    images, labels = next(micro_batches)
                    mixed = run.mixup(images, labels, rng=mixup)
                    with sync_context(model, micro, window, sync_first=state.sync_first_micro, sync_all=sync_all):
                        with run.backend.autocast():
                            loss = run.task.loss(run.task.forward(model, mixed.images), mixed) * micro_loss_weight(window)
                        (run.scaler.scale(loss) if run.scaler else loss).backward()
                    run.backend.after_backward()
                self._update(run)
        optimizer.zero_grad(set_to_none=True)

    def _micro_batches(self, run: Any, decision: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The forks' micro-batches: epochs ``decision x E, ...`` of the forks' loader."""
        per_epoch = len(self.loader)
        needed = run.batch.schedule.branch_samples // run.batch.schedule.unit
        epochs = math.ceil(needed / per_epoch)
        for epoch in range(decision * epochs, (decision + 1) * epochs):
            self.loader.set_epoch(epoch)
            yield from self.loader

    @staticmethod
    def _update(run: Any) -> None:
        """Unscale, clip to ``clip_grad_norm`` and step, as a training step does (no
        non-finite check: a fork that diverges has an infinite loss, and is undone)."""
        optimizer = run.optimizer
        if run.scaler:
            run.scaler.unscale_(optimizer)
        max_norm = run.config.clip_grad_norm
        if max_norm:
            params = [p for p in run.model.parameters() if p.grad is not None]
            run.backend.clip_grad_norm(params, max_norm, dtensors.grad_norms([p.grad for p in params]))
        if run.scaler:
            run.scaler.step(optimizer)
            run.scaler.update()
        else:
            optimizer.step()
        run.backend.after_optimizer_step()
