"""The sections of the accelerator suite, one per process (see ``bench/accelerator.py``).

Each prints its Markdown table (or ``skipped: <reason>`` lines) and exits 0, or fails with a
traceback; what each measures and how: docs/benchmarks.md, "On a GPU or a Gaudi". By hand:

    python -m bench.accelerator_sections train --device cuda [--quick]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: start again as the module (bench/common.py)
    __import__("common").run_as_module(__file__)

import argparse
import contextlib
import dataclasses
import gc
import importlib.util
import itertools
import json
import math
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import torch

from bench.common import CLASSES, REPO, FixedBatches, build_engine, config, image_shards, run_or_fail, shard_data, table, time_blocks
from largebatch import flops
from largebatch.backends import Backend, create_backend
from largebatch.engine.engine import Engine
from largebatch.engine.hook import Hook
from largebatch.rundir import RunDir, read_metrics


@dataclasses.dataclass(frozen=True)
class Sizes:
    model: str
    model_kwargs: dict
    image_size: int
    micro: int
    warmup: int
    timed: int
    images: int  # JPEGs in the shards of sections d and e
    lamb_model: str
    lamb_steps: int
    lamb_rounds: int


FULL = Sizes("vit_base_patch16_224", {}, 224, 128, 5, 20, 1024, "vit_base_patch16_224", 10, 5)
QUICK = Sizes("vit_tiny_patch16_224", {"patch_size": 8, "depth": 1}, 32, 8, 1, 2, 32, "vit_tiny_patch16_224", 2, 2)


# -- the device, through its backend -------------------------------------------------------


def reset_peak_memory(backend: Backend) -> None:
    gc.collect()
    backend.reset_peak_memory()


def gib(value: float | None) -> str:
    return "n/a (CPU)" if value is None else f"{value / 2**30:.2f}"


def attempt(label: str, work, *args, **kwargs):
    """``work(*args, **kwargs)``, or None with the error on stderr (the suite's --log) and
    one line on stdout: one configuration that fails does not cost the others."""
    try:
        return work(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - reported, and the section goes on
        traceback.print_exc()
        print(f"- {label}: failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}", flush=True)
        return None


# -- the engine -------------------------------------------------------------------------


class StepTimer(Hook):
    """Seconds from before step ``warmup`` to the end of training, between synchronisations;
    with ``profiler``, its ``step()`` after each optimizer step (its schedule counts them)."""

    def __init__(self, warmup: int, profiler=None) -> None:
        super().__init__()
        self.warmup, self.profiler = warmup, profiler
        self.start = self.seconds = 0.0

    def before_step(self, state) -> None:
        if state.step == self.warmup:
            state.run.backend.synchronize()
            self.start = time.perf_counter()

    def after_step(self, state) -> None:
        if self.profiler is not None:
            self.profiler.step()

    def after_train(self, state) -> None:
        state.run.backend.synchronize()
        self.seconds = time.perf_counter() - self.start


def overrides(device: str, sizes: Sizes, changes: dict | None = None, data: dict | None = None) -> dict:
    """The base config's overrides for a bf16 run of ``sizes`` on ``device`` (AdamW, clipping
    at 1.0, no evaluation or checkpoints), with ``changes``: synthetic batches, or ``data``."""
    steps = sizes.warmup + sizes.timed
    synthetic = {"loader": "synthetic", "image_size": sizes.image_size, "num_classes": CLASSES, "train_samples": steps * sizes.micro}
    cfg = {"device": device, "precision": "bf16", "max_steps": steps, "global_batch_size": sizes.micro, "micro_batch_size": sizes.micro}
    cfg |= {
        "model": {"name": sizes.model, **sizes.model_kwargs},
        "data": data or synthetic,
        **({"hpu.mode": "lazy"} if device == "hpu" else {}),
    }
    if data is not None:  # enough epochs of the shards for the steps
        cfg["epochs"] = math.ceil(steps * sizes.micro / sizes.images) + 1
    return cfg | (changes or {})


def first_batches(loader, count: int) -> list:
    """The loader's first ``count`` micro-batches (on the device), then the loader closed."""
    loader.set_epoch(0)
    batches = iter(loader)
    out = [next(batches) for _ in range(count)]
    if hasattr(loader, "close"):
        loader.close()
    return out


@dataclasses.dataclass
class Measured:
    images_per_s: float
    peak_bytes: float | None
    mfu: float | None


