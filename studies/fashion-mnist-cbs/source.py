"""The source run of the critical-batch-along-training study (studies/fashion-mnist-cbs).

    python studies/fashion-mnist-cbs/source.py      # from the repository root: runs/fashion-mnist-cbs-source

LAMB at batch 256 with the first study's choice for that cell (studies/fashion-mnist,
trial #3: lr 0.0157, warmup 0.0296 of the run, beta1 0.801, 4 epochs of cosine), the study
file's model and data, trained on the study's carved training split (its held-out shard is
never trained on: the branches measure their loss there), one thread, a checkpoint every
20 steps and the ``noise_scale`` hook (B_simple beside the critical batch). About two CPU
minutes.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

FOLDER = pathlib.Path(__file__).resolve().parent
REPO = FOLDER.parent.parent
RUN = REPO / "runs" / "fashion-mnist-cbs-source"
CHOICE = [  # studies/fashion-mnist/study.db, trial #3 (lamb/b256/q3), the cell's choice for 78%
    "optimizer.lr=0.0156617",
    "lr_schedule.warmup_epochs=0.118502",  # 0.0296255 of 4 epochs
    "optimizer.betas=[0.800604, 0.999]",
    "epochs=4",
]


def main() -> int:
    from largebatch.study import checks
    from largebatch.study.spec import load_study

    spec = load_study(FOLDER / "study.py")
    checks.prepare(spec)  # carves the held-out split into the study's data folder, as `study run` does
    sets = [
        *spec.overrides,
        "global_batch_size=256",
        "micro_batch_size=32",  # an eighth of the batch (the noise_scale hook's min_ratio)
        "seed=0",
        *CHOICE,
        f"data.root={FOLDER / 'data'}",
        f"data.eval_split={spec.data['heldout']}",
        "eval.interval_epochs=1",
        "checkpoint.interval_epochs=0",
        "checkpoint.interval_steps=20",
        "checkpoint.keep=100",
        'hooks=[{"type": "noise_scale"}]',
    ]
    argv = [sys.executable, "-m", "largebatch", "train", "--config", str(spec.base_config), "--run-dir", str(RUN)]
    argv += [a for s in sets for a in ("--set", s)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(argv, env=env, cwd=REPO, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
