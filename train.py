"""Entry point: ``torchrun --nproc_per_node=8 train.py --config configs/vit-b16.py``.

The same as ``largebatch train ...``; see the README for the options.
"""

import sys

from largebatch.cli import train_main

if __name__ == "__main__":
    sys.exit(train_main())