def engine_run(cfg: dict, work: pathlib.Path, sizes: Sizes, *, fixed: bool, profiler=None) -> Measured:
    """Train with the base config and ``cfg`` once; with ``fixed`` on the synthetic loader's
    first micro-batches, repeated; under ``profiler``, when given."""
    engine = build_engine(cfg, work / "run")
    loader = FixedBatches(first_batches(engine.train_loader, min(4, sizes.warmup + sizes.timed))) if fixed else engine.train_loader
    timer = StepTimer(sizes.warmup, profiler)
    engine = Engine(engine.state, [*engine.hooks, timer], loader, engine.eval_loader)
    state, backend = engine.state, engine.state.run.backend
    try:
        reset_peak_memory(backend)
        engine.run()
        peak = backend.memory_stats().get("peak_allocated")
    finally:
        engine.close()
    rate = sizes.timed * cfg["global_batch_size"] / timer.seconds
    shape = (3, sizes.image_size, sizes.image_size)
    per_sample = flops.TRAIN_FORWARD_MULTIPLE * flops.forward_flops_per_sample(state.run.model, shape, backend.device)
    peak_tflops = flops.peak_tflops(backend)
    del engine, state
    reset_peak_memory(backend)
    return Measured(rate, peak, rate * per_sample / (peak_tflops * 1e12) if peak_tflops else None)


# -- a. tests ---------------------------------------------------------------------------


def pytest_counts(output: str) -> dict[str, int]:
    """Counts from pytest's summary line (``3 passed, 1 skipped, 40 deselected in 2.1s``)."""
    counts = dict.fromkeys(("passed", "failed", "skipped", "deselected", "errors"), 0)
    for number, word in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)\b", output):
        key = "errors" if word.startswith("error") else word
        if key in counts:
            counts[key] += int(number)
    return counts


def section_tests(device: str, quick: bool) -> None:
    marker = "hpu" if device == "hpu" else "gpu"
    cmd = [sys.executable, "-m", "pytest", "-m", marker, "-q", "-rA", "-p", "no:cacheprovider"]
    if quick:
        cmd.append("tests/backends/test_cuda.py")  # the stand-in: one file's gpu-marked tests (skipped without a GPU)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    sys.stderr.write(proc.stdout + proc.stderr)  # pytest's whole output: into the suite's --log
    counts = pytest_counts(proc.stdout)
    print(f"command: `{' '.join(['pytest', *cmd[3:]])}` (exit status {proc.returncode})\n")
    print(table("passed: | failed: | skipped: | deselected: | errors:", ["| " + " | ".join(str(n) for n in counts.values()) + " |"]))
    outcomes = [line for line in proc.stdout.splitlines() if re.match(r"(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) ", line)]
    if outcomes:
        print("\n" + "\n".join(f"- {line}" for line in outcomes))
    if proc.returncode == 5:
        print(f"\nno test carries the `{marker}` marker: nothing to run")
    elif proc.returncode != 0:
        print("\n```\n" + proc.stdout[-3000:] + "\n```")
        raise SystemExit(1)


# -- c. training throughput -------------------------------------------------------------


MAX_AUTOTUNE = "LARGEBATCH_BENCH_MAX_AUTOTUNE"  # =1: section c measures compile's max-autotune mode too


def engine_variants(device: str) -> list[tuple[str, dict | None, str]]:
    """(label, ``overrides`` changes or None when skipped, why skipped); after bf16 (the base
    of the ratios, measured first), and compile last: its build is the slowest and least certain."""
    compile_reason = {
        "hpu": "compile on a Gaudi needs hpu.mode='compile' (PT_HPU_LAZY_MODE=0), which cannot share this lazy-mode process",
        "cpu": "torch.compile is measured on accelerators only: on the CPU stand-in its build time would be the whole run",
    }
    cuda = device == "cuda"
    fused = {"optimizer.fused": True} if device != "hpu" else None  # Habana's fused AdamW is its own class
    compiled = [  # torch.compile's modes (cuda.compile_mode), the default twice: its A/A control
        ("bf16 + compile, default mode", {}),
        ("bf16 + compile, default mode again (A/A control)", {}),
        ("bf16 + compile, mode reduce-overhead", {"cuda.compile_mode": "reduce-overhead"}),
    ]
    autotune = {"compile": True, "cuda.compile_mode": "max-autotune"} if cuda and os.environ.get(MAX_AUTOTUNE) == "1" else None
    return [
        # the non-finite check reads one flag per step on the host: off, the step has no host sync
        ("bf16, nan_guard off", {"nan_guard.action": "off"}, ""),
        # with fused AdamW the check's flag is read a step late (no host sync per step): on vs off
        ("bf16, fused AdamW (nan_guard read a step late)", fused, "no torch fused AdamW on a Gaudi"),
        ("bf16, fused AdamW, nan_guard off", fused and {**fused, "nan_guard.action": "off"}, "no torch fused AdamW on a Gaudi"),
        ("fp32, TF32 off", {"precision": "fp32", **({"cuda.tf32": False} if cuda else {})}, ""),
        ("fp32 with TF32", {"precision": "fp32"} if cuda else None, "TF32 is a mode of NVIDIA tensor cores; no such switch on this device"),
        ("fp16 with the grad scaler", {"precision": "fp16"} if cuda else None, "fp16 with a grad scaler is the CUDA recipe"),
        *[(label, {"compile": True, **mode} if cuda else None, compile_reason.get(device, "")) for label, mode in compiled],
        (
            "bf16 + compile, mode max-autotune",
            autotune,
            compile_reason.get(device, f"its autotuning takes minutes, past the suite's budget: {MAX_AUTOTUNE}=1 adds it"),
        ),
    ]


