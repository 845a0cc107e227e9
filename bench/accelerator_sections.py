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
import functools
import gc
import importlib.util
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

from bench import common
from bench.accelerator import SECTIONS
from bench.common import FixedBatches, build_engine, config, random_batches, table
from bench.timm_train import timm_model, timm_step
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
    workers: int  # their loader workers: all cores but two (at most 14), 2 at the stand-in's sizes
    loader_epochs: int  # section d's timed epochs
    lamb_steps: int
    lamb_rounds: int


FULL = Sizes("vit_base_patch16_224", {}, 224, 128, 5, 20, 1024, max(2, min(14, (os.cpu_count() or 4) - 2)), 4, 10, 5)
QUICK = Sizes("vit_tiny_patch16_224", {"patch_size": 8, "depth": 1}, 32, 8, 1, 2, 32, 2, 2, 2, 2)


# -- the device, through its backend -------------------------------------------------------


def reset_peak_memory(backend: Backend) -> None:
    gc.collect()
    backend.reset_peak_memory()


def gib(value: float | None) -> str:
    return "n/a (CPU)" if value is None else f"{value / 2**30:.2f}"


def attempt(label: str, work, *args, **kwargs):
    """``work(*args, **kwargs)``, or None with the error on stderr and one line on stdout."""
    try:
        return work(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - reported, and the section goes on
        traceback.print_exc()
        print(f"- {label}: failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}", flush=True)
        return None


# -- the engine -------------------------------------------------------------------------


class StepTimer(Hook):
    """Seconds from before step ``warmup`` to the end of training; ``profiler.step()`` after each step."""

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
    synthetic = {"loader": "synthetic", "image_size": sizes.image_size, "num_classes": common.CLASSES, "train_samples": steps * sizes.micro}
    cfg = {"device": device, "precision": "bf16", "max_steps": steps, "global_batch_size": sizes.micro, "micro_batch_size": sizes.micro}
    cfg |= {"model": {"name": sizes.model, **sizes.model_kwargs}, "data": data or synthetic}
    cfg |= {"hpu.mode": "lazy"} if device == "hpu" else {}
    if data is not None:  # enough epochs of the shards for the steps
        cfg["epochs"] = math.ceil(steps * sizes.micro / sizes.images) + 1
    return cfg | (changes or {})


@dataclasses.dataclass
class Measured:
    images_per_s: float
    peak_bytes: float | None
    mfu: float | None


def engine_run(cfg: dict, work: pathlib.Path, sizes: Sizes, *, fixed: bool, profiler=None) -> Measured:
    """Train with ``cfg`` once; with ``fixed`` on 4 seeded random micro-batches on the device, as timm's loop."""
    engine = build_engine(cfg, work / "run")
    state, backend = engine.state, engine.state.run.backend
    loader = FixedBatches(random_batches(4, sizes.micro, sizes.image_size, backend.device)) if fixed else engine.train_loader
    timer = StepTimer(sizes.warmup, profiler)
    engine = Engine(state, [*engine.hooks, timer], loader, engine.eval_loader)
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


def pytest_counts(output: str) -> dict[str, int]:
    """Counts from pytest's summary line (``3 passed, 1 skipped, 40 deselected in 2.1s``)."""
    counts = dict.fromkeys(("passed", "failed", "skipped", "deselected", "errors"), 0)
    for number, word in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)\b", output):
        key = "errors" if word.startswith("error") else word
        if key in counts:
            counts[key] += int(number)
    return counts


def section_tests(device: str, sizes: Sizes) -> None:
    marker = "hpu" if device == "hpu" else "gpu"
    cmd = [sys.executable, "-m", "pytest", "-m", marker, "-q", "-rA", "-p", "no:cacheprovider"]
    if sizes is QUICK:
        cmd.append("tests/backends/test_cuda.py")  # the stand-in: one file's gpu-marked tests (skipped without a GPU)
    proc = subprocess.run(cmd, cwd=common.REPO, capture_output=True, text=True)
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


