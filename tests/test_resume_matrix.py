"""Exact resume on every loader: a stopped and resumed run ends with the bytes of one that
was never stopped.

The matrix: loader {synthetic, native with 0 and 2 workers, native decoding on the device
(``data.decode='device'``, the CPU standing in for the GPU), DALI} x {dropout and
drop-path on, off} x stop point {mid-epoch, at an epoch boundary, a real SIGUSR1 in the
middle of an accumulation window}, and a batch ramp stopped just before and just after
its first batch change on every loader. Every cell compares ``model.safetensors`` byte for byte
with the uninterrupted run of the same loader; mixup and LAMB with clipping are on
throughout, so every random stream and every piece of optimizer state takes part. A
last test checks that the worker count does not change the result either.

Runs are in-process (``largebatch.launch.train``), each a few seconds on the CPU.
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
import torch

from largebatch import preemption
from largebatch.launch import TrainArgs, train
from tests.conftest import REPO, tiny_config, write_config
from tests.data.conftest import write_unique_label_shards

HAS_DALI = importlib.util.find_spec("nvidia.dali") is not None

LOADERS = {
    "synthetic": {"data.loader": "synthetic"},
    "native-0": {"data.loader": "native", "data.num_workers": 0},
    "native-2": {"data.loader": "native", "data.num_workers": 2},
    "native-device": {"data.loader": "native", "data.num_workers": 0, "data.decode": "device"},
    "dali": {"data.loader": "dali", "data.num_workers": 1},
}
DROPOUT = {
    "dropout": {
        "model.drop_rate": 0.1,
        "model.pos_drop_rate": 0.1,
        "model.proj_drop_rate": 0.1,
        "model.attn_drop_rate": 0.1,
        "model.drop_path_rate": 0.2,
    },
    "no-dropout": {},
}
# 64 samples / global batch 16 = 4 steps per epoch of 4 micro-batches; 2 epochs.
STOPS = {
    "mid-epoch": {"max_steps": 2},
    "epoch-boundary": {"max_steps": 4},
    # SIGUSR1 during micro-batch 2 of step index 5: the run finishes step 6 and checkpoints it.
    "signal-mid-window": {"hooks": [{"type": f"{REPO}/tests/support/signals.py:SendSignal", "step": 5, "micro": 2}]},
}
STOPPED_AT = {"mid-epoch": 2, "epoch-boundary": 4, "signal-mid-window": 6}


def loader_param(name: str):
    marks = []
    if name == "dali":
        marks = [pytest.mark.dali, pytest.mark.slow, pytest.mark.skipif(not HAS_DALI, reason="NVIDIA DALI is not installed")]
    elif name in ("native-2", "native-device"):
        marks = [pytest.mark.slow]
    return pytest.param(name, marks=marks)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> pathlib.Path:
    return write_unique_label_shards(tmp_path_factory.mktemp("shards"), {"train": 64, "validation": 8}, {"train": 4, "validation": 1})


def matrix_config(shards: pathlib.Path, loader: str, dropout: str) -> dict:
    return tiny_config(
        **{
            "seed": 3,
            "epochs": 2,
            "global_batch_size": 16,
            "micro_batch_size": 4,
            "clip_grad_norm": 1.0,
            "model.depth": 2,
            "optimizer": {"type": "lamb", "lr": 1e-2, "weight_decay": 0.05},
            "lr_schedule": {"type": "linear", "warmup_steps": 2},
            "mixup.mixup_alpha": 0.4,
            "data.root": str(shards),
            "data.image_size": 16,
            "data.num_classes": 64,
            "data.label_offset": 1,
            "data.train_samples": 64,
            "data.eval_samples": 8,
            "eval.at_end": False,
            "eval.interval_epochs": 0,
            "checkpoint.at_end": True,
            **LOADERS[loader],
            **DROPOUT[dropout],
        }
    )


def run(tmp_path: pathlib.Path, cfg: dict, run_dir: pathlib.Path, resume: str | None = None):
    path = write_config(tmp_path, cfg, name=f"{run_dir.name}.yaml")
    preemption.clear()  # a fresh process has received no signal
    # A resumed run keeps its saved config: a stop at max_steps is lifted as a user would.
    overrides = ["max_steps=null"] if resume else []
    return train(TrainArgs(config=str(path), overrides=overrides, run_dir=str(run_dir), resume=resume))


@pytest.fixture(scope="module")
def references(shards, tmp_path_factory):
    """Uninterrupted runs, made once per (loader, dropout): ``model.safetensors`` bytes."""
    made: dict[tuple[str, str], bytes] = {}

    def get(loader: str, dropout: str) -> bytes:
        if (loader, dropout) not in made:
            root = tmp_path_factory.mktemp(f"reference-{loader}-{dropout}")
            state = run(root, matrix_config(shards, loader, dropout), root / "run")
            assert state.step == 8 and not state.interrupted
            made[loader, dropout] = (root / "run" / "model.safetensors").read_bytes()
        return made[loader, dropout]

    return get


@pytest.mark.parametrize("stop", list(STOPS))
@pytest.mark.parametrize("dropout", list(DROPOUT))
@pytest.mark.parametrize("loader", [loader_param(name) for name in LOADERS])
def test_resumed_run_ends_with_the_uninterrupted_runs_bytes(tmp_path, shards, references, signal_handlers, loader, dropout, stop):
    cfg = matrix_config(shards, loader, dropout)
    run_dir = tmp_path / "run"
    stopped = run(tmp_path, {**cfg, **STOPS[stop]}, run_dir)
    assert stopped.step == STOPPED_AT[stop]
    assert stopped.interrupted == (stop == "signal-mid-window")
    assert (run_dir / "checkpoints" / f"step-{STOPPED_AT[stop]:08d}.pt").is_file()
    (run_dir / "model.safetensors").unlink(missing_ok=True)  # the stopped run's own weights
    resumed = run(tmp_path, cfg, run_dir, resume="auto")
    assert resumed.step == 8 and not resumed.interrupted
    assert (run_dir / "model.safetensors").read_bytes() == references(loader, dropout)


# A batch ramp 4 -> 8 -> 16 (stages from samples 0, 16, 32): 4 steps at 4, 2 at 8, then 2 + 4 at 16, 12 in all.
RAMP = {"batch_schedule": {"type": "ramp", "start_batch_size": 4, "ramp_samples": 32}}
# Stopped on either side of the first batch change: the last step at batch 4, the first at 8.
RAMP_STOPS = {"before-change": 4, "after-change": 5}


@pytest.fixture(scope="module")
def ramp_references(shards, tmp_path_factory):
    """Uninterrupted ramped runs, one per loader: ``model.safetensors`` bytes."""
    made: dict[str, bytes] = {}

    def get(loader: str) -> bytes:
        if loader not in made:
            root = tmp_path_factory.mktemp(f"ramp-reference-{loader}")
            state = run(root, {**matrix_config(shards, loader, "dropout"), **RAMP}, root / "run")
            assert state.step == 12 and state.run.batch.batch == 16
            made[loader] = (root / "run" / "model.safetensors").read_bytes()
        return made[loader]

    return get


@pytest.mark.parametrize("stop", list(RAMP_STOPS))
@pytest.mark.parametrize("loader", [loader_param(name) for name in LOADERS])
def test_a_run_resumed_across_a_batch_change_ends_with_the_uninterrupted_runs_bytes(
    tmp_path, shards, ramp_references, signal_handlers, loader, stop
):
    cfg = {**matrix_config(shards, loader, "dropout"), **RAMP}
    run_dir = tmp_path / "run"
    stopped = run(tmp_path, {**cfg, "max_steps": RAMP_STOPS[stop]}, run_dir)
    assert (stopped.step, stopped.samples_seen) == (RAMP_STOPS[stop], {4: 16, 5: 24}[RAMP_STOPS[stop]])
    (run_dir / "model.safetensors").unlink(missing_ok=True)
    resumed = run(tmp_path, cfg, run_dir, resume="auto")
    assert resumed.step == 12 and not resumed.interrupted
    assert (run_dir / "model.safetensors").read_bytes() == ramp_references(loader)


def test_the_ramp_changes_the_result(references, ramp_references):
    """The ramp cells exercise a changing batch: their weights differ from the fixed batch's."""
    assert ramp_references("synthetic") != references("synthetic", "dropout")