def attention_line(device: str, sizes: Sizes, work: pathlib.Path) -> str:
    """Whether the engine's bf16 model runs the flash attention kernel (``largebatch.backends.attention``)."""
    from largebatch.backends.attention import check_flash_attention

    engine = build_engine(overrides(device, sizes), work / "attention")
    images, _ = first_batches(engine.train_loader, 1)[0]
    with engine.state.run.backend.autocast():
        return check_flash_attention(engine.state.run.model, images).describe()


def engine_batches(device: str, sizes: Sizes, work: pathlib.Path) -> list:
    """The first 4 micro-batches the engine's bf16 run trains on (on the device), for timm's loop."""
    cfg = overrides(device, sizes)
    cfg["data"]["train_samples"] = 4 * sizes.micro
    return first_batches(build_engine(cfg, work / "batches").train_loader, 4)


def timm_loop(device: str, sizes: Sizes, batches: list, profiler=None) -> Measured:
    """timm train.py's per-batch work as a plain loop: bf16 autocast, AdamW, backward, clip,
    step (and ``profiler.step()`` after each, when profiled)."""
    import timm
    from timm.optim import create_optimizer_v2
    from timm.utils import dispatch_clip_grad

    backend = create_backend(device)
    torch.manual_seed(0)
    model = timm.create_model(sizes.model, num_classes=CLASSES, img_size=sizes.image_size, **sizes.model_kwargs).to(device)
    optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    reset_peak_memory(backend)
    start = 0.0
    for step in range(sizes.warmup + sizes.timed):
        if step == sizes.warmup:
            backend.synchronize()
            start = time.perf_counter()
        images, target = batches[step % len(batches)]
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = loss_fn(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        backend.after_backward()
        dispatch_clip_grad(model.parameters(), value=1.0, mode="norm")
        optimizer.step()
        backend.after_optimizer_step()
        if profiler is not None:
            profiler.step()
    backend.synchronize()
    rate = sizes.timed * sizes.micro / (time.perf_counter() - start)
    peak = backend.memory_stats().get("peak_allocated")
    del model, optimizer
    return Measured(rate, peak, None)


def measured_row(label: str, m: Measured, base: Measured | None) -> str:
    mfu = f"{m.mfu:.3f}" if m.mfu is not None else "n/a (no peak in largebatch.flops)"
    ratio = f"{m.images_per_s / base.images_per_s:.3f}" if base else "-"
    return f"| {label} | {m.images_per_s:.1f} | {mfu} | {gib(m.peak_bytes)} | {ratio} |"


def section_train(device: str, quick: bool) -> None:
    sizes = QUICK if quick else FULL
    print(
        f"model {sizes.model} {sizes.model_kwargs or ''}, {sizes.image_size} px, micro-batch {sizes.micro}, AdamW, clip 1.0; "
        f"warm-up steps: {sizes.warmup}, then {sizes.timed} timed steps between device synchronisations; "
        "MFU = images/s x 3 x forward FLOPs per image / the device's dense peak for the precision (largebatch.flops); "
        "rows in the order they ran\n"
    )
    print(table("configuration | images/s: | MFU: | peak memory GiB: | images/s / engine bf16:"), flush=True)
    skipped, results = [], {}
    variants = engine_variants(device)
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)

        def measure(label: str, changes: dict, name: str) -> None:
            m = attempt(label, engine_run, overrides(device, sizes, changes), work / name, sizes, fixed=True)
            if m is not None:
                results[label] = m
                print(measured_row(f"largebatch engine, {label}", m, results.get("bf16")), flush=True)

        # An untimed run first: the first in a process pays for kernel selection and the
        # allocator's growth, which put 15% between two bf16 runs on an H200.
        attempt("warm-up run", engine_run, overrides(device, sizes), work / "warm-up", sizes, fixed=True)
        measure("bf16", {}, "bf16")
        attention = attempt("flash attention check", attention_line, device, sizes, work)
        batches = engine_batches(device, sizes, work)
        timm_rate = attempt("timm train.py loop", timm_loop, device, sizes, batches)
        del batches
        if timm_rate is not None:
            print(measured_row("timm train.py loop, bf16 autocast", timm_rate, results.get("bf16")), flush=True)
        measure("bf16 again (A/A control)", {}, "again")  # timm's loop between the two
        for i, (label, changes, reason) in enumerate(variants):
            if changes is None:
                skipped.append(f"- {label}: skipped: {reason}")
            else:
                measure(label, changes, f"v{i}")
    if skipped:
        print("\n" + "\n".join(skipped))
    if attention:
        print(f"\n{attention}")
    for label, first, second in (
        ("fused AdamW: nan_guard on / off", "bf16, fused AdamW (nan_guard read a step late)", "bf16, fused AdamW, nan_guard off"),
        (
            "compile A/A control: default mode second run / first",
            "bf16 + compile, default mode again (A/A control)",
            "bf16 + compile, default mode",
        ),
    ):
        if first in results and second in results:
            print(f"{label} = {results[first].images_per_s / results[second].images_per_s:.3f}")
    base, again = results.get("bf16"), results.get("bf16 again (A/A control)")
    if base and again and timm_rate:
        first, second = base.images_per_s / timm_rate.images_per_s, again.images_per_s / timm_rate.images_per_s
        print(
            f"\nlargebatch / timm (bf16) = {(first + second) / 2:.3f} (the engine's runs before and after timm's: {first:.3f}, {second:.3f})"
        )
    if base and again:
        print(f"A/A control: engine bf16 second run / first = {again.images_per_s / base.images_per_s:.3f}")
    if len(results) + len(skipped) < len(variants) + 2 or timm_rate is None:
        raise SystemExit("a configuration failed: see its line above and the traceback in the log")


