"""Writing checkpoints while training goes on (``checkpoint.async_save``).

A synchronous save holds the training loop for the whole write: serialising the model
and optimizer state, writing it and fsync'ing it. An asynchronous one holds it only
while the state is copied into host memory (staged, with the stager of
``torch.distributed.checkpoint.staging``), then writes that copy on a background thread,
through the same code as a synchronous save (``largebatch.checkpoint.prepare_checkpoint``):
a temporary name, fsync, rename, ``latest``, pruning. So a checkpoint is never seen
half-written, and a process killed during the write leaves the previous checkpoint the
newest complete one.

Rules:

- one save at a time: a save first waits for the one before it, so at most one
  write is in flight and the staging buffers are free to be reused;
- the end of training (``after_train``, reached at the end of a run and after a stop or
  a preemption signal) waits for the save in flight, so a run exits, and a preempted
  job is requeued, only once its last checkpoint is complete; an error ends the same way;
- a sharded write's collectives (DCP's plan and the final barrier) run on a gloo process
  group of their own, made at the first save, so they never interleave with the
  training's collectives on the default group;
- a write that fails raises at the next wait, naming the step it was saving.

The cost is memory: the staged copy is this rank's share of the checkpoint (under
``ddp`` rank 0 holds the whole model and optimizer state; under ``fsdp``/``hsdp`` every
rank its slices), kept in host memory for the rest of the run and reused by every save.
"""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING, Any

from largebatch.errors import UserError

if TYPE_CHECKING:  # checking a config builds this hook without importing torch
    from collections.abc import Sequence

    from largebatch.checkpoint import CheckpointedHook, CheckpointedState


class CheckpointWriter:
    """Saves checkpoints now (``asynchronous=False``) or on a background thread.

    Args:
        asynchronous: stage a host-memory copy and write it on a thread.
    """

    def __init__(self, asynchronous: bool) -> None:
        self.asynchronous = asynchronous
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._stager: Any = None
        self._group: Any = None
        self._in_flight: tuple[int, concurrent.futures.Future] | None = None

    def save(self, state: CheckpointedState, hooks: Sequence[CheckpointedHook], keep: int) -> None:
        """Save the run's checkpoint (collective: every rank calls it).

        Raises:
            UserError: the weights hold NaN or inf (see ``check_finite``).
            RuntimeError: the previous asynchronous save failed.
        """
        # imported here: checking a config builds this hook without importing torch
        from largebatch.checkpoint import check_finite, prepare_checkpoint, save_checkpoint

        self.wait()
        if not self.asynchronous:
            save_checkpoint(state, hooks, keep)
            return
        check_finite(state)
        write = prepare_checkpoint(state, hooks, keep, stage=self._stage, group=self._save_group(state))
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="largebatch-checkpoint")
        self._in_flight = (state.step, self._executor.submit(write))

    def wait(self) -> None:
        """Block until the save in flight, if any, is complete.

        Raises:
            UserError: the save was refused; RuntimeError: it failed. Either way the
                checkpoints before it are intact.
        """
        if self._in_flight is None:
            return
        step, future = self._in_flight
        self._in_flight = None
        try:
            future.result()
        except UserError as exc:  # refused (what it holds would not read back as data): still one error line
            raise UserError(f"the checkpoint of step {step}, written in the background, was refused: {exc.render()}") from exc
        except Exception as exc:
            raise RuntimeError(
                f"the checkpoint of step {step}, written in the background, failed ({type(exc).__name__}: {exc}); "
                "the checkpoints before it are intact"
            ) from exc

    def close(self) -> None:
        """Wait for the save in flight, then release the thread and the staging buffers."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            if self._stager is not None:
                self._stager.close()
                self._stager = None

    def _stage(self, obj: Any) -> Any:
        """A host-memory copy of ``obj``'s tensors (and of everything else in it)."""
        if self._stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            self._stager = DefaultStager(
                StagingOptions(use_pinned_memory=False, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=False)
            )
        return self._stager.stage(obj)

    def _save_group(self, state: CheckpointedState) -> Any:
        """The sharded writes' own process group (every rank makes it at the first save)."""
        import torch.distributed as torch_dist

        from largebatch.checkpoint import uses_sharded_format

        if self._group is None and uses_sharded_format(state.run.config) and torch_dist.is_initialized():
            self._group = torch_dist.new_group(backend="gloo")
        return self._group
