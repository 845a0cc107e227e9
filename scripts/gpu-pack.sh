#!/usr/bin/env bash
# Make .gpu-carry/, what scripts/gpu-check.sh needs on a bare GPU machine that has no
# network: the wheels of largebatch's requirements such a machine lacks or holds too old
# (crc32c, simplejpeg; timm, whose 1.0.29 there cannot write config.json), built for its
# Python (3.12 by default; GPU_PYTHON_VERSION=3.11 for a rehearsal on this machine's
# Python), and Debian's Fashion-MNIST files for the demo.
# Run here, on a machine with pip's index; .gpu-carry/ is git-ignored and about 33 MB
# (GPU_CARRY_DIR names another folder).
#
#   bash scripts/gpu-pack.sh            # then carry .gpu-carry to the GPU machine
set -euo pipefail
cd "$(dirname "$0")/.."

PY_VERSION=${GPU_PYTHON_VERSION:-3.12}
PIP=${PIP:-$( [ -x .venv/bin/python ] && echo ".venv/bin/python -m pip" || echo "python3 -m pip" )}
# The versions this checkout's .venv holds; timm's from constraints.txt.
CRC32C=${CRC32C_VERSION:-2.9.post0}
SIMPLEJPEG=${SIMPLEJPEG_VERSION:-1.9.0}
TIMM=$(sed -n 's/^timm==//p' constraints.txt)
FMNIST=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
CARRY=${GPU_CARRY_DIR:-.gpu-carry}

rm -rf "$CARRY/wheels"
mkdir -p "$CARRY/wheels" "$CARRY/fashion-mnist"
for req in "crc32c==$CRC32C" "simplejpeg==$SIMPLEJPEG" "timm==$TIMM"; do
  $PIP download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$CARRY/wheels" "$req"
done
for name in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  if [ ! -f "$FMNIST/$name" ]; then
    echo "error: $FMNIST/$name is missing; install Debian's dataset-fashion-mnist (scripts/install.sh does)" >&2
    exit 2
  fi
  cp "$FMNIST/$name" "$CARRY/fashion-mnist/"
done
du -sh "$CARRY" | sed "s|\t.*| in $CARRY|"
ls "$CARRY/wheels"