# -- d, e. the loaders onto the device ----------------------------------------------------


def shards_for(sizes: Sizes) -> pathlib.Path:
    """Photo-like JPEGs (about 500x375) in 4 TFRecord train shards, made once per machine
    and size and reused by sections d and e (a folder in the system's temporary folder)."""
    root = pathlib.Path(tempfile.gettempdir()) / f"largebatch-accelerator-shards-{sizes.images}"
    if not (root / "complete").exists():
        shutil.rmtree(root, ignore_errors=True)  # a conversion stopped half-way
        image_shards(root, sizes.images)
        shutil.rmtree(root / "folder")
        (root / "complete").touch()
    return root / "shards"


def default_workers(sizes: Sizes) -> int:
    """Loader workers: 2 at the stand-in's sizes; else all cores but two (at most 14)."""
    return 2 if sizes is QUICK else max(2, min(14, (os.cpu_count() or 4) - 2))


def loader_data(sizes: Sizes, loader: str, workers: int | None = None) -> dict:
    return {**shard_data(shards_for(sizes), sizes.image_size, workers or default_workers(sizes)), "loader": loader}


def device_loaders(device: str) -> list[tuple[str, str, str]]:
    """(label, data.loader, why it cannot run here or ''): the native loader on every
    device, and the device's own decoding pipeline beside it."""
    native = {
        "cuda": "native loader (CPU workers decode; uint8 pinned hand-over on a side stream; normalised on the GPU)",
        "hpu": "native loader (CPU workers decode; uint8 hand-over; normalised on the Gaudi)",
        "cpu": "native loader (worker processes decode; normalised in the main process)",
    }[device]
    if device == "hpu":
        return [(native, "native", ""), ("Habana media pipeline", "mediapipe", "")]
    dali = "DALI, device='mixed' (nvJPEG)" if device == "cuda" else "DALI CPU pipeline"
    try:
        found = importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):
        found = False
    return [(native, "native", ""), (dali, "dali", "" if found else "NVIDIA DALI is not installed in this Python")]


def fallback_note(device: str, sizes: Sizes, data: dict) -> str:
    """On a Gaudi, why the media pipeline would fall back to the native loader, if it would."""
    if device != "hpu" or data["loader"] != "mediapipe":
        return ""
    from largebatch.data import mediapipe

    reason = mediapipe.unavailable_reason(config(overrides(device, sizes, data=data)).data, torch.device("hpu"))
    return f" (the media pipeline cannot run: {reason}; largebatch falls back to the native loader)" if reason else ""


DEVICE_DECODE = "native loader, data.decode='device' (workers read; the device decodes, crops and resizes whole micro-batches)"


