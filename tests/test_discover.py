"""Rank discovery from each launcher's environment variables (largebatch.dist.discover).

The variables are the launchers' documented interface: torchrun, Open MPI's mpirun
(run for real in tests/test_mpi.py), MPICH / Intel MPI's Hydra mpiexec and Slurm's srun
(run for real in tests/test_slurm.py)."""

from __future__ import annotations

import pytest

from largebatch.dist import DistInfo, discover
from largebatch.errors import UserError

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
OPENMPI = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "5"}
MPICH = {"PMI_RANK": "6", "PMI_SIZE": "12", "MPI_LOCALRANKID": "2"}
SLURM = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (0, 1, 0, None)),
        (TORCHRUN, (3, 8, 1, "torchrun")),
        (OPENMPI, (5, 16, 5, "openmpi")),
        (MPICH, (6, 12, 2, "mpich")),
        (SLURM, (0, 4, 0, "slurm")),
        # mpirun/mpiexec inside an sbatch allocation: every rank inherits SLURM_PROCID=0
        ({**SLURM, **OPENMPI}, (5, 16, 5, "openmpi")),
        ({**SLURM, **MPICH}, (6, 12, 2, "mpich")),
        # srun torchrun: torchrun's variables are the workers'
        ({**SLURM, **TORCHRUN}, (3, 8, 1, "torchrun")),
        ({"WORLD_SIZE": "1"}, (0, 1, 0, None)),  # a stray WORLD_SIZE=1 is harmless
        ({"PMI_RANK": "0", "PMI_SIZE": "4"}, (0, 1, 0, None)),  # Hydra without its local rank: not a launch we know
    ],
)
def test_each_launcher_is_read(env, expected):
    info = discover(env)
    assert (info.rank, info.world_size, info.local_rank) == expected[:3]
    if expected[3] is not None:
        assert info.launcher == expected[3]
    else:
        assert info == DistInfo()


@pytest.mark.parametrize(
    ("env", "fragments"),
    [
        ({"PMI_RANK": "12", "PMI_SIZE": "12", "MPI_LOCALRANKID": "0"}, ["PMI_RANK=12", "outside 0..11"]),
        ({"PMI_RANK": "x", "PMI_SIZE": "12", "MPI_LOCALRANKID": "0"}, ["PMI_RANK", "not integers"]),
        ({"RANK": "0", "WORLD_SIZE": "2"}, ["LOCAL_RANK", "torchrun"]),
        ({"LOCAL_RANK": "0"}, ["RANK and WORLD_SIZE are not"]),
    ],
)
def test_impossible_launches_are_named(env, fragments):
    with pytest.raises(UserError) as info:
        discover(env)
    for fragment in fragments:
        assert fragment in str(info.value)
