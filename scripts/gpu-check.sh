#!/usr/bin/env bash
# The GPU check: run on a bare single-GPU machine (no network) from the repository root,
# with .gpu-carry/ made by scripts/gpu-pack.sh carried beside the checkout (GPU_CARRY_DIR
# names another folder; without one, the machine's Python must already hold largebatch's
# requirements).
#
#   bash scripts/gpu-check.sh OUT_DIR [BUDGET_SECONDS]
#
# 1. installs the carried wheels into a target folder (/tmp/largebatch-site) and puts it
#    and the checkout on PYTHONPATH (nothing is installed into the machine's Python);
# 2. writes OUT_DIR/env.txt: the GPU (nvidia-smi), Python, torch, Triton, timm versions;
# 3. converts the carried Fashion-MNIST files (or Debian's, where installed) into
#    data/fashion-mnist for section g, unless it is there;
# 4. runs `python -m bench --device cuda --budget BUDGET` (default 420 s): section a is
#    `pytest -m gpu`, then training, loaders, LAMB, ddp/fsdp, the demo; the report goes to
#    OUT_DIR/report.md after every section, every section's whole output (pytest's
#    included) to OUT_DIR/sections.log.
# Exit status: the suite's (0 all ran; 1 a section failed; 2 no GPU, and the reason).
#
# GPU_CHECK_DEVICE=cpu rehearses all of it on a machine without a GPU with the suite's
# CPU stand-in (`--device cpu --quick`); PYTHON picks the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${1:?usage: bash scripts/gpu-check.sh OUT_DIR [BUDGET_SECONDS]}
BUDGET=${2:-420}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
SITE=${GPU_CHECK_SITE:-/tmp/largebatch-site}
CARRY=${GPU_CARRY_DIR:-.gpu-carry}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
start=$(date +%s)
say() { echo "gpu-check: $* ($(( $(date +%s) - start )) s)"; }

wheels=("$CARRY"/wheels/*.whl)
if [ -e "${wheels[0]}" ]; then
  say "installing ${wheels[*]##*/} into $SITE"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}" \
    || { echo "error: the wheels in $CARRY/wheels do not install into $SITE with $PYTHON" >&2; exit 2; }
else
  say "no wheels in $CARRY/wheels (made by scripts/gpu-pack.sh): using $PYTHON's own packages"
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -q . && echo ' (with uncommitted changes)')"
  echo "cpus: $(nproc --all)"
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | sed 's/^/nvidia-smi: /'
  else
    echo "nvidia-smi: not found"
  fi
  "$PYTHON" - <<'PY' 2>&1
import platform, torch
print("python:", platform.python_version())
print("torch:", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
for name in ("triton", "timm", "torchvision", "numpy", "crc32c", "simplejpeg", "pytest"):
    try:
        module = __import__(name)
        print(f"{name}:", getattr(module, "__version__", "present"))
    except ImportError as err:
        print(f"{name}: missing ({err})")
try:
    import nvidia.dali
    print("dali:", nvidia.dali.__version__)
except ImportError:
    print("dali: missing (its wheel is too large to carry: DALI's GPU decoding is not measured)")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device:", p.name, f"sm_{p.major}{p.minor}", p.multi_processor_count, "SMs", f"{p.total_memory / 2**30:.1f} GiB")
import largebatch
print("largebatch:", largebatch.__version__, "imports")
PY
} > "$OUT/env.txt"
cat "$OUT/env.txt"

if [ ! -f data/fashion-mnist/dataset.json ]; then
  src=$CARRY/fashion-mnist
  [ -f "$src/train-images-idx3-ubyte.gz" ] || src=/usr/share/datasets/fashion-mnist
  if [ -f "$src/train-images-idx3-ubyte.gz" ]; then
    say "converting Fashion-MNIST from $src"
    "$PYTHON" data/prepare_fmnist.py --src "$src" > "$OUT/prepare-fmnist.log" 2>&1 \
      || { tail -5 "$OUT/prepare-fmnist.log"; say "Fashion-MNIST not prepared: section g will say so"; }
  else
    say "no Fashion-MNIST files in $CARRY/fashion-mnist or Debian's folder: section g will say so"
  fi
fi

quick=()
[ "$DEVICE" = cpu ] && quick=(--quick)
say "python -m bench --device $DEVICE ${quick[*]} --budget $BUDGET"
"$PYTHON" -m bench --device "$DEVICE" "${quick[@]}" --budget "$BUDGET" --out "$OUT/report.md" --log "$OUT/sections.log"
status=$?
say "done, status $status; report: $OUT/report.md"
exit $status
