#!/usr/bin/env bash
# The README's first command: install everything, then run the demo (a small ViT on real
# Fashion-MNIST images, 2 CPU processes, a 512-sample global batch through accumulation).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/torchrun --standalone --nproc_per_node=2 train.py --config configs/demo/vit-tiny-fmnist.py --run-dir runs/demo "$@"
