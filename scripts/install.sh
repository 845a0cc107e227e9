#!/usr/bin/env bash
# Install everything largebatch, its demo and its tests need, on a fresh Debian machine:
# system packages (as root: the Fashion-MNIST dataset package; Slurm, munge and Open MPI for
# the launch tests), a virtual environment in .venv with the pinned versions of
# constraints.txt, and the Fashion-MNIST TFRecord shards.
# Safe to re-run: finished steps are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
# dataset-fashion-mnist: the demo data; slurm*, munge, openmpi-bin: the Slurm and MPI launch tests.
APT_PACKAGES=(dataset-fashion-mnist slurmctld slurmd slurm-client munge openmpi-bin)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "error: missing Debian packages ${missing[*]}; run: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# An older .venv may hold DALI's CUDA 12 build: both provide nvidia.dali, keep one.
.venv/bin/python -m pip uninstall -q -y nvidia-dali-cuda120 2>/dev/null || true
.venv/bin/python -m pip install -q -c constraints.txt -e '.[dev,dali,tensorboard]'

.venv/bin/python data/prepare_fmnist.py
