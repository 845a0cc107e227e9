"""``largebatch data convert | index | verify``.

The main command line calls :func:`register` with its ``data`` subparsers; each
subcommand stores its handler as ``func`` (``args.func(args) -> int``). Problems raise
``UserError``/``DataError``, which the main command line prints as one ``error:`` line
(exit status 2). ``python -m largebatch.shards.cli ...`` runs the same commands alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from largebatch.config.schema import default_of
from largebatch.errors import UserError
from largebatch.shards import FASHION_MNIST_DIR

MAX_PIXELS = default_of("data.max_pixels")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _workers(args: argparse.Namespace) -> int:
    from largebatch.shards.pool import default_workers

    return args.workers or default_workers()


def cmd_convert(args: argparse.Namespace) -> int:
    from largebatch.shards import convert

    common = {
        "limit": args.limit,
        "quality": args.quality,
        "progress": None if not args.quiet else False,
        "workers": _workers(args),
        "force": args.force,
    }
    if args.source == "folder":
        if args.src is None:
            raise UserError("'convert folder' needs the image folder: largebatch data convert folder SRC --out DIR")
        out = args.out or f"data/{Path(args.src).resolve().name}"
        meta = convert.convert_image_folder(
            args.src,
            out,
            train_shards=args.train_shards or 1024,
            validation_shards=args.validation_shards or 128,
            label_offset=1 if args.label_offset is None else args.label_offset,
            max_pixels=args.max_pixels,
            val_labels=args.val_labels,
            **common,
        )
    else:
        if args.val_labels is not None:
            raise UserError("--val-labels is for 'convert folder' (a flat val/ folder's classes)")
        out = args.out or "data/fashion-mnist"
        meta = convert.convert_fashion_mnist(
            out,
            src=args.src or FASHION_MNIST_DIR,
            train_shards=args.train_shards or 8,
            validation_shards=args.validation_shards or 2,
            label_offset=0 if args.label_offset is None else args.label_offset,
            **common,
        )
    for split, info in meta["splits"].items():
        print(f"{out}: {split}: {info['records']} records in {info['shards']} shards")
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    from largebatch.shards import verify

    for path in verify.index_files(args.files, workers=_workers(args)):
        print(path)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from largebatch.shards import convert, verify

    meta = convert.read_meta(args.dir) or {}
    num_classes = args.num_classes if args.num_classes is not None else meta.get("num_classes")
    label_offset = args.label_offset if args.label_offset is not None else meta.get("label_offset", 0)
    splits = args.split or verify.find_splits(args.dir)
    for split in splits:
        count = verify.verify_split(
            args.dir,
            split,
            num_classes=num_classes,
            label_offset=label_offset,
            decode=not args.no_decode,
            progress=None if not args.quiet else False,
            max_pixels=args.max_pixels,
            workers=_workers(args),
        )
        verify.check_split_meta(args.dir, split, meta, count)
        print(f"{args.dir}: {split}: {count} records OK")
    if num_classes is None:
        print("note: labels not range-checked (no dataset.json; pass --num-classes)")
    return 0


def _add_workers(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--workers",
        type=_positive,
        metavar="N",
        help=f"{what} (default: the CPUs this process may use, at most 8)",
    )


def _add_shard_options(parser: argparse.ArgumentParser, workers: str) -> None:
    """``--max-pixels``, ``--workers`` (``workers`` says what runs at once) and ``--quiet``."""
    parser.add_argument(
        "--max-pixels",
        type=_positive,
        default=MAX_PIXELS,
        help=f"refuse an image larger than this (height x width, from its header; default {MAX_PIXELS}, as data.max_pixels)",
    )
    _add_workers(parser, workers)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def register(subparsers) -> None:
    """Add ``convert``, ``index`` and ``verify`` to an argparse subparsers object."""
    p = subparsers.add_parser(
        "convert",
        help="write TFRecord shards (ImageNet schema) from an image folder or Fashion-MNIST",
        description="Write TFRecord shards with index files; a re-run of the same conversion skips finished shards, "
        "and shards of another conversion in --out are refused (or replaced with --force).",
    )
    p.add_argument(
        "source",
        choices=("folder", "fashion-mnist"),
        help="an ImageNet-style folder, or Fashion-MNIST",
    )
    p.add_argument(
        "src",
        nargs="?",
        help=f"the folder with train/<class>/ (and val/<class>/, or val/ with --val-labels); for fashion-mnist default {FASHION_MNIST_DIR}",
    )
    p.add_argument(
        "--out",
        help="output folder (default data/<folder name>, or data/fashion-mnist)",
    )
    p.add_argument(
        "--val-labels",
        metavar="FILE",
        help="the classes of a flat val/ folder (ImageNet's validation archive unpacked as it is): one class "
        "folder name per line in file-name order (TensorFlow's imagenet_2012_validation_synset_labels.txt), "
        "or Kaggle's LOC_val_solution.csv",
    )
    p.add_argument(
        "--train-shards",
        type=_positive,
        help="train shards (default 1024; fashion-mnist 8)",
    )
    p.add_argument(
        "--validation-shards",
        type=_positive,
        help="validation shards (default 128; fashion-mnist 2)",
    )
    p.add_argument(
        "--label-offset",
        type=int,
        help="added to 0-based class numbers (default 1 for folder, as ImageNet; 0 for fashion-mnist)",
    )
    p.add_argument(
        "--limit",
        type=_positive,
        help="only the first N records of each split (for quick tests)",
    )
    p.add_argument(
        "--quality",
        type=int,
        default=95,
        help="JPEG quality when re-encoding (default 95)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the shards of another conversion (another source, classes, counts or options) found in --out",
    )
    _add_shard_options(p, "shards written at once, each by a process of its own; the output is the same for any number")
    p.set_defaults(func=cmd_convert)

    p = subparsers.add_parser("index", help="write <file>.idx (DALI tfrecord2idx format) for TFRecord files")
    p.add_argument("files", nargs="+", help="TFRecord files")
    _add_workers(p, "files indexed at once")
    p.set_defaults(func=cmd_index)

    p = subparsers.add_parser("verify", help="check every record's CRCs, index, JPEG and label")
    p.add_argument("dir", help="the shard folder")
    p.add_argument(
        "--split",
        action="append",
        help="only this split (repeatable; default all found)",
    )
    p.add_argument("--num-classes", type=int, help="label range check (default from dataset.json)")
    p.add_argument("--label-offset", type=int, help="default from dataset.json, else 0")
    p.add_argument("--no-decode", action="store_true", help="skip decoding the JPEGs (their header sizes are still checked)")
    _add_shard_options(p, "shards checked at once; the first problem in shard order is reported, as with one")
    p.set_defaults(func=cmd_verify)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m largebatch.shards.cli", description=__doc__.splitlines()[0])
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
