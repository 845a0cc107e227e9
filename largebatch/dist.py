"""Rank discovery and process-group setup.

Launchers announce ranks through different environment variables. They are read in
this order, the first complete set winning:

1. torchrun: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (also ``srun torchrun ...``);
2. Open MPI: ``OMPI_COMM_WORLD_RANK``, ``_SIZE``, ``_LOCAL_RANK`` (``mpirun``; inside an
   sbatch allocation every mpirun rank also inherits ``SLURM_PROCID=0``, so MPI must be
   read before Slurm);
3. MPICH and Intel MPI (Hydra): ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``
   (``mpiexec``; read before Slurm for the same reason);
4. Slurm: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID`` (``srun python train.py``).

Under MPI and Slurm, ``MASTER_ADDR`` defaults to the first host of the job
(``scontrol show hostnames $SLURM_JOB_NODELIST``) or to 127.0.0.1 on one node, and
``MASTER_PORT`` to a port derived from the Slurm job id (so two jobs sharing a node do
not collide) or 29500. A single process with none of these runs without a process group.

Under torchrun (torch >= 2.5) the workers do not host the process group's store: the
elastic agent does, at ``MASTER_ADDR:MASTER_PORT`` (``TORCHELASTIC_USE_AGENT_STORE=True``),
and the agent keeps that one store, port and contents, across worker restarts. The keys
the previous attempt's processes wrote stay in it, among them each rank's gloo (or NCCL)
address: a restarted rank that reaches ``init_process_group`` before its peer has
written its new address reads the dead process's one, and when gloo makes it the side
of the pair that connects, it fails ("Connection refused" in ``connectFullMesh``; NCCL
can likewise read the previous attempt's unique id). ``TORCHELASTIC_RESTART_COUNT`` cannot name the attempt: each
agent counts its own restarts, and an agent restarted because another node failed does
not count one. So the ranks of an attempt agree on a fresh generation number through the
store itself (``_attempt_store``) and the process group keeps its keys under it.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import subprocess
import time
import uuid
from typing import TYPE_CHECKING

from largebatch.errors import UserError

if TYPE_CHECKING:  # torch is imported where a process group is used: discovering ranks needs none
    import torch
    import torch.distributed as torch_dist


@dataclasses.dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launcher: str = "single"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _ints(env: dict[str, str], *names: str) -> tuple[int, ...] | None:
    if not all(name in env for name in names):
        return None
    try:
        return tuple(int(env[name]) for name in names)
    except ValueError as exc:
        raise UserError(f"launcher variables {', '.join(names)} are not integers: {exc}") from exc


def discover(env: dict[str, str] | None = None) -> DistInfo:
    """Read this process's rank, world size and local rank from the environment."""
    env = dict(os.environ if env is None else env)
    sources = (
        ("torchrun", ("RANK", "WORLD_SIZE", "LOCAL_RANK")),
        ("openmpi", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")),
        ("mpich", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID")),
        ("slurm", ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")),
    )
    torchrun = sources[0][1]
    present = [name for name in torchrun if name in env]
    if present and len(present) < len(torchrun) and env.get("WORLD_SIZE", "") != "1":
        missing = [name for name in torchrun if name not in env]
        raise UserError(
            f"{' and '.join(present)} {'is' if len(present) == 1 else 'are'} set but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not: launch with torchrun (it sets all three), set all three, "
            "or unset them for a single process"
        )
    for launcher, names in sources:
        values = _ints(env, *names)
        if values is not None:
            rank, world, local = values
            if not 0 <= rank < world:
                raise UserError(f"{names[0]}={rank} is outside 0..{world - 1} ({names[1]}={world})")
            return DistInfo(rank, world, local, launcher)
    return DistInfo()


def rendezvous_env(info: DistInfo, env: dict[str, str] | None = None) -> dict[str, str]:
    """``MASTER_ADDR`` / ``MASTER_PORT`` / ``RANK`` / ``WORLD_SIZE`` for ``env://`` init."""
    env = dict(os.environ if env is None else env)
    out = {"RANK": str(info.rank), "WORLD_SIZE": str(info.world_size), "LOCAL_RANK": str(info.local_rank)}
    if "MASTER_ADDR" not in env:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        out["MASTER_ADDR"] = _first_slurm_host(nodelist) if nodelist else "127.0.0.1"
    if "MASTER_PORT" not in env:
        job = env.get("SLURM_JOB_ID")
        out["MASTER_PORT"] = str(20000 + int(job) % 20000) if job and job.isdigit() else "29500"
    return out


def _first_slurm_host(nodelist: str) -> str:
    try:
        result = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise UserError(
            f"cannot expand SLURM_JOB_NODELIST={nodelist!r} with scontrol ({exc}); set MASTER_ADDR to the first node's address"
        ) from exc
    hosts = result.stdout.split()
    if not hosts:
        raise UserError(f"scontrol show hostnames {nodelist!r} printed no host; set MASTER_ADDR")
    return hosts[0]


def init_process_group(info: DistInfo, backend: str, timeout_minutes: float = 30.0) -> None:
    """Join the job's process group (no-op for a single process).

    Args:
        info: from ``discover()``.
        backend: ``gloo``, ``nccl`` or ``hccl`` (hccl needs Habana's
            ``habana_frameworks.torch.distributed.hccl`` imported first, which the HPU
            backend does).
        timeout_minutes: collective timeout.
    """
    import torch.distributed as torch_dist

    if not info.distributed or torch_dist.is_initialized():
        return
    os.environ.update(rendezvous_env(info))
    timeout = datetime.timedelta(minutes=timeout_minutes)
    options = {"backend": backend, "rank": info.rank, "world_size": info.world_size, "timeout": timeout}
    if info.launcher == "torchrun" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        agent_store = torch_dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), info.world_size, is_master=False, timeout=timeout
        )
        torch_dist.init_process_group(store=_attempt_store(agent_store, info.rank, info.world_size, timeout), **options)
    else:
        torch_dist.init_process_group(init_method="env://", **options)


_ATTEMPTS = "largebatch/attempts"


def _attempt_store(store: torch_dist.Store, rank: int, world_size: int, timeout: datetime.timedelta) -> torch_dist.Store:
    """A namespace of ``store`` that no earlier attempt of the job has written to.

    Rank 0 draws the next generation number (an atomic ``add``) and hands it to every
    other rank. It cannot simply publish it under a fixed key: a rank could read the
    previous attempt's value before rank 0 overwrites it. So each other rank posts a
    fresh random token under its rank and waits for the number under a key named by that
    token, which only this attempt's rank 0 can write; rank 0 answers every token it sees
    (a stale one is answered too, harmlessly) until each rank confirms under a key named
    by the new number.

    Raises:
        TimeoutError: when the ranks do not all arrive within ``timeout``.
    """
    import torch.distributed as torch_dist

    if rank == 0:
        generation = store.add(f"{_ATTEMPTS}/generation", 1)
        answered: set[str] = set()
        waiting = set(range(1, world_size))
        deadline = time.monotonic() + timeout.total_seconds()
        while waiting:
            for other in sorted(waiting):
                hello = f"{_ATTEMPTS}/hello/{other}"
                if store.check([hello]):
                    token = store.get(hello).decode()
                    if token not in answered:
                        store.set(f"{_ATTEMPTS}/answer/{token}", str(generation))
                        answered.add(token)
                if store.check([f"{_ATTEMPTS}/{generation}/ready/{other}"]):
                    waiting.discard(other)
            if waiting:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ranks {sorted(waiting)} did not join the process group within {timeout} (dist.timeout_minutes)")
                time.sleep(0.02)
    else:
        token = uuid.uuid4().hex
        store.set(f"{_ATTEMPTS}/hello/{rank}", token)
        answer = f"{_ATTEMPTS}/answer/{token}"
        store.wait([answer], timeout)
        generation = int(store.get(answer))
        store.set(f"{_ATTEMPTS}/{generation}/ready/{rank}", "1")
    return torch_dist.PrefixStore(f"{_ATTEMPTS}/{generation}/", store)


def destroy_process_group() -> None:
    import torch.distributed as torch_dist

    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def broadcast_object(obj, src: int = 0):
    """Rank ``src``'s ``obj`` on every rank (identity without a process group)."""
    import torch.distributed as torch_dist

    if not torch_dist.is_initialized():
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=src)
    return box[0]


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Mean over ranks, in place (identity without a process group)."""
    import torch.distributed as torch_dist

    if torch_dist.is_initialized():
        torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
        tensor /= torch_dist.get_world_size()
    return tensor


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over ranks, in place (identity without a process group)."""
    import torch.distributed as torch_dist

    if torch_dist.is_initialized():
        torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
    return tensor


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when ``flag`` is true on any (one tiny all-reduce; no
    collective without a process group). For decisions that must agree, such as one
    taken by a clock."""
    import torch
    import torch.distributed as torch_dist

    if not torch_dist.is_initialized():
        return bool(flag)
    box = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    torch_dist.all_reduce(box, op=torch_dist.ReduceOp.MAX)
    return bool(box.item())


def barrier() -> None:
    import torch.distributed as torch_dist

    if torch_dist.is_initialized():
        torch_dist.barrier()
