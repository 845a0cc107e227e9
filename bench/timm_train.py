"""End-to-end CPU training images/s: largebatch against timm's train.py recipe, same images.

What it compares and how it times: BENCHMARKS.md, "End-to-end training against timm's `train.py` path, and model-FLOPs utilisation".

    python bench/timm_train.py [--images 256] [--batch 32] [--epochs 3] [--rounds 2]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: start again as the module (bench/common.py)
    __import__("common").run_as_module(__file__)

import pathlib
import statistics
import tempfile
import time

import torch

from bench.common import MODEL, build_engine, image_shards, in_turn, machine_description, options, shard_data, table
from largebatch.backends import Backend, create_backend
from largebatch.engine.engine import Engine
from largebatch.engine.hook import Hook

CLASSES = 8


class EpochTimer(Hook):
    """images/s of each training epoch, from before_epoch to after_epoch (no evaluation)."""

    def __init__(self) -> None:
        super().__init__()
        self.rates: list[float] = []

    def before_epoch(self, state) -> None:
        self.start, self.seen = time.perf_counter(), state.samples_seen

    def after_epoch(self, state) -> None:
        self.rates.append((state.samples_seen - self.seen) / (time.perf_counter() - self.start))


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
    return timer.rates


def timm_model(name: str, classes: int, image_size: int, device: torch.device, **kwargs) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A seeded timm model on ``device`` and AdamW as timm's ``create_optimizer_v2`` builds it."""
    import timm
    from timm.optim import create_optimizer_v2

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=classes, img_size=image_size, **kwargs).to(device)
    return model, create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)


def timm_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, images, target, backend: Backend) -> torch.Tensor:
    """One batch of timm train.py's loop: forward and loss under the backend's autocast,
    backward, ``dispatch_clip_grad`` at 1.0, the optimizer's step; the loss."""
    from timm.utils import dispatch_clip_grad

    with backend.autocast():
        loss = torch.nn.functional.cross_entropy(model(images), target)
    optimizer.zero_grad()
    loss.backward()
    backend.after_backward()
    dispatch_clip_grad(model.parameters(), value=1.0, mode="norm")
    optimizer.step()
    backend.after_optimizer_step()
    return loss


def timm_round(args, folder: pathlib.Path) -> list[float]:
    """timm train.py's CPU training path (ImageFolder + ``create_loader``, per-update
    cosine schedule), per-epoch images/s."""
    from timm.data import create_dataset, create_loader
    from timm.scheduler import create_scheduler_v2
    from timm.utils import AverageMeter

    backend = create_backend("cpu", "fp32")
    model, optimizer = timm_model(args.model, CLASSES, args.image_size, backend.device, patch_size=args.patch, depth=args.depth)
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
        device=backend.device,
        use_prefetcher=False,
    )
    scheduler, _ = create_scheduler_v2(
        optimizer, sched="cosine", num_epochs=args.epochs, warmup_epochs=0, step_on_epochs=False, updates_per_epoch=len(loader)
    )
    rates, num_updates = [], 0
    for epoch in range(args.epochs):
        model.train()
        losses, count, start = AverageMeter(), 0, time.perf_counter()
        for images, target in loader:
            loss = timm_step(model, optimizer, images, target, backend)
            num_updates += 1
            losses.update(loss.item(), images.size(0))
            scheduler.step_update(num_updates=num_updates, metric=losses.avg)
            count += images.shape[0]
        scheduler.step(epoch + 1)
        rates.append(count / (time.perf_counter() - start))
    return rates


def main(argv: list[str] | None = None) -> None:
    epochs = (3, "per round; the first is a warm-up")
    parser = options(
        __doc__, images=256, batch=32, epochs=epochs, rounds=2, workers=1, **MODEL | {"image_size": 64, "patch": 8, "depth": 4}
    )
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