def section_loader_train(device: str, quick: bool) -> None:
    sizes = QUICK if quick else FULL
    rows, skipped = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        synthetic = engine_run(overrides(device, sizes), work / "synthetic", sizes, fixed=True)
        for i, (label, loader, missing) in enumerate(device_loaders(device)):
            if missing:
                skipped.append(f"- {label}: skipped: {missing}")
                continue
            data = loader_data(sizes, loader)
            # the native loader with each data.decode (the device one on CUDA and the CPU stand-in), side by side
            for decode in ("cpu", "device") if loader == "native" and device != "hpu" else ("",):
                name = {"": label, "cpu": f"{label}, data.decode='cpu'", "device": DEVICE_DECODE}[decode]
                data = {**data, "decode": decode} if decode else data
                m = engine_run(overrides(device, sizes, data=data), work / f"shards{i}{decode}", sizes, fixed=False)
                rows.append((name + fallback_note(device, sizes, data), m))
    print(
        f"model {sizes.model}, {sizes.image_size} px, micro-batch {sizes.micro}, bf16; {sizes.images} JPEGs (about 500x375) "
        f"in 4 TFRecord shards, random-resized-crop + flip, {loader_data(sizes, 'native')['num_workers']} workers; "
        f"warm-up steps: {sizes.warmup}, timed steps: {sizes.timed}\n"
    )
    lines = [f"| synthetic micro-batches already on the device | {synthetic.images_per_s:.1f} | {gib(synthetic.peak_bytes)} | 1.000 |"]
    lines += [
        f"| {label} from TFRecord shards | {m.images_per_s:.1f} | {gib(m.peak_bytes)} | {m.images_per_s / synthetic.images_per_s:.3f} |"
        for label, m in rows
    ]
    print(table("data | images/s: | peak memory GiB: | images/s / synthetic:", lines))
    if skipped:
        print("\n" + "\n".join(skipped))
    print(f"\nloader / synthetic = {rows[0][1].images_per_s / synthetic.images_per_s:.3f} (the native loader)")
    if device != "hpu":
        print(f"loader / synthetic = {rows[1][1].images_per_s / synthetic.images_per_s:.3f} (the native loader, data.decode='device')")


def loader_rates(device: str, sizes: Sizes, loader_kind: str, epochs: int, workers: int, decode: str = "cpu") -> tuple[list[float], int]:
    """images/s of each epoch after a warm-up epoch, iterating the loader without training."""
    from largebatch import data as data_mod
    from largebatch.config import derive

    data = loader_data(sizes, loader_kind, workers)
    cfg = config(overrides(device, sizes, data=data if loader_kind != "native" else {**data, "decode": decode}))
    backend = create_backend(cfg.device, cfg.precision, 0, cuda=cfg.cuda, hpu=cfg.hpu)
    plan = derive(cfg, 1, data_mod.count_samples(cfg.data, "train")).plan
    loader = data_mod.build_train_loader(cfg.data, plan, rank=0, seed=0, device=backend.device)
    rates = []
    try:
        for epoch in range(epochs + 1):  # epoch 0 warms up
            loader.set_epoch(epoch)
            backend.synchronize()
            start, count = time.perf_counter(), 0
            for images, _ in loader:
                count += images.shape[0]
            backend.synchronize()
            rates.append(count / (time.perf_counter() - start))
    finally:
        if hasattr(loader, "close"):
            loader.close()
    return rates[1:], cfg.data.num_workers


def section_loader_alone(device: str, quick: bool) -> None:
    sizes = QUICK if quick else FULL
    epochs = 2 if quick else 4
    rows, skipped = [], []
    counts = sorted({default_workers(sizes), 2 if sizes is QUICK else 8})  # the native loader at 8 workers too
    for label, loader, missing in device_loaders(device):
        if missing:
            skipped.append(f"- {label}: skipped: {missing}")
            continue
        for count in counts if loader == "native" else counts[-1:]:
            rates, workers = loader_rates(device, sizes, loader, epochs, count)
            note = fallback_note(device, sizes, loader_data(sizes, loader))
            rows.append(f"| {label}{note} | {workers} | {statistics.median(rates):.0f} | {', '.join(f'{r:.0f}' for r in rates)} |")
    print(
        f"{sizes.images} JPEGs (about 500x375) to {sizes.image_size} px random-resized-crop + flip + normalise, on the "
        f"device, micro-batch {sizes.micro}; one warm-up epoch, then {epochs} epochs; {os.cpu_count()} CPU cores\n"
    )
    print(table("loader | workers / threads: | images/s (median epoch): | epochs", rows))
    if skipped:
        print("\n" + "\n".join(skipped))
    decode_side_by_side(device, sizes, epochs)


def decode_side_by_side(device: str, sizes: Sizes, epochs: int) -> None:
    """The native loader with ``data.decode`` 'cpu' (workers decode), 'device' (workers read,
    the device decodes whole micro-batches) and 'cpu' again (the A/A control), and the pixel
    difference between the two paths' first micro-batches (same samples, crops and flips)."""
    if device == "hpu":
        print("\n- data.decode='device': skipped: torchvision decodes JPEGs on CUDA and the CPU, not on a Gaudi")
        return
    workers = default_workers(sizes)
    runs = [
        (decode, statistics.median(loader_rates(device, sizes, "native", epochs, workers, decode)[0]))
        for decode in ("cpu", "device", "cpu")
    ]
    largest, mean = decode_difference(device, sizes)
    print(
        f"\nthe native loader's decoding, side by side ({workers} workers; 'cpu' twice, before and after, as the A/A control); "
        f"device / cpu = {runs[1][1] / runs[0][1]:.2f} (against the second cpu run {runs[1][1] / runs[2][1]:.2f}), "
        f"A/A {runs[2][1] / runs[0][1]:.2f}; pixels, device against cpu decode: max {largest:.0f}, mean {mean:.2f} grey levels\n"
    )
    print(
        table("data.decode | images/s (median epoch): | / first cpu run:", [f"| {d} | {r:.0f} | {r / runs[0][1]:.3f} |" for d, r in runs])
    )


