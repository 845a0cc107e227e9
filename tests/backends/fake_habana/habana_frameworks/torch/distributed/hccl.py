"""Stand-in for ``habana_frameworks.torch.distributed.hccl``: records its import (with the
rank variables it would read) and ``initialize_distributed_hpu``. Registers no backend."""

import os

from habana_frameworks._record import record

record("import hccl", **{k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")})


def initialize_distributed_hpu(world_size=None, rank=None, local_rank=None):
    record("initialize_distributed_hpu", world_size=world_size, rank=rank, local_rank=local_rank)
    return world_size, rank, local_rank
