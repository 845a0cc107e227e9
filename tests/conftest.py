"""Shared test helpers: tiny configs, and running the command line in a subprocess."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def tiny_config(**overrides) -> dict:
    """A config that trains a 2-block ViT on 16 px synthetic images in about a second."""
    cfg = {
        "seed": 0,
        "device": "cpu",
        "epochs": 1,
        "global_batch_size": 32,
        "micro_batch_size": 8,
        "model": {"name": "vit_tiny_patch16_224", "patch_size": 4, "embed_dim": 32, "depth": 1, "num_heads": 2, "mlp_ratio": 2.0},
        "optimizer": {"type": "adamw", "lr": 1e-3},
        "lr_schedule": {"type": "cosine", "warmup_steps": 1},
        "data": {
            "loader": "synthetic",
            "image_size": 16,
            "channels": 3,
            "num_classes": 4,
            "train_samples": 128,
            "eval_samples": 32,
            "mean": [0.0, 0.0, 0.0],
            "std": [1.0, 1.0, 1.0],
        },
        "log": {"interval": 1, "console": False},
        "checkpoint": {"interval_epochs": 0, "at_end": False},
    }
    for key, value in overrides.items():
        node = cfg
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return cfg


def write_config(tmp_path: pathlib.Path, cfg: dict, name: str = "config.yaml") -> pathlib.Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without launcher variables (so a test never inherits a rank)."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("SLURM_", "OMPI_", "TORCHELASTIC_"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def run_cli(*args: str, cwd: pathlib.Path | None = None, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m largebatch ARGS`` (or ``python train.py`` when args[0] is 'train.py')."""
    if args and args[0] == "train.py":
        cmd = [PYTHON, str(REPO / "train.py"), *args[1:]]
    else:
        cmd = [PYTHON, "-m", "largebatch", *args]
    return subprocess.run(cmd, cwd=cwd or REPO, capture_output=True, text=True, timeout=timeout, env=env or clean_env())


@pytest.fixture(autouse=True)
def _no_launcher_env(monkeypatch):
    for key in list(os.environ):
        if key in ("RANK", "WORLD_SIZE", "LOCAL_RANK") or key.startswith(("SLURM_", "OMPI_")):
            monkeypatch.delenv(key)