def decode_difference(device: str, sizes: Sizes, batches: int = 4) -> tuple[float, float]:
    """Max and mean absolute difference in grey levels between the native loader's first
    ``batches`` micro-batches decoded on the CPU and on the device (no workers)."""
    from largebatch import data as data_mod
    from largebatch.config import derive

    images = []
    for decode in ("cpu", "device"):
        cfg = config(overrides(device, sizes, data={**loader_data(sizes, "native", 1), "num_workers": 0, "decode": decode}))
        backend = create_backend(cfg.device, cfg.precision, 0, cuda=cfg.cuda, hpu=cfg.hpu)
        plan = derive(cfg, 1, data_mod.count_samples(cfg.data, "train")).plan
        loader = data_mod.build_train_loader(cfg.data, plan, rank=0, seed=0, device=backend.device)
        std = torch.tensor(cfg.data.std, device=backend.device).view(1, -1, 1, 1) * 255
        images.append(torch.cat([(x * std).cpu() for x, _ in itertools.islice(loader, batches)]))
        loader.close()
    difference = (images[0] - images[1]).abs()
    return float(difference.max()), float(difference.mean())


# -- b. LAMB ----------------------------------------------------------------------------


def lamb_candidates(device: str) -> list[tuple[str, object]]:
    """(label, factory of an optimizer over a parameter list); the floor last."""
    from timm.optim import Lamb as TimmLamb

    from bench.lamb_step import FusedPathOn
    from largebatch.optim.lamb import Lamb

    lr, wd = 1e-3, 0.05
    out = [
        ("largebatch Lamb", lambda ps: Lamb(ps, lr=lr, weight_decay=wd)),
        ("largebatch Lamb, second instance (A/A control)", lambda ps: Lamb(ps, lr=lr, weight_decay=wd)),
        ("timm Lamb", lambda ps: TimmLamb(ps, lr=lr, weight_decay=wd, max_grad_norm=None, always_adapt=True)),
    ]
    if device != "hpu":
        out.append(("largebatch Lamb, fused-Adam-kernel path (Triton path off)", lambda ps: FusedPathOn(ps, ("cuda",), ())))
        out.append(("largebatch Lamb, plain multi-tensor path (both off)", lambda ps: FusedPathOn(ps, (), ())))
        return [*out, ("floor: torch.optim.AdamW(fused=True)", lambda ps: torch.optim.AdamW(ps, lr=lr, weight_decay=wd, fused=True))]
    with contextlib.suppress(ImportError, AttributeError):
        from habana_frameworks.torch.hpex.optimizers import FusedAdamW, FusedLamb

        out.append(("Habana FusedLamb", lambda ps: FusedLamb(ps, lr=lr, weight_decay=wd)))
        return [*out, ("floor: Habana FusedAdamW", lambda ps: FusedAdamW(ps, lr=lr, weight_decay=wd))]
    return [*out, ("floor: torch.optim.AdamW (foreach; no fused AdamW found)", lambda ps: torch.optim.AdamW(ps, lr=lr, weight_decay=wd))]


def section_lamb(device: str, quick: bool) -> None:
    from bench.lamb_step import random_params

    sizes = QUICK if quick else FULL
    backend = create_backend(device)

    def settle() -> None:
        backend.after_optimizer_step()
        backend.synchronize()

    def first_step(optimizer) -> bool:
        optimizer.step()
        settle()
        return True

    params = random_params(sizes.lamb_model, device)
    found, optimizers = [], []
    for label, factory in lamb_candidates(device):  # one that fails to build or step is left out, said so
        optimizer = attempt(label, factory, params)
        if optimizer is not None and attempt(label, first_step, optimizer):
            found.append(label)
            optimizers.append(optimizer)
    if len(optimizers) < 2 or found[-1] != lamb_candidates(device)[-1][0] or found[0] != "largebatch Lamb":
        raise SystemExit("ours or the floor failed to step: see the lines above and the traceback in the log")
    blocks = time_blocks([o.step for o in optimizers], sizes.lamb_steps, sizes.lamb_rounds, settle)
    times = [[t for block in side for t in block] for side in blocks]
    medians = [statistics.median(t) for t in times]
    floor = medians[-1]
    print(
        f"{len(params)} tensors of {sizes.lamb_model} ({sum(p.numel() for p in params) / 1e6:.1f}M parameters), fp32 on {device}, "
        f"random gradients; {sizes.lamb_rounds} rounds of {sizes.lamb_steps} timed steps per optimizer, blocks taking turns, "
        "each step between device synchronisations\n"
    )
    rows = [f"| {label} | {median:.2f} | {min(t):.2f} | {median / floor:.2f} |" for label, t, median in zip(found, times, medians)]
    print(table("optimizer | ms/step (median): | ms/step (min): | x floor:", rows))
    print(f"\nlargebatch Lamb / floor = {medians[0] / floor:.2f} (target: at most about 1.5)")
    if found[1] == "largebatch Lamb, second instance (A/A control)":
        print(f"A/A control: second instance / first = {medians[1] / medians[0]:.2f}")