def test_dropout_changes_the_result(references):
    """The matrix's dropout cells exercise dropout: its weights differ from the plain run's."""
    assert references("synthetic", "dropout") != references("synthetic", "no-dropout")


@pytest.mark.slow
def test_the_device_decoding_cells_decode_on_the_device(references):
    """The native-device cells take the device path: its pixels differ from the CPU path's
    by the DCT scale (docs/data.md), so the weights differ from native-0's."""
    assert references("native-device", "no-dropout") != references("native-0", "no-dropout")


@pytest.mark.slow
@pytest.mark.parametrize("dropout", list(DROPOUT))
def test_native_loader_result_does_not_depend_on_the_worker_count(references, dropout):
    assert references("native-0", dropout) == references("native-2", dropout)


def device_cell(tmp_path: pathlib.Path, shards: pathlib.Path, device: str, precision: str, loader: str, decode: str = "auto") -> None:
    """A precision's cell on ``device``: autocast (fp16 with its grad scaler, whose state must
    resume too), LAMB with clipping, mixup, dropout; stopped at step 3 and resumed."""
    cfg = matrix_config(shards, loader, "dropout")
    cfg.update(device=device, precision=precision)
    cfg["data"]["decode"] = decode
    if device == "cuda":  # attention through plain matmuls: the fused kernels' backward need not be bitwise repeatable
        cfg["cuda"] = {"fused_attention": False}
    reference = run(tmp_path, cfg, tmp_path / "reference")
    assert reference.step == 8 and reference.run.backend.device.type == device
    if precision == "fp16":
        assert reference.run.scaler is not None and reference.run.scaler.get_scale() > 0
    run_dir = tmp_path / "run"
    assert run(tmp_path, {**cfg, "max_steps": 3}, run_dir).step == 3
    (run_dir / "model.safetensors").unlink(missing_ok=True)
    assert run(tmp_path, cfg, run_dir, resume="auto").step == 8
    assert (run_dir / "model.safetensors").read_bytes() == (tmp_path / "reference" / "model.safetensors").read_bytes()


def test_the_device_cell_on_the_cpu_in_bf16(tmp_path, shards):
    """The GPU cell's code on the CPU, so that it is exercised where the suite runs."""
    device_cell(tmp_path, shards, "cpu", "bf16", "native-0")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("decode", ["cpu", "device"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_on_a_gpu_a_resumed_run_ends_with_the_uninterrupted_runs_bytes(tmp_path, shards, precision, decode):
    """LAMB's Triton path and the native loader with 2 workers on a GPU: the pinned hand-over
    of the workers' pixels (``data.decode='cpu'``), and nvJPEG decoding of the workers' JPEGs."""
    device_cell(tmp_path, shards, "cuda", precision, "native-2", decode)
