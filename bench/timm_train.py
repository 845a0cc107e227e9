"""End-to-end CPU training images/s: largebatch against timm's train.py recipe, same images.

What it compares and how it times: BENCHMARKS.md, "End-to-end training against timm's `train.py` path, and model-FLOPs utilisation".

    python bench/timm_train.py [--images 256] [--batch 32] [--epochs 3] [--rounds 2]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: start again as the module (bench/common.py)
    __import__("common").run_as_module(__file__)

import argparse
import pathlib
import statistics
import tempfile
import time

import torch

from bench.common import add_model_arguments, build_engine, image_shards, in_turn, machine_description, shard_data, table
from largebatch.engine.engine import Engine
from largebatch.engine.hook import Hook

CLASSES = 8


class EpochTimer(Hook):
    """Wall time of each training epoch, from before_epoch to after_epoch (no evaluation)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []
        self.samples: list[int] = []
        self._start = 0.0
        self._seen = 0

    def before_epoch(self, state) -> None:
        self._start, self._seen = time.perf_counter(), state.samples_seen

    def after_epoch(self, state) -> None:
        self.seconds.append(time.perf_counter() - self._start)
        self.samples.append(state.samples_seen - self._seen)


def overrides(args, shards: pathlib.Path) -> dict:
    return {
        "epochs": args.epochs,
        "global_batch_size": args.batch,
        "micro_batch_size": args.batch,
        "model": {"name": args.model, "patch_size": args.patch, "depth": args.depth},
        "lr_schedule.warmup_steps": 0,
        "data": shard_data(shards, args.image_size, args.workers),
        "log.interval": 10,
    }


def largebatch_round(cfg: dict, run_dir: pathlib.Path) -> list[float]:
    engine = build_engine(cfg, run_dir)
    timer = EpochTimer()
    engine = Engine(engine.state, [*engine.hooks, timer], engine.train_loader, engine.eval_loader)
    engine.run()
    return [n / s for n, s in zip(timer.samples, timer.seconds)]


def timm_round(args, folder: pathlib.Path) -> list[float]:
    """timm train.py's CPU training path (see the module docstring), per-epoch images/s."""
    import timm
    from timm.data import create_dataset, create_loader
    from timm.optim import create_optimizer_v2
    from timm.scheduler import create_scheduler_v2
    from timm.utils import AverageMeter, dispatch_clip_grad

    torch.manual_seed(0)
    device = torch.device("cpu")
    model = timm.create_model(
        args.model, pretrained=False, num_classes=CLASSES, img_size=args.image_size, patch_size=args.patch, depth=args.depth
    )
    dataset = create_dataset("", root=str(folder), split="train", is_training=True, batch_size=args.batch)
    loader = create_loader(
        dataset,
        input_size=(3, args.image_size, args.image_size),
        batch_size=args.batch,
        is_training=True,
        scale=(0.08, 1.0),
        hflip=0.5,
        color_jitter=None,
        interpolation="bilinear",
        num_workers=args.workers,
        device=device,
        use_prefetcher=False,
    )
    optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
    updates_per_epoch = len(loader)
    scheduler, _ = create_scheduler_v2(
        optimizer, sched="cosine", num_epochs=args.epochs, warmup_epochs=0, step_on_epochs=False, updates_per_epoch=updates_per_epoch
    )
    loss_fn = torch.nn.CrossEntropyLoss()
    rates = []
    num_updates = 0
    for epoch in range(args.epochs):
        model.train()
        losses = AverageMeter()
        count, start = 0, time.perf_counter()
        for images, target in loader:
            images, target = images.to(device), target.to(device)
            loss = loss_fn(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            dispatch_clip_grad(model.parameters(), value=1.0, mode="norm")
            optimizer.step()
            num_updates += 1
            losses.update(loss.item(), images.size(0))
            scheduler.step_update(num_updates=num_updates, metric=losses.avg)
            count += images.shape[0]
        scheduler.step(epoch + 1)
        rates.append(count / (time.perf_counter() - start))
    return rates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3, help="per round; the first is a warm-up")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    add_model_arguments(parser, image_size=64, patch=8, depth=4)
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first is a warm-up)")
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        cfg = overrides(args, image_shards(work, args.images))
        for i in range(args.rounds):
            for name, rates in in_turn([("largebatch", ours), ("timm", theirs)], i):
                epoch_rates = largebatch_round(cfg, work / f"run{i}") if name == "largebatch" else timm_round(args, work / "folder")
                rates.extend(epoch_rates[1:])
    ours_rate, timm_rate = statistics.median(ours), statistics.median(theirs)
    print(f"Machine: {machine_description()}.")
    print(
        f"model {args.model} depth {args.depth}, {args.image_size}px patch {args.patch}, batch {args.batch}, "
        f"{args.images} JPEGs (~500x375), {args.workers} loader worker(s), {args.epochs} epochs x {args.rounds} rounds "
        "(first epoch of each round not counted)"
    )
    print(table("training loop | images/s (median epoch): | epochs"))
    print(f"| timm train.py path (ImageFolder + PIL) | {timm_rate:.1f} | {', '.join(f'{r:.1f}' for r in theirs)} |")
    print(f"| largebatch (native TFRecord loader, engine) | {ours_rate:.1f} | {', '.join(f'{r:.1f}' for r in ours)} |")
    print(f"largebatch / timm = {ours_rate / timm_rate:.3f}")


if __name__ == "__main__":
    main()
