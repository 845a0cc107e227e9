"""Per-rank peak memory of training under ``ddp`` against ``fsdp``, and the estimate's error.

What it compares and how it times: BENCHMARKS.md, "Sharded training: memory".

    OMP_NUM_THREADS=1 python bench/sharded_memory.py
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: start again as the module (bench/common.py)
    __import__("common").run_as_module(__file__)

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import tempfile

from bench.common import config, machine_description, options, repo_env, run_or_fail, table


def rss_kib(field: str) -> int:
    """``field`` of this process's /proc status (VmRSS, VmHWM) in KiB."""
    return int(next(line.split()[1] for line in pathlib.Path("/proc/self/status").read_text().splitlines() if line.startswith(f"{field}:")))


def run_config(strategy: str, accumulation: int, every: bool, model: str = "vit_base_patch16_224"):
    """The bench's config: the base config with LAMB at world size 2, as ``largebatch train`` resolves it."""
    lamb, dist = {"type": "lamb", "lr": 1e-3, "weight_decay": 0.05}, {"strategy": strategy, "reduce_every_micro_batch": every}
    batch = {"global_batch_size": 2 * accumulation * 2, "micro_batch_size": 2}
    return config({**batch, "model": {"name": model}, "optimizer": lamb, "dist": dist, "data.train_samples": 64})


def worker(args: argparse.Namespace) -> None:
    import torch

    from largebatch.backends import create_backend
    from largebatch.config import derive
    from largebatch.dist import discover, init_process_group
    from largebatch.engine.accumulation import sync_context
    from largebatch.footprint import estimate_memory
    from largebatch.models import build_model
    from largebatch.optim import build_optimizer

    info = discover()
    init_process_group(info, "gloo", 10.0)
    cfg = run_config(args.strategy, args.accumulation, args.every, args.model)
    derived = derive(cfg, info.world_size, 64)
    backend = create_backend("cpu", "fp32", info.local_rank)
    tiny = run_config(args.strategy, args.accumulation, args.every, "vit_tiny_patch16_224")
    build_model(dataclasses.replace(tiny.model, extra={"depth": 1}), tiny.data)  # timm's import and first model, not counted
    before = rss_kib("VmRSS")
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.data)
    if args.strategy == "ddp":
        train_model = backend.wrap_ddp(model, cfg.dist)
    else:
        train_model = model = backend.shard_model(model, derived)
    optimizer = build_optimizer(cfg.optimizer, model)
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS from here on
    images, labels = torch.randn(2, 3, 32, 32), torch.randint(10, (2,))
    for _ in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        for micro in range(args.accumulation):
            with sync_context(train_model, micro, args.accumulation, sync_all=args.every):
                loss = torch.nn.functional.cross_entropy(train_model(images), labels) / args.accumulation
                loss.backward()
        optimizer.step()
    peak = rss_kib("VmHWM")
    estimate = estimate_memory(cfg, derived)
    record = {"rank": info.rank, "measured_mib": (peak - before) / 1024, "estimate_mib": estimate["total_gib"] * 1024}
    pathlib.Path(args.out).with_suffix(f".rank{info.rank}.json").write_text(json.dumps(record))
    torch.distributed.destroy_process_group()


def side(name: str, strategy: str, args: argparse.Namespace, every: bool = False) -> dict:
    out = pathlib.Path(tempfile.mkdtemp(prefix="lbmem-")) / "side"
    cmd = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "bench.sharded_memory", "--worker", "--strategy"]
    cmd += [strategy, "--out", str(out), "--steps", str(args.steps), "--accumulation", str(args.accumulation), "--model", args.model]
    cmd += ["--every"] if every else []
    # A fixed mmap threshold: freed tensors go back to the system, so resident memory follows
    # the live tensors (glibc's default raises the threshold and keeps their pages).
    env = {**repo_env(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "MALLOC_MMAP_THRESHOLD_": "65536"}
    run_or_fail(cmd, env)
    ranks = [json.loads(out.with_suffix(f".rank{r}.json").read_text()) for r in (0, 1)]
    return {"name": name, "measured": max(r["measured_mib"] for r in ranks), "estimate": ranks[0]["estimate_mib"]}


def main(argv: list[str] | None = None) -> int:
    parser = options(__doc__, steps=3, accumulation=2, model=("vit_base_patch16_224", "timm model whose parameters are trained"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="ddp", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--every", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    rows = [
        side("ddp", "ddp", args),
        side("ddp again (A/A control)", "ddp", args),
        side("fsdp", "fsdp", args),
        side("fsdp, dist.reduce_every_micro_batch", "fsdp", args, every=True),
    ]
    base = rows[0]["measured"]
    print(f"Machine: {machine_description()}.\n")
    print(f"{args.model}, LAMB, world size 2, accumulation {args.accumulation}, {args.steps} steps; per-rank peak.\n")
    lines = [
        f"| {r['name']} | {r['measured']:,.0f} | {r['measured'] / base:.2f} | {r['estimate']:,.0f} | {r['estimate'] / r['measured'] - 1:+.0%} |"
        for r in rows
    ]
    print(table("run | measured (MiB): | ratio to ddp: | estimate (MiB): | estimate error:", lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
