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


@pytest.fixture
def preemption_handlers_restored():
    """For tests that call train.py's entry point in this process: it installs the
    preemption signal handlers, which are put back (and any caught signal forgotten) after."""
    import signal

    from largebatch import preemption

    saved = {sig: signal.getsignal(sig) for sig in preemption.PREEMPTION_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    preemption.clear()


# Multi-process runs (preemption, Slurm, MPI, node loss) share these.

TORCHRUN = str(pathlib.Path(sys.executable).with_name("torchrun"))
SIGNAL_HOOKS = str(REPO / "tests/support/signals.py")
RANK_WEIGHTS = str(REPO / "tests/support/rank_weights.py") + ":SaveRankWeights"
PLACEMENT = str(REPO / "tests/support/placement.py") + ":RecordPlacement"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def resume_config(**overrides) -> dict:
    """Two epochs of 4 steps with mixup and dropout: resuming must restore every generator."""
    return tiny_config(**{"epochs": 2, "mixup.mixup_alpha": 0.4, "model.drop_rate": 0.1, **overrides})


def hooks_override(*hooks: dict | str) -> str:
    """A ``--set hooks=[...]`` argument (hooks are free to change on resume)."""
    import json

    return "hooks=" + json.dumps(list(hooks))


def assert_same_weights(a: pathlib.Path, b: pathlib.Path) -> None:
    import torch
    from safetensors.torch import load_file

    first, second = load_file(a), load_file(b)
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), f"{a} and {b} differ in {key}"


def torchrun_reference(root: pathlib.Path, cfg: dict, ranks: int, *hooks: dict | str) -> pathlib.Path:
    """An uninterrupted ``torchrun --standalone --nproc_per_node=RANKS`` run of ``cfg`` in
    ``root/run`` (with ``hooks``), checked to have ended well; its run directory."""
    config = write_config(root, cfg)
    run_dir = root / "run"
    cmd = [
        TORCHRUN,
        "--standalone",
        f"--nproc_per_node={ranks}",
        str(REPO / "train.py"),
        "--config",
        str(config),
        "--run-dir",
        str(run_dir),
    ]
    cmd += ["--set", hooks_override(*hooks)] if hooks else []
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=clean_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="session")
def two_rank_reference(tmp_path_factory) -> pathlib.Path:
    """An uninterrupted ``torchrun --standalone --nproc_per_node=2`` run of ``resume_config()``;
    the run directory (``model.safetensors``, ``rank0/1.safetensors``)."""
    run_dir = torchrun_reference(tmp_path_factory.mktemp("two-rank-reference"), resume_config(), 2, RANK_WEIGHTS)
    assert_same_weights(run_dir / "rank0.safetensors", run_dir / "rank1.safetensors")
    return run_dir


@pytest.fixture(scope="session")
def fsdp_two_rank_reference(tmp_path_factory) -> pathlib.Path:
    """``two_rank_reference`` under ``dist.strategy='fsdp'`` (``model.safetensors`` only:
    each rank holds slices)."""
    return torchrun_reference(tmp_path_factory.mktemp("fsdp-two-rank-reference"), resume_config(**{"dist.strategy": "fsdp"}), 2)


def four_rank_config() -> dict:
    """``resume_config()`` with LAMB and clipping, for four ranks (accumulation 1). LAMB's
    eps keeps the attention's key bias, whose gradient is rounding noise, from moving, so
    the sharded and replicated runs agree within rounding (AdamW amplifies that noise)."""
    return resume_config(**{"optimizer": {"type": "lamb", "lr": 0.01, "weight_decay": 0.05}, "clip_grad_norm": 1.0})


@pytest.fixture(scope="session")
def four_rank_reference(tmp_path_factory) -> pathlib.Path:
    """An uninterrupted ``torchrun --standalone --nproc_per_node=4`` run of ``four_rank_config()``."""
    run_dir = torchrun_reference(tmp_path_factory.mktemp("four-rank-reference"), four_rank_config(), 4, RANK_WEIGHTS)
    for rank in (1, 2, 3):
        assert_same_weights(run_dir / "rank0.safetensors", run_dir / f"rank{rank}.safetensors")
    return run_dir


