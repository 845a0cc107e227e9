"""The ``largebatch`` command line: ``train``, ``config show|keys|import``, ``data ...``, ``export``, ``plot``, ``study ...``.

Every command runs through ``largebatch.train_command.run``: a user mistake
(``UserError``) prints one line starting with ``error:`` and exits with status 2, a hook
that raises one ``error:`` line and status 1; ``--debug`` shows the traceback as well. The
``train`` command is ``largebatch.train_command``'s.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import typing
from collections.abc import Sequence

from largebatch.errors import UserError
from largebatch.train_command import ArgumentParser, add_train_arguments, cmd_train, run


def train_sample_count(cfg: typing.Any) -> tuple[int, str]:
    """Training samples for ``config show`` (``cfg``: the typed config): counted from the
    data when it is at hand, else the config's ``data.train_samples``."""
    from largebatch import data as data_mod

    if cfg.data.loader == "synthetic":
        return cfg.data.train_samples, "synthetic"
    try:
        return data_mod.count_samples(cfg.data, "train"), "counted from the shards"
    except (UserError, OSError, ImportError):
        return cfg.data.train_samples, "data.train_samples (shards not found)"


def cmd_config_show(args: argparse.Namespace) -> int:
    from largebatch.config import derive, dump_yaml, resolve_config
    from largebatch.config.redact import config_record
    from largebatch.dist import discover
    from largebatch.footprint import estimate_memory
    from largebatch.hooks import build_hooks
    from largebatch.tasks import build_task

    cfg = resolve_config(args.config, args.overrides)
    build_hooks(
        cfg.hooks, checkpoint=cfg.checkpoint, log=cfg.log, ema=cfg.ema, config_path=pathlib.Path(args.config)
    )  # a bad hook or task spec is a config mistake too
    build_task(cfg.task, pathlib.Path(args.config))
    world_size = args.world_size or discover().world_size
    samples, source = train_sample_count(cfg)
    derived = derive(cfg, world_size, samples)
    shown = config_record(cfg, derived, train_samples_from=source, memory_estimate=estimate_memory(cfg, derived))
    sys.stdout.write(dump_yaml(shown))
    return 0


def cmd_config_keys(args: argparse.Namespace) -> int:
    from largebatch.config import reference

    if args.write:
        reference.write_reference(args.write)
        return 0
    sys.stdout.write(reference.render_markdown(args.section) if args.markdown else reference.render_text(reference.select(args.section)))
    return 0


def cmd_config_import_colossalai(args: argparse.Namespace) -> int:
    from largebatch.importers.colossalai.importer import import_colossalai

    out = pathlib.Path(args.out) if args.out else None
    if out is not None and out.exists() and not args.force:
        raise UserError(f"{out} exists; give another --out, or --force to overwrite it", key="--out")
    text = import_colossalai(args.config, args.train_script, args.world_size, args.overrides, args.out)
    if out is None:
        sys.stdout.write(text)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    world = f" --world-size {args.world_size}" if args.world_size else ""
    print(f"{out}: written; its header lists where each value came from and what was not mapped (largebatch config show {out}{world})")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from largebatch.export import export_run

    out = export_run(args.run_dir, args.out, ema=args.ema, force=args.force)
    what = "the EMA weights as model.safetensors" if args.ema else "model.safetensors"
    print(f"{out}: {what}, config.json and the model card README.md; load with timm.create_model('local-dir:{out}', pretrained=True)")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from largebatch.run_curves import plot_run

    for path in plot_run(args.run_dir, args.out, args.critical_batch):
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="largebatch", description="Large-batch ViT pretraining.")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train from a config")
    add_train_arguments(train)
    train.set_defaults(func=cmd_train)

    config = commands.add_parser("config", help="inspect and import configs")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    show = config_commands.add_parser("show", help="print the resolved config and its derived numbers as YAML")
    show.add_argument("config")
    show.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    show.add_argument("--world-size", type=int, help="number of processes (default: from the launcher's environment, else 1)")
    show.add_argument("--debug", action="store_true")
    show.set_defaults(func=cmd_config_show)

    keys = config_commands.add_parser("keys", help="list every config key with its type, default and meaning")
    keys.add_argument("section", nargs="?", default="", help="one section or key, e.g. optimizer or optimizer.lr")
    keys.add_argument("--markdown", action="store_true", help="print the markdown tables of docs/configs.md")
    keys.add_argument("--write", metavar="PAGE", help="replace the generated key reference in PAGE (docs/configs.md)")
    keys.add_argument("--debug", action="store_true")
    keys.set_defaults(func=cmd_config_keys)

    imports = config_commands.add_parser("import", help="write a largebatch config from another framework's config")
    import_from = imports.add_subparsers(dest="import_from", required=True)
    colossal = import_from.add_parser(
        "colossalai", help="from a Colossal-AI legacy config (colossalai need not be installed) and, optionally, its train script"
    )
    colossal.add_argument("config", help="the Colossal-AI config file (BATCH_SIZE, NUM_EPOCHS, fp16, gradient_accumulation, ...)")
    colossal.add_argument("--train-script", help="its train script, read (not run) for the optimizer, schedule, model and loss")
    colossal.add_argument("--world-size", type=int, help="the number of devices it ran on (the global batch depends on it)")
    colossal.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="set a value of the result")
    colossal.add_argument("--out", help="the config file to write (default: print it)")
    colossal.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    colossal.add_argument("--debug", action="store_true")
    colossal.set_defaults(func=cmd_config_import_colossalai)

    export = commands.add_parser("export", help="write a finished run's weights with timm's config.json into a folder")
    export.add_argument("run_dir", help="the run directory (holds config.yaml and model.safetensors)")
    export.add_argument("--out", required=True, help="the folder to write (timm 'local-dir:', Hub upload_folder)")
    export.add_argument("--ema", action="store_true", help="export the run's EMA weights (model_ema.safetensors) instead")
    export.add_argument("--force", action="store_true", help="replace model.safetensors, config.json and README.md if --out holds them")
    export.add_argument("--debug", action="store_true")
    export.set_defaults(func=cmd_export)

    plot = commands.add_parser("plot", help="write PNG curves (loss, accuracy, lr, throughput, grad norm, trust ratio, batch) of a run")
    plot.add_argument("run_dir", help="the run directory (holds metrics.jsonl)")
    plot.add_argument("--out", metavar="DIR", help="write the PNGs into DIR (default: the run directory)")
    plot.add_argument(
        "--critical-batch",
        metavar="STUDY",
        help="draw the critical batch along the run in batch.png, from a study (its folder or report.json) whose branches.run is this run",
    )
    plot.add_argument("--debug", action="store_true")
    plot.set_defaults(func=cmd_plot)

    from largebatch.study import cli as study_cli  # imports nothing heavy: optuna loads inside the commands

    study_cli.register(commands)

    try:
        from largebatch.shards import cli as data_cli
    except ImportError:
        data_cli = None
    if data_cli is not None:
        data = commands.add_parser("data", help="prepare and check TFRecord shards")
        data.add_argument("--debug", action="store_true")
        data_cli.register(data.add_subparsers(dest="data_command", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "debug", False):
        os.environ.setdefault("LARGEBATCH_DEBUG", "1")
    return run(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