# -- f. ddp against fsdp ----------------------------------------------------------------


def distributed_worker(args: argparse.Namespace) -> None:
    """One torchrun rank: train ViT-B/16 on synthetic batches; write this rank's numbers."""
    import torch.distributed as dist

    sizes = QUICK if args.quick else FULL
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    cfg = overrides(args.device, sizes, {"global_batch_size": sizes.micro * world, "dist.strategy": args.strategy})
    cfg["data"]["train_samples"] = (sizes.warmup + sizes.timed) * sizes.micro * world
    measured = engine_run(cfg, pathlib.Path(args.out) / f"rank{rank}", sizes, fixed=True)
    record = {"rank": rank, "images_per_s": measured.images_per_s, "peak_bytes": measured.peak_bytes}
    (pathlib.Path(args.out) / f"{args.strategy}-rank{rank}.json").write_text(json.dumps(record))
    if dist.is_initialized():
        dist.destroy_process_group()


def section_distributed(device: str, quick: bool) -> None:
    if device == "cpu":
        print("skipped: the CPU stand-in has no devices to spread over (CPU ranks: bench/sharded_memory.py)")
        return
    count = create_backend(device).device_count()
    if count < 2:
        print(f"skipped: one {'GPU' if device == 'cuda' else 'Gaudi'} on this machine; ddp against fsdp needs at least two")
        return
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in ("ddp", "fsdp"):
            args = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={count}", "-m", "bench.accelerator_sections"]
            args += ["distributed-worker", "--device", device, "--strategy", strategy, "--out", tmp, *(["--quick"] if quick else [])]
            print(f"command: `torchrun {' '.join(args[2:])}`")
            run_or_fail(args)
            rows[strategy] = [json.loads(p.read_text()) for p in sorted(pathlib.Path(tmp).glob(f"{strategy}-rank*.json"))]
    print(f"\n{count} processes, bf16, micro-batch {(QUICK if quick else FULL).micro} per rank, synthetic batches\n")
    lines, base = [], rows["ddp"][0]["images_per_s"]
    for strategy, records in rows.items():
        rate, peaks = records[0]["images_per_s"], [r["peak_bytes"] for r in records if r["peak_bytes"] is not None]
        lines.append(f"| {strategy} | {rate:.1f} | {gib(max(peaks) if peaks else None)} | {rate / base:.3f} |")
    print(table("dist.strategy | images/s (all ranks): | peak memory per rank GiB (max over ranks): | images/s / ddp:", lines))


# -- h. where the engine's step time goes, against timm's loop --------------------------


@dataclasses.dataclass
class Profile:
    """One side's recorded steps: wall time per step while recorded, the device's busy time
    per step (the kernels' own time, summed), kernels launched per step, and the op table."""

    wall_ms: float
    kernel_ms: float | None
    kernels: float | None
    table: str


def profiled(device: str, sizes: Sizes, run) -> Profile:
    """``run(profiler)`` (a ``Measured``) under a profiler over its last steps: the first
    ``warmup - 1`` skipped, one step of the profiler's own warm-up, then ``timed`` steps
    recorded (host ops, and kernels on CUDA)."""
    activities = [torch.profiler.ProfilerActivity.CPU, *([torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])]
    schedule = torch.profiler.schedule(wait=max(0, sizes.warmup - 1), warmup=min(1, sizes.warmup), active=sizes.timed, repeat=1)
    with torch.profiler.profile(activities=activities, schedule=schedule, record_shapes=False) as profiler:
        measured = run(profiler)
    averages, steps = profiler.key_averages(), sizes.timed
    kernel_ms = kernels = None
    if device == "cuda":
        on_device = [e for e in averages if str(getattr(e, "device_type", "")).endswith("CUDA")]
        kernel_ms = sum(getattr(e, "self_device_time_total", 0.0) for e in on_device) / 1e3 / steps
        kernels = sum(e.count for e in on_device) / steps
    ops = averages.table(sort_by=f"self_{'device' if device == 'cuda' else 'cpu'}_time_total", row_limit=15, max_name_column_width=60)
    return Profile(1e3 * sizes.micro / measured.images_per_s, kernel_ms, kernels, ops)


