#!/bin/bash
# mpirun launches, as Habana's reference scripts use. Not meant to be run as a whole:
# copy the line you need. Ranks come from OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK
# (read before any SLURM_* variable, which every mpirun rank inherits inside an sbatch
# allocation). MASTER_ADDR defaults to the first host of a Slurm job, else 127.0.0.1.
set -euo pipefail

CONFIG=${CONFIG:-configs/vit-b16.py}

# One Gaudi node, 8 HPUs (hccl). --allow-run-as-root only where jobs run as root
# (containers); --map-by socket:PE=6 gives each rank 6 cores for its data pipeline.
mpirun -n 8 --bind-to core --map-by socket:PE=6 --rank-by core --report-bindings --allow-run-as-root \
    python train.py --config "$CONFIG" --set device=hpu --run-dir runs/vit-b16-hpu --resume auto

# Two Gaudi nodes: a hostfile with 8 slots each, the first host as rendezvous.
#   printf 'gaudi1 slots=8\ngaudi2 slots=8\n' > hostfile
mpirun -n 16 --hostfile hostfile --map-by ppr:4:socket:PE=6 --bind-to core --allow-run-as-root \
    -x MASTER_ADDR=gaudi1 -x MASTER_PORT=29500 -x PYTHONPATH \
    python train.py --config "$CONFIG" --set device=hpu --run-dir runs/vit-b16-hpu-2nodes --resume auto

# One CPU machine, 2 ranks (what tests/test_mpi.py runs).
mpirun -n 2 --bind-to none --allow-run-as-root \
    python train.py --config configs/demo/vit-tiny-synthetic.py --run-dir runs/mpi-demo

# Inside an sbatch allocation (e.g. in slurm/hpu-1node.sbatch instead of srun): a
# preempted run exits 75 and, with --set slurm.requeue=true, rank 0 requeues the job.
#   mpirun -n "$SLURM_NTASKS" --allow-run-as-root python train.py --config "$CONFIG" \
#       --run-dir "runs/$SLURM_JOB_NAME-$SLURM_JOB_ID" --resume auto --set slurm.requeue=true
