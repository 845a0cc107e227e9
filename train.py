"""Entry point: ``torchrun --nproc_per_node=8 train.py --config configs/vit-b16.py``.

The same as ``largebatch train ...``; the options are in ``docs/training.md``. Exit status:
0 when training is done, 2 for a user mistake, 75 when a preemption signal (SIGUSR1,
SIGTERM) stopped the run after a checkpoint (requeue it; ``docs/clusters.md``).
"""

import sys

# First, before torch and timm load (seconds): until Python has a handler, SIGUSR1 or
# SIGTERM from the scheduler kills the process instead of asking it to checkpoint.
from largebatch.preemption import install_signal_handlers

install_signal_handlers()

from largebatch.train_command import train_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(train_main())