def section_profile(device: str, quick: bool) -> None:
    """Section c's bf16 engine (with and without the non-finite check) and timm's loop under
    ``torch.profiler``: whether the engine's extra time per step is device work (more or
    longer kernels) or the device waiting for the host (busy share below timm's)."""
    if device == "hpu":
        print("skipped: torch.profiler's HPU activity needs Habana's profiler set-up; profile on a Gaudi with hl-prof-config")
        return
    sizes = QUICK if quick else FULL
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        batches = engine_batches(device, sizes, work)
        attempt("warm-up run", engine_run, overrides(device, sizes), work / "warm-up", sizes, fixed=True)

        def engine(changes: dict, name: str):
            return lambda profiler: engine_run(overrides(device, sizes, changes), work / name, sizes, fixed=True, profiler=profiler)

        sides = {
            "largebatch engine, bf16": attempt("engine", profiled, device, sizes, engine({}, "engine")),
            "largebatch engine, bf16, nan_guard off": attempt(
                "engine, nan_guard off", profiled, device, sizes, engine({"nan_guard.action": "off"}, "off")
            ),
            "timm train.py loop, bf16 autocast": attempt(
                "timm loop", profiled, device, sizes, lambda profiler: timm_loop(device, sizes, batches, profiler)
            ),
        }
    print(
        f"{sizes.model}, micro-batch {sizes.micro}, bf16; {sizes.timed} steps recorded after {sizes.warmup}; "
        "times under the profiler (slower than section c's): compare the rows with each other\n"
    )
    rows = []
    for label, found in sides.items():
        if found is not None:
            busy = f"{found.kernel_ms / found.wall_ms:.3f}" if found.kernel_ms is not None else "n/a (no device)"
            kernel_ms = f"{found.kernel_ms:.2f}" if found.kernel_ms is not None else "n/a"
            rows.append(
                f"| {label} | {found.wall_ms:.2f} | {kernel_ms} | {busy} | {f'{found.kernels:.0f}' if found.kernels is not None else 'n/a'} |"
            )
    print(table("side | ms per step (wall, profiled): | kernel ms per step: | device busy share: | kernels per step:", rows))
    for label, found in sides.items():
        if found is not None:
            print(f"\n{label}: the ops that took the most {'device' if device == 'cuda' else 'CPU'} time\n\n```\n{found.table}\n```")
    if any(found is None for found in sides.values()):
        raise SystemExit("a side failed: see its line above and the traceback in the log")


# -- g. accuracy ------------------------------------------------------------------------


def section_accuracy(device: str, quick: bool) -> None:
    if not (REPO / "data" / "fashion-mnist" / "dataset.json").exists():
        print("skipped: data/fashion-mnist is absent; prepare it with `python data/prepare_fmnist.py`")
        return
    with tempfile.TemporaryDirectory() as tmp:
        args = ["train.py", "--config", "configs/demo/vit-tiny-fmnist.py", "--set", f"device={device}", "--run-dir", f"{tmp}/run"]
        args += ["--set", "epochs=1", "--set", "max_steps=3"] if quick else []
        print(f"command: `{' '.join(['python', *args])}`")
        start = time.perf_counter()
        run_or_fail(args)
        seconds = time.perf_counter() - start
        evals = [r for r in read_metrics(RunDir(pathlib.Path(tmp, "run")).metrics) if "eval/top1" in r]
    top1 = evals[-1]["eval/top1"] if evals else float("nan")
    print()
    print(
        table(
            "run | final eval/top1: | seconds: | the CPU demo (2 processes):",
            [f"| Fashion-MNIST demo on one {device} device | {100 * top1:.1f}% | {seconds:.0f} | 86.6% |"],
        )
    )


SECTIONS = {
    "tests": section_tests,
    "train": section_train,
    "loader_train": section_loader_train,
    "loader_alone": section_loader_alone,
    "lamb": section_lamb,
    "distributed": section_distributed,
    "accuracy": section_accuracy,
    "profile": section_profile,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("section", choices=[*SECTIONS, "distributed-worker"])
    parser.add_argument("--device", required=True, choices=["cuda", "hpu", "cpu"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--strategy", choices=["ddp", "fsdp"], help="distributed-worker only")
    parser.add_argument("--out", help="distributed-worker only: where each rank writes its numbers")
    args = parser.parse_args(argv)
    if args.device == "hpu":
        create_backend(args.device)  # Habana's bridge loaded before any section touches the Gaudi
    if args.section == "distributed-worker":
        distributed_worker(args)
    else:
        SECTIONS[args.section](args.device, args.quick)


if __name__ == "__main__":
    main()