def placements(run_dir: pathlib.Path, world_size: int) -> list[dict]:
    """What ``tests/support/placement.py`` recorded for each rank, in rank order."""
    import json

    return [json.loads((run_dir / f"placement-rank{rank}.json").read_text()) for rank in range(world_size)]


def wait_for_pause(proc: subprocess.Popen, paused: pathlib.Path, timeout: float = 240) -> None:
    """Wait until ``tests/support/pausing_save.py`` run by ``proc`` has paused mid-save."""
    import time

    deadline = time.monotonic() + timeout
    while not paused.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert paused.exists(), proc.communicate(timeout=5) if proc.poll() is not None else "the save never paused"


def logged_steps(run_dir: pathlib.Path) -> list[int]:
    """The steps ``metrics.jsonl`` holds a training record of, in order."""
    import json

    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [record["step"] for record in map(json.loads, lines) if "loss" in record]


def assert_held_or_not_by_the_paused_save(proc: subprocess.Popen, run_dir: pathlib.Path, async_save: bool) -> None:
    """With the save of step 4 paused (``pausing_save.py``, saves every 2 steps): a
    synchronous save holds the loop (steps up to 3 logged; the logger runs after the
    checkpoint hook); an asynchronous one lets training go on (4 and 5 logged) until the
    save of step 6 waits for it."""
    import time

    last = 5 if async_save else 3
    deadline = time.monotonic() + 120
    while max(logged_steps(run_dir), default=0) < last and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # a loop that did not wait would log more steps meanwhile
    assert proc.poll() is None, "the run ended while its save was paused"
    assert max(logged_steps(run_dir), default=0) == last, logged_steps(run_dir)


@pytest.fixture
def signal_handlers():
    """The handlers ``train.py`` installs first thing, restored afterwards."""
    import signal

    from largebatch import preemption

    saved = {sig: signal.getsignal(sig) for sig in preemption.PREEMPTION_SIGNALS}
    preemption.clear()
    preemption.install_signal_handlers()
    yield
    preemption.clear()
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def load_and_validate(path, overrides=None) -> dict:
    """A config file (with ``--set`` overrides) validated, as the plain dict: what a test
    compares key by key (runs get the typed config from ``largebatch.config.resolve_config``)."""
    from largebatch.config import load_config, validate

    return validate(load_config(path, overrides))


def model_of(cfg, **kwargs):
    """``largebatch.models.build_model`` for a config dict (validated and typed here)."""
    from largebatch.config.typed import typed
    from largebatch.models import build_model

    typed_cfg = typed(cfg)
    return build_model(typed_cfg.model, typed_cfg.data, **kwargs)


def derived_of(cfg, world_size: int, num_samples: int) -> dict:
    """``largebatch.config.derive`` for a config dict, as the dict ``config show`` prints."""
    from largebatch.config import derive
    from largebatch.config.typed import typed

    return derive(typed(cfg), world_size, num_samples).to_dict()


def wait_until(predicate, timeout: float, what: str, every: float = 0.5):
    """Poll ``predicate`` until it returns something true (returned), or fail after ``timeout`` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def _slurm_cluster(tmp_path_factory, nodes: int):
    from tests.support.slurm_cluster import BINARIES, PACKAGES, SlurmCluster, ensure_installed, private_hosts_reason

    reason = ensure_installed(PACKAGES, BINARIES) or (private_hosts_reason() if nodes > 1 else None)
    if reason:
        pytest.skip(f"no Slurm cluster of {nodes} node(s): {reason}")
    cluster = SlurmCluster(tmp_path_factory.mktemp(f"slurm-{nodes}-nodes"), nodes=nodes)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real one-node Slurm cluster for the session (``tests/support/slurm_cluster.py``)."""
    yield from _slurm_cluster(tmp_path_factory, 1)


@pytest.fixture(scope="session")
def slurm_two_nodes(tmp_path_factory):
    """A real Slurm cluster of two nodes, ``lbn1`` and ``lbn2``, on this machine."""
    yield from _slurm_cluster(tmp_path_factory, 2)
