"""A custom hook (loaded by path in tests) that records where each rank runs: what
``largebatch.dist`` discovered, the node Slurm placed it on, the rendezvous address and
what it resolves to, under fsdp/hsdp the ranks of its shard group, and which checkout
of largebatch it imported."""

import json
import os
import socket

import torch.distributed as torch_dist

import largebatch
from largebatch.engine.hook import Hook


class RecordPlacement(Hook):
    def before_train(self, state):
        run = state.run
        record = {
            "rank": run.dist.rank,
            "world_size": run.dist.world_size,
            "local_rank": run.dist.local_rank,
            "launcher": run.dist.launcher,
            "node_id": os.environ.get("SLURM_NODEID"),
            "group_rank": os.environ.get("GROUP_RANK"),  # torchrun's node rank
            "node_name": os.environ.get("SLURMD_NODENAME"),
            "nodelist": os.environ.get("SLURM_JOB_NODELIST"),
            "master_addr": os.environ.get("MASTER_ADDR"),
            "master_ip": socket.gethostbyname(os.environ["MASTER_ADDR"]),
            "shard_group": None,
            "package": largebatch.__file__,
        }
        mesh = getattr(next(run.model.parameters()), "device_mesh", None)  # a sharded parameter's mesh
        if mesh is not None:
            record["shard_group"] = torch_dist.get_process_group_ranks(mesh.get_group("shard"))
        (run.run_dir / f"placement-rank{run.dist.rank}.json").write_text(json.dumps(record))
