"""Large-batch study: LAMB, AdamW and SGD at global batch 256, 4,096 and 16,384.

The demo ViT (``configs/demo/vit-tiny-fmnist.py``) trains on Fashion-MNIST for the same
number of epochs at each global batch; the larger batches come from gradient
accumulation over the same 256-image micro-batches, so every run sees the same images
(``partial_window='step'``: the epoch's trailing partial window is a smaller last step
rather than being dropped). Each optimizer keeps its own base learning rate, tuned for
batch 256, and grows it with the rule it is published with:

* LAMB: square-root scaling (You et al. 2019, "Large Batch Optimization for Deep
  Learning: Training BERT in 76 minutes");
* AdamW: linear scaling, as DeiT scales its ``5e-4 x batch / 512``;
* SGD with momentum 0.9: linear scaling (Goyal et al. 2017, "Accurate, Large Minibatch
  SGD").

All share one linear warmup (``--warmup-epochs``), cosine decay, clipping at norm 1.0
and the demo's model and augmentation. Each run is a ``largebatch train`` subprocess;
its per-epoch test accuracy is read from ``metrics.jsonl``. Results are appended to the
JSON file after every run (a run already there is skipped, so a stopped study resumes),
then rendered as a Markdown table and a PNG plot.

    OMP_NUM_THREADS=1 python bench/large_batch_study.py [--epochs 3] [--out bench/results]
    python bench/large_batch_study.py --report-only     # table and plot from the JSON
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO / "configs" / "demo" / "vit-tiny-fmnist.py"

# Base learning rate at batch 256, scaling rule, and extra optimizer settings.
RECIPES = {
    "lamb": dict(lr=1e-2, scaling="sqrt", weight_decay=0.05, extra={}),
    "adamw": dict(lr=1e-3, scaling="linear", weight_decay=0.05, extra={}),
    "sgd": dict(lr=0.1, scaling="linear", weight_decay=1e-4, extra={"momentum": 0.9}),
}
BASE_BATCH = 256
# The demo ViT as the README's demo trains it: 7-pixel patches (16 tokens), width 128,
# 4 layers of 4 heads, whole images. Stated here so the study does not move when the
# demo config is retuned.
DEMO_VIT = {
    "model.patch_size": 7,
    "model.embed_dim": 128,
    "model.depth": 4,
    "model.num_heads": 4,
    "model.mlp_ratio": 2.0,
    "data.scale": "[1.0, 1.0]",
}


def run_overrides(optimizer: str, global_batch: int, args: argparse.Namespace) -> list[str]:
    recipe = RECIPES[optimizer]
    sets = {
        **DEMO_VIT,
        "epochs": args.epochs,
        "global_batch_size": global_batch,
        "micro_batch_size": args.micro,
        "partial_window": "step",
        "optimizer.type": optimizer,
        "optimizer.lr": recipe["lr"],
        "optimizer.weight_decay": recipe["weight_decay"],
        "lr_schedule.type": "cosine",
        "lr_schedule.warmup_epochs": args.warmup_epochs,
        "lr_schedule.scaling": recipe["scaling"],
        "lr_schedule.base_batch_size": BASE_BATCH,
        "eval.interval_epochs": 1,
        "checkpoint.interval_epochs": 0,
        "checkpoint.at_end": False,
        "log.interval": 1000,
        "data.root": str(args.data),
        **{f"optimizer.{k}": v for k, v in recipe["extra"].items()},
    }
    if args.steps_per_epoch:
        sets["steps_per_epoch"] = args.steps_per_epoch
    return [f"{key}={value}" for key, value in sets.items()] + list(args.set)


def run_one(optimizer: str, global_batch: int, args: argparse.Namespace) -> dict:
    overrides = run_overrides(optimizer, global_batch, args)
    with tempfile.TemporaryDirectory(prefix="lbstudy-") as tmp:
        run_dir = pathlib.Path(tmp) / "run"
        cmd = [sys.executable, "-m", "largebatch", "train", "--config", str(args.config), "--run-dir", str(run_dir)]
        for item in overrides:
            cmd += ["--set", item]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        start = time.time()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        seconds = time.time() - start
        if proc.returncode != 0:
            raise SystemExit(f"error: run {optimizer} batch {global_batch} failed (status {proc.returncode}):\n{proc.stderr[-3000:]}")
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        derived = __import__("yaml").safe_load((run_dir / "config.yaml").read_text())["derived"]
    evals = [r for r in records if "eval/top1" in r]
    train = [r for r in records if "loss" in r]
    return {
        "optimizer": optimizer,
        "global_batch_size": global_batch,
        "accumulation": derived["accumulation"],
        "steps": derived["total_steps"],
        "peak_lr": derived["peak_lr"],
        "warmup_steps": derived["warmup_steps"],
        "scaling": RECIPES[optimizer]["scaling"],
        "test_top1_per_epoch": [r["eval/top1"] for r in evals],
        "test_loss_per_epoch": [r["eval/loss"] for r in evals],
        "final_test_top1": evals[-1]["eval/top1"] if evals else None,
        "final_train_loss": train[-1]["loss"] if train else None,
        "seconds": round(seconds, 1),
        "overrides": overrides,
    }


def load_results(path: pathlib.Path) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    return {"runs": []}


def render(results: dict, out: pathlib.Path, stem: str) -> None:
    runs = results["runs"]
    batches = sorted({r["global_batch_size"] for r in runs})
    optimizers = [o for o in RECIPES if any(r["optimizer"] == o for r in runs)]
    by_key = {(r["optimizer"], r["global_batch_size"]): r for r in runs}
    lines = [
        "# Large-batch study: LAMB, AdamW and SGD on Fashion-MNIST",
        "",
        f"Machine: {results.get('machine', '?')}; load before the study: {results.get('uptime', '?')}.",
        "",
        f"Command: `{results.get('command', '?')}`",
        "",
        f"Model and data: {' '.join(str(results.get('model', '?')).split())}; {results.get('epochs', '?')} epochs at every batch size, "
        f"micro-batch {results.get('micro', '?')}, the larger batches by accumulation; one linear warmup of "
        f"{results.get('warmup_epochs', '?')} epoch(s), then cosine decay; gradient clipping 1.0.",
        "",
        "Final test top-1 (%) on the 10,000 Fashion-MNIST test images:",
        "",
        "| optimizer (scaling, lr at 256) | " + " | ".join(f"batch {b}" for b in batches) + " |",
        "|---|" + "---:|" * len(batches),
    ]
    for opt in optimizers:
        recipe = RECIPES[opt]
        cells = []
        for b in batches:
            r = by_key.get((opt, b))
            cells.append("-" if r is None else f"{100 * r['final_test_top1']:.1f}")
        lines.append(f"| {opt} ({recipe['scaling']}, {recipe['lr']:g}) | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Per run: accumulation, optimizer steps, warmup steps, peak learning rate, test top-1 per epoch, wall time:",
        "",
        "| optimizer | batch | accumulation | steps | warmup | peak lr | top-1 per epoch (%) | seconds |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in sorted(runs, key=lambda r: (list(RECIPES).index(r["optimizer"]), r["global_batch_size"])):
        per_epoch = ", ".join(f"{100 * a:.1f}" for a in r["test_top1_per_epoch"])
        lines.append(
            f"| {r['optimizer']} | {r['global_batch_size']} | {r['accumulation']} | {r['steps']} | {r['warmup_steps']} | "
            f"{r['peak_lr']:.4g} | {per_epoch} | {r['seconds']:.0f} |"
        )
    reading = results.get("reading")
    if reading:
        lines += ["", "## Reading", "", reading]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    plot(runs, batches, optimizers, out / f"{stem}.png")


def plot(runs: list[dict], batches: list[int], optimizers: list[str], path: pathlib.Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_key = {(r["optimizer"], r["global_batch_size"]): r for r in runs}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for opt in optimizers:
        xs = [b for b in batches if (opt, b) in by_key]
        left.plot(xs, [100 * by_key[(opt, b)]["final_test_top1"] for b in xs], marker="o", label=opt)
    left.set_xscale("log", base=2)
    left.set_xticks(batches, [str(b) for b in batches])
    left.set_xlabel("global batch size")
    left.set_ylabel("final test top-1 (%)")
    left.set_title("accuracy after the same number of epochs")
    left.grid(alpha=0.3)
    left.legend()
    styles = dict(zip(batches, ["-", "--", ":", "-."]))
    colors = dict(zip(optimizers, ["C0", "C1", "C2"]))
    for r in runs:
        acc = [100 * a for a in r["test_top1_per_epoch"]]
        right.plot(
            range(1, len(acc) + 1),
            acc,
            styles.get(r["global_batch_size"], "-"),
            color=colors[r["optimizer"]],
            marker=".",
            label=f"{r['optimizer']} {r['global_batch_size']}",
        )
    right.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    right.set_xlabel("epoch")
    right.set_ylabel("test top-1 (%)")
    right.set_title("test accuracy per epoch")
    right.grid(alpha=0.3)
    right.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--warmup-epochs", type=float, default=0.5)
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 4096, 16384])
    parser.add_argument("--optimizers", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--micro", type=int, default=256, help="micro-batch size (the same for every run)")
    parser.add_argument("--steps-per-epoch", type=int, help="cap optimizer steps per epoch (smoke tests)")
    parser.add_argument("--config", type=pathlib.Path, default=DEMO_CONFIG)
    parser.add_argument("--data", type=pathlib.Path, default=REPO / "data" / "fashion-mnist")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra override for every run")
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "bench" / "results")
    parser.add_argument("--stem", default="large_batch_study", help="output file names: STEM.json, STEM.md, STEM.png")
    parser.add_argument("--report-only", action="store_true", help="render the table and plot from the JSON only")
    parser.add_argument(
        "--merge",
        type=pathlib.Path,
        nargs="+",
        default=[],
        metavar="JSON",
        help="with --report-only: combine the runs of these JSON files (studies run in parallel, one per optimizer)",
    )
    parser.add_argument("--reading", type=pathlib.Path, help="a Markdown file with the results' reading, kept in the JSON")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / f"{args.stem}.json"
    results = load_results(json_path)
    if args.merge:
        parts = [load_results(path) for path in args.merge]
        results = {**parts[0], "runs": [run for part in parts for run in part["runs"]]}
        results["command"] = " ; ".join(part.get("command", "?") for part in parts)
        json_path.write_text(json.dumps(results, indent=1) + "\n")
    if not args.report_only:
        import yaml

        from bench.machine import machine_description
        from largebatch.config import load_config, validate

        if not results["runs"]:
            model = validate(load_config(str(args.config), [f"{k}={v}" for k, v in DEMO_VIT.items()]))["model"]
            results.update(
                machine=machine_description(),
                uptime=subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
                command="python bench/large_batch_study.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                model=f"{args.config.relative_to(REPO) if args.config.is_relative_to(REPO) else args.config} "
                + yaml.safe_dump(model, default_flow_style=True, width=1000).strip(),
                epochs=args.epochs,
                micro=args.micro,
                warmup_epochs=args.warmup_epochs,
            )
        done = {(r["optimizer"], r["global_batch_size"]) for r in results["runs"]}
        for batch in args.batches:
            for opt in args.optimizers:
                if (opt, batch) in done:
                    continue
                record = run_one(opt, batch, args)
                results["runs"].append(record)
                json_path.write_text(json.dumps(results, indent=1) + "\n")
                print(f"{opt} batch {batch}: test top-1 {100 * record['final_test_top1']:.1f}% in {record['seconds']:.0f}s", flush=True)
                render(results, args.out, args.stem)
    if args.reading:
        results["reading"] = args.reading.read_text().strip()
        json_path.write_text(json.dumps(results, indent=1) + "\n")
    if results["runs"]:
        render(results, args.out, args.stem)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