MAX_AUTOTUNE = "LARGEBATCH_BENCH_MAX_AUTOTUNE"  # =1: section c measures compile's max-autotune mode too
# Optimizers that skip an update on the device flag, with which the non-finite check's flag
# is read a step late (no host sync per step): section c runs each with nan_guard on and off.
READ_LATE = ("fused AdamW", "LAMB")


def read_late_labels(name: str) -> tuple[str, str]:
    """Section c's labels of ``name`` (one of ``READ_LATE``) with nan_guard on and off."""
    return f"bf16, {name} (nan_guard read a step late)", f"bf16, {name}, nan_guard off"


def engine_variants(device: str) -> list[tuple[str, dict | None, str]]:
    """(label, ``overrides`` changes or None when skipped, why skipped); compile last: its build is the least certain."""
    compile_reason = {
        "hpu": "compile on a Gaudi needs hpu.mode='compile' (PT_HPU_LAZY_MODE=0), which cannot share this lazy-mode process",
        "cpu": "torch.compile is measured on accelerators only: on the CPU stand-in its build time would be the whole run",
    }
    cuda = device == "cuda"
    hpu = "on a Gaudi: Habana's fused AdamW is its own class and its FusedLamb takes no device flag (the check stays synchronous)"
    late = {"fused AdamW": {"optimizer.fused": True}, "LAMB": {"optimizer.type": "lamb", "optimizer.lr": 1.8e-2}}  # the recipe's LAMB
    compiled = [  # torch.compile's modes (cuda.compile_mode), the default twice: its A/A control
        ("bf16 + compile, default mode", {}),
        ("bf16 + compile, default mode again (A/A control)", {}),
        ("bf16 + compile, mode reduce-overhead", {"cuda.compile_mode": "reduce-overhead"}),
    ]
    autotune = {"compile": True, "cuda.compile_mode": "max-autotune"} if cuda and os.environ.get(MAX_AUTOTUNE) == "1" else None
    return [
        # the non-finite check reads one flag per step on the host: off, the step has no host sync
        ("bf16, nan_guard off", {"nan_guard.action": "off"}, ""),
        *[
            (label, None if device == "hpu" else {**late[name], **off}, hpu)
            for name in READ_LATE
            for label, off in zip(read_late_labels(name), ({}, {"nan_guard.action": "off"}))
        ],
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
    run = engine.state.run
    images, _ = random_batches(1, sizes.micro, sizes.image_size, run.backend.device)[0]
    with run.backend.autocast():
        return check_flash_attention(run.model, images).describe()


def timm_loop(device: str, sizes: Sizes, profiler=None) -> Measured:
    """timm train.py's per-batch work (``timm_step``) in bf16 over the engine's fixed micro-batches."""
    backend = create_backend(device, "bf16")
    batches = random_batches(4, sizes.micro, sizes.image_size, backend.device)
    model, optimizer = timm_model(sizes.model, common.CLASSES, sizes.image_size, backend.device, **sizes.model_kwargs)
    reset_peak_memory(backend)
    start = 0.0
    for step in range(sizes.warmup + sizes.timed):
        if step == sizes.warmup:
            backend.synchronize()
            start = time.perf_counter()
        timm_step(model, optimizer, *batches[step % len(batches)], backend)
        if profiler is not None:
            profiler.step()
    backend.synchronize()
    rate = sizes.timed * sizes.micro / (time.perf_counter() - start)
    return Measured(rate, backend.memory_stats().get("peak_allocated"), None)


def measured_row(label: str, m: Measured, base: Measured | None) -> str:
    mfu = f"{m.mfu:.3f}" if m.mfu is not None else "n/a (no peak in largebatch.flops)"
    ratio = f"{m.images_per_s / base.images_per_s:.3f}" if base else "-"
    return f"| {label} | {m.images_per_s:.1f} | {mfu} | {gib(m.peak_bytes)} | {ratio} |"


def section_train(device: str, sizes: Sizes) -> None:
    print(
        f"model {sizes.model} {sizes.model_kwargs or ''}, {sizes.image_size} px, micro-batch {sizes.micro}, AdamW, clip 1.0; "
        f"warm-up steps: {sizes.warmup}, then {sizes.timed} timed steps between device synchronisations; "
        "MFU = images/s x 3 x forward FLOPs per image / the device's dense peak for the precision (largebatch.flops); "
        "rows in the order they ran\n"
    )
    print(table("configuration | images/s: | MFU: | peak memory GiB: | images/s / engine bf16:"), flush=True)
    variants = engine_variants(device)
    # the engine's bf16 runs (overrides' changes), timm's loop (None) between them: the two bf16 runs are the A/A control
    runs = {"largebatch engine, bf16": {}, "timm train.py loop, bf16 autocast": None, "largebatch engine, bf16 again (A/A control)": {}}
    runs |= {f"largebatch engine, {label}": changes for label, changes, _ in variants if changes is not None}
    results: dict[str, Measured] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # An untimed run first: the first in a process pays for kernel selection and the
        # allocator's growth, which put 15% between two bf16 runs on an H200.
        attempt("warm-up run", engine_run, overrides(device, sizes), pathlib.Path(tmp, "warm-up"), sizes, fixed=True)
        attention = attempt("flash attention check", attention_line, device, sizes, pathlib.Path(tmp))
        for i, (label, changes) in enumerate(runs.items()):
            if changes is None:
                m = attempt(label, timm_loop, device, sizes)
            else:
                m = attempt(label, engine_run, overrides(device, sizes, changes), pathlib.Path(tmp, f"run{i}"), sizes, fixed=True)
            if m is not None:
                results[label] = m
                print(measured_row(label, m, results.get("largebatch engine, bf16")), flush=True)
    skipped = [f"- {label}: skipped: {reason}" for label, changes, reason in variants if changes is None]
    if skipped:
        print("\n" + "\n".join(skipped))
    if attention:
        print(f"\n{attention}")
    rate = {label.removeprefix("largebatch engine, "): m.images_per_s for label, m in results.items()}
    compiled = "bf16 + compile, default mode"
    pairs = {f"{name}: nan_guard on / off": read_late_labels(name) for name in READ_LATE}
    pairs["compile A/A control: default mode second run / first"] = (f"{compiled} again (A/A control)", compiled)
    for label, (first, second) in pairs.items():
        if first in rate and second in rate:
            print(f"{label} = {rate[first] / rate[second]:.3f}")
    base, timm, again = (rate.get(label.removeprefix("largebatch engine, ")) for label in list(runs)[:3])
    if base and again and timm:
        each = f"{base / timm:.3f}, {again / timm:.3f}"
        print(f"\nlargebatch / timm (bf16) = {(base + again) / 2 / timm:.3f} (the engine's runs before and after timm's: {each})")
    if base and again:
        print(f"A/A control: engine bf16 second run / first = {again / base:.3f}")
    if len(results) < len(runs):
        raise SystemExit("a configuration failed: see its line above and the traceback in the log")


def shards_for(sizes: Sizes) -> pathlib.Path:
    """Photo-like JPEGs in 4 TFRecord shards, made once per machine and size for sections d and e."""
    root = pathlib.Path(tempfile.gettempdir()) / f"largebatch-accelerator-shards-{sizes.images}"
    if not (root / "complete").exists():
        shutil.rmtree(root, ignore_errors=True)  # a conversion stopped half-way
        common.image_shards(root, sizes.images)
        shutil.rmtree(root / "folder")
        (root / "complete").touch()
    return root / "shards"


def loader_data(sizes: Sizes, loader: str, workers: int | None = None) -> dict:
    return {**common.shard_data(shards_for(sizes), sizes.image_size, workers or sizes.workers), "loader": loader}


def device_loaders(device: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(label, data.loader) of the native loader and the device's own pipeline, and ``skipped`` lines."""
    native = {
        "cuda": "native loader (CPU workers decode; uint8 pinned hand-over on a side stream; normalised on the GPU)",
        "hpu": "native loader (CPU workers decode; uint8 hand-over; normalised on the Gaudi)",
        "cpu": "native loader (worker processes decode; normalised in the main process)",
    }[device]
    if device == "hpu":
        return [(native, "native"), ("Habana media pipeline", "mediapipe")], []
    dali = "DALI, device='mixed' (nvJPEG)" if device == "cuda" else "DALI CPU pipeline"
    if importlib.util.find_spec("nvidia") and importlib.util.find_spec("nvidia.dali"):
        return [(native, "native"), (dali, "dali")], []
    return [(native, "native")], [f"- {dali}: skipped: NVIDIA DALI is not installed in this Python"]


def fallback_note(device: str, sizes: Sizes, data: dict) -> str:
    """On a Gaudi, why the media pipeline would fall back to the native loader, if it would."""
    if device != "hpu" or data["loader"] != "mediapipe":
        return ""
    from largebatch.data import mediapipe

    reason = mediapipe.unavailable_reason(config(overrides(device, sizes, data=data)).data, torch.device("hpu"))
    return f" (the media pipeline cannot run: {reason}; largebatch falls back to the native loader)" if reason else ""


DEVICE_DECODE = "native loader, data.decode='device' (workers read; the device decodes, crops and resizes whole micro-batches)"


def section_loader_train(device: str, sizes: Sizes) -> None:
    loaders, skipped = device_loaders(device)
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        synthetic = engine_run(overrides(device, sizes), work / "synthetic", sizes, fixed=True)
        rows = [("synthetic micro-batches already on the device", synthetic)]
        for i, (label, loader) in enumerate(loaders):
            data = loader_data(sizes, loader)
            # the native loader with each data.decode (the device one on CUDA and the CPU stand-in), side by side
            for decode in ("cpu", "device") if loader == "native" and device != "hpu" else ("",):
                name = {"": label, "cpu": f"{label}, data.decode='cpu'", "device": DEVICE_DECODE}[decode]
                data = {**data, "decode": decode} if decode else data
                m = engine_run(overrides(device, sizes, data=data), work / f"shards{i}{decode}", sizes, fixed=False)
                rows.append((f"{name}{fallback_note(device, sizes, data)} from TFRecord shards", m))
    print(
        f"model {sizes.model}, {sizes.image_size} px, micro-batch {sizes.micro}, bf16; {sizes.images} JPEGs (about 500x375) "
        f"in 4 TFRecord shards, random-resized-crop + flip, {loader_data(sizes, 'native')['num_workers']} workers; "
        f"warm-up steps: {sizes.warmup}, timed steps: {sizes.timed}\n"
    )
    lines = [
        f"| {label} | {m.images_per_s:.1f} | {gib(m.peak_bytes)} | {m.images_per_s / synthetic.images_per_s:.3f} |" for label, m in rows
    ]
    print(table("data | images/s: | peak memory GiB: | images/s / synthetic:", lines))
    if skipped:
        print("\n" + "\n".join(skipped))
    print(f"\nloader / synthetic = {rows[1][1].images_per_s / synthetic.images_per_s:.3f} (the native loader)")
    if device != "hpu":
        print(f"loader / synthetic = {rows[2][1].images_per_s / synthetic.images_per_s:.3f} (the native loader, data.decode='device')")


def loader_rates(device: str, sizes: Sizes, loader_kind: str, workers: int, decode: str = "cpu") -> tuple[list[float], int, torch.Tensor]:
    """images/s of each epoch after a warm-up epoch, iterating the loader without training; the
    workers; the warm-up epoch's first 4 micro-batches on the CPU, in grey levels less the mean."""
    data = loader_data(sizes, loader_kind, workers)
    cfg = config(overrides(device, sizes, data=data if loader_kind != "native" else {**data, "decode": decode}))
    backend = create_backend(cfg.device, cfg.precision, 0, cuda=cfg.cuda, hpu=cfg.hpu)
    loader = common.train_loader(cfg, backend.device)
    std = torch.tensor(cfg.data.std, device=backend.device).view(1, -1, 1, 1) * 255
    rates, first = [], []
    try:
        for epoch in range(sizes.loader_epochs + 1):  # epoch 0 warms up
            loader.set_epoch(epoch)
            backend.synchronize()
            start, count = time.perf_counter(), 0
            for images, _ in loader:
                count += images.shape[0]
                if epoch == 0 and len(first) < 4:
                    first.append((images * std).cpu())
            backend.synchronize()
            rates.append(count / (time.perf_counter() - start))
    finally:
        loader.close()
    return rates[1:], cfg.data.num_workers, torch.cat(first)


def section_loader_alone(device: str, sizes: Sizes) -> None:
    rows, (loaders, skipped) = [], device_loaders(device)
    counts = sorted({sizes.workers, 2 if sizes is QUICK else 8})  # the native loader at 8 workers too
    for label, loader in loaders:
        for count in counts if loader == "native" else counts[-1:]:
            rates, workers, _ = loader_rates(device, sizes, loader, count)
            note = fallback_note(device, sizes, loader_data(sizes, loader))
            rows.append(f"| {label}{note} | {workers} | {statistics.median(rates):.0f} | {', '.join(f'{r:.0f}' for r in rates)} |")
    print(
        f"{sizes.images} JPEGs (about 500x375) to {sizes.image_size} px random-resized-crop + flip + normalise, on the "
        f"device, micro-batch {sizes.micro}; one warm-up epoch, then {sizes.loader_epochs} epochs; {os.cpu_count()} CPU cores\n"
    )
    print(table("loader | workers / threads: | images/s (median epoch): | epochs", rows))
    if skipped:
        print("\n" + "\n".join(skipped))
    if device == "hpu":
        print("\n- data.decode='device': skipped: torchvision decodes JPEGs on CUDA and the CPU, not on a Gaudi")
        return
    # data.decode 'cpu', 'device' and 'cpu' again (the A/A control); the pixels of the same samples, crops and flips
    decodes = ("cpu", "device", "cpu")
    runs = [loader_rates(device, sizes, "native", sizes.workers, decode) for decode in decodes]
    rates = [statistics.median(epochs) for epochs, _, _ in runs]
    difference = (runs[0][2] - runs[1][2]).abs()
    print(
        f"\nthe native loader's decoding, side by side ({sizes.workers} workers; 'cpu' twice, before and after, as the A/A control); "
        f"device / cpu = {rates[1] / rates[0]:.2f} (against the second cpu run {rates[1] / rates[2]:.2f}), A/A {rates[2] / rates[0]:.2f}; "
        f"pixels, device against cpu decode: max {float(difference.max()):.0f}, mean {float(difference.mean()):.2f} grey levels\n"
    )
    rows = [f"| {decode} | {rate:.0f} | {rate / rates[0]:.3f} |" for decode, rate in zip(decodes, rates)]
    print(table("data.decode | images/s (median epoch): | / first cpu run:", rows))


def lamb_candidates(device: str) -> list[tuple[str, object]]:
    """(label, factory of an optimizer over a parameter list): ours first, the A/A control second, the floor last."""
    from bench.lamb_step import LR, WEIGHT_DECAY, FusedPathOn, ours, timm_lamb

    found = [("largebatch Lamb", ours), ("largebatch Lamb, second instance (A/A control)", ours), ("timm Lamb", timm_lamb)]
    adamw = functools.partial(torch.optim.AdamW, lr=LR, weight_decay=WEIGHT_DECAY)
    if device != "hpu":
        found.append(("largebatch Lamb, fused-Adam-kernel path (Triton path off)", lambda ps: FusedPathOn(ps, ("cuda",), ())))
        found.append(("largebatch Lamb, plain multi-tensor path (both off)", lambda ps: FusedPathOn(ps, (), ())))
        return [*found, ("floor: torch.optim.AdamW(fused=True)", functools.partial(adamw, fused=True))]
    with contextlib.suppress(ImportError, AttributeError):
        from habana_frameworks.torch.hpex.optimizers import FusedAdamW, FusedLamb

        found.append(("Habana FusedLamb", functools.partial(FusedLamb, lr=LR, weight_decay=WEIGHT_DECAY)))
        return [*found, ("floor: Habana FusedAdamW", functools.partial(FusedAdamW, lr=LR, weight_decay=WEIGHT_DECAY))]
    return [*found, ("floor: torch.optim.AdamW (foreach; no fused AdamW found)", adamw)]


def section_lamb(device: str, sizes: Sizes) -> None:
    from bench.lamb_step import random_params

    backend = create_backend(device)

    def settle() -> None:
        backend.after_optimizer_step()
        backend.synchronize()

    def first_step(factory):
        optimizer = factory(params)
        optimizer.step()
        settle()
        return optimizer

    params = random_params(sizes.model, device)
    candidates = lamb_candidates(device)
    built = [(label, attempt(label, first_step, factory)) for label, factory in candidates]  # one that fails is left out, said so
    kept = [(label, optimizer) for label, optimizer in built if optimizer is not None]
    if not kept or kept[0][0] != candidates[0][0] or kept[-1][0] != candidates[-1][0]:
        raise SystemExit("ours or the floor failed to step: see the lines above and the traceback in the log")
    found, optimizers = zip(*kept)
    blocks = common.time_blocks([o.step for o in optimizers], sizes.lamb_steps, sizes.lamb_rounds, settle)
    times = [[t for block in side for t in block] for side in blocks]
    medians = [statistics.median(t) for t in times]
    print(
        f"{len(params)} tensors of {sizes.model} ({sum(p.numel() for p in params) / 1e6:.1f}M parameters), fp32 on {device}, "
        f"random gradients; {sizes.lamb_rounds} rounds of {sizes.lamb_steps} timed steps per optimizer, blocks taking turns, "
        "each step between device synchronisations\n"
    )
    rows = [f"| {label} | {median:.2f} | {min(t):.2f} | {median / medians[-1]:.2f} |" for label, t, median in zip(found, times, medians)]
    print(table("optimizer | ms/step (median): | ms/step (min): | x floor:", rows))
    print(f"\nlargebatch Lamb / floor = {medians[0] / medians[-1]:.2f} (target: at most about 1.5)")
    if found[1] == candidates[1][0]:
        print(f"A/A control: second instance / first = {medians[1] / medians[0]:.2f}")


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


def section_distributed(device: str, sizes: Sizes) -> None:
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
            args += ["distributed-worker", "--device", device, "--strategy", strategy, "--out", tmp]
            args += ["--quick"] if sizes is QUICK else []
            print(f"command: `torchrun {' '.join(args[2:])}`")
            common.run_or_fail(args)
            rows[strategy] = [json.loads(p.read_text()) for p in sorted(pathlib.Path(tmp).glob(f"{strategy}-rank*.json"))]
    print(f"\n{count} processes, bf16, micro-batch {sizes.micro} per rank, synthetic batches\n")
    lines, base = [], rows["ddp"][0]["images_per_s"]
    for strategy, records in rows.items():
        rate, peaks = records[0]["images_per_s"], [r["peak_bytes"] for r in records if r["peak_bytes"] is not None]
        lines.append(f"| {strategy} | {rate:.1f} | {gib(max(peaks) if peaks else None)} | {rate / base:.3f} |")
    print(table("dist.strategy | images/s (all ranks): | peak memory per rank GiB (max over ranks): | images/s / ddp:", lines))


def profiled(device: str, sizes: Sizes, run) -> tuple[list[str], str]:
    """The cells of ``run(profiler)``'s row (wall and kernel ms per step, busy share, kernels
    per step) with its last ``timed`` steps recorded, and its op table."""
    activities = [torch.profiler.ProfilerActivity.CPU, *([torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])]
    schedule = torch.profiler.schedule(wait=max(0, sizes.warmup - 1), warmup=min(1, sizes.warmup), active=sizes.timed, repeat=1)
    with torch.profiler.profile(activities=activities, schedule=schedule, record_shapes=False) as profiler:
        wall_ms = 1e3 * sizes.micro / run(profiler).images_per_s
    averages, cells = profiler.key_averages(), [f"{wall_ms:.2f}", "n/a", "n/a (no device)", "n/a"]
    if device == "cuda":
        on_device = [e for e in averages if str(getattr(e, "device_type", "")).endswith("CUDA")]
        kernel_ms = sum(getattr(e, "self_device_time_total", 0.0) for e in on_device) / 1e3 / sizes.timed
        cells[1:] = [f"{kernel_ms:.2f}", f"{kernel_ms / wall_ms:.3f}", f"{sum(e.count for e in on_device) / sizes.timed:.0f}"]
    return cells, averages.table(
        sort_by=f"self_{'device' if device == 'cuda' else 'cpu'}_time_total", row_limit=15, max_name_column_width=60
    )


def section_profile(device: str, sizes: Sizes) -> None:
    if device == "hpu":
        print("skipped: torch.profiler's HPU activity needs Habana's profiler set-up; profile on a Gaudi with hl-prof-config")
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        attempt("warm-up run", engine_run, overrides(device, sizes), work / "warm-up", sizes, fixed=True)

        def engine(changes: dict, name: str):
            return lambda profiler: engine_run(overrides(device, sizes, changes), work / name, sizes, fixed=True, profiler=profiler)

        runs = {
            "largebatch engine, bf16": engine({}, "engine"),
            "largebatch engine, bf16, nan_guard off": engine({"nan_guard.action": "off"}, "off"),
            "timm train.py loop, bf16 autocast": lambda profiler: timm_loop(device, sizes, profiler),
        }
        found = {label: attempt(label, profiled, device, sizes, run) for label, run in runs.items()}
    print(
        f"{sizes.model}, micro-batch {sizes.micro}, bf16; {sizes.timed} steps recorded after {sizes.warmup}; "
        "times under the profiler (slower than section c's): compare the rows with each other\n"
    )
    sides = {label: side for label, side in found.items() if side is not None}
    rows = [f"| {label} | {' | '.join(cells)} |" for label, (cells, _) in sides.items()]
    print(table("side | ms per step (wall, profiled): | kernel ms per step: | device busy share: | kernels per step:", rows))
    for label, (_, ops) in sides.items():
        print(f"\n{label}: the ops that took the most {'device' if device == 'cuda' else 'CPU'} time\n\n```\n{ops}\n```")
    if len(sides) < len(runs):
        raise SystemExit("a side failed: see its line above and the traceback in the log")


def section_accuracy(device: str, sizes: Sizes) -> None:
    if not (common.REPO / "data" / "fashion-mnist" / "dataset.json").exists():
        print("skipped: data/fashion-mnist is absent; prepare it with `python data/prepare_fmnist.py`")
        return
    with tempfile.TemporaryDirectory() as tmp:
        args = ["train.py", "--config", "configs/demo/vit-tiny-fmnist.py", "--set", f"device={device}", "--run-dir", f"{tmp}/run"]
        args += ["--set", "epochs=1", "--set", "max_steps=3"] if sizes is QUICK else []
        print(f"command: `{' '.join(['python', *args])}`")
        start = time.perf_counter()
        common.run_or_fail(args)
        seconds = time.perf_counter() - start
        evals = [r for r in read_metrics(RunDir(pathlib.Path(tmp, "run")).metrics) if "eval/top1" in r]
    top1 = evals[-1]["eval/top1"] if evals else float("nan")
    row = f"| Fashion-MNIST demo on one {device} device | {100 * top1:.1f}% | {seconds:.0f} | 86.6% |"
    print("\n" + table("run | final eval/top1: | seconds: | the CPU demo (2 processes):", [row]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("section", choices=[*SECTIONS, "distributed-worker"])  # SECTIONS: bench/accelerator.py's, in order
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
        globals()[f"section_{args.section}"](args.device, QUICK if args.quick else FULL)


if __name__ == "__main__":
    main()
