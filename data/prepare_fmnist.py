#!/usr/bin/env python3
"""Prepare Fashion-MNIST as TFRecord shards in data/fashion-mnist/.

Uses Debian's ``dataset-fashion-mnist`` package (MIT licence, 70,000 28x28 grayscale
images, 10 classes). When the package is missing: as root, runs ``apt-get update`` and
``apt-get install -y dataset-fashion-mnist``; otherwise prints the command that would
and exits 1. Then converts (8 train shards, 2 validation shards, labels 0..9);
finished shards are kept on a re-run.

    python data/prepare_fmnist.py [--out DIR] [--limit N] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from largebatch.errors import UserError  # noqa: E402
from largebatch.shards import FASHION_MNIST_DIR, convert  # noqa: E402 - after the sys.path line
from largebatch.shards.pool import default_workers  # noqa: E402

PACKAGE = "dataset-fashion-mnist"
INSTALL = f"apt-get update && apt-get install -y {PACKAGE}"


def ensure_package(src: Path) -> bool:
    """True when the idx files are there (installing them first when running as root)."""
    if (src / "train-images-idx3-ubyte.gz").is_file():
        return True
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"installing {PACKAGE}: {INSTALL}", flush=True)
        subprocess.run(["apt-get", "update"], check=True)
        subprocess.run(["apt-get", "install", "-y", PACKAGE], check=True)
        return (src / "train-images-idx3-ubyte.gz").is_file()
    print(
        f"Fashion-MNIST is not installed at {src}; install it with:\n  sudo sh -c '{INSTALL}'",
        file=sys.stderr,
    )
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "data" / "fashion-mnist"))
    parser.add_argument("--src", default=FASHION_MNIST_DIR)
    parser.add_argument("--limit", type=int, help="only the first N records per split")
    parser.add_argument(
        "--workers", type=int, default=default_workers(), help="shards written at once (default: the usable CPUs, at most 8)"
    )
    args = parser.parse_args(argv)
    if not ensure_package(Path(args.src)):
        return 1
    try:
        meta = convert.convert_fashion_mnist(args.out, src=args.src, limit=args.limit, workers=args.workers)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for split, info in meta["splits"].items():
        print(f"{args.out}: {split}: {info['records']} records in {info['shards']} shards")
    return 0


if __name__ == "__main__":
    sys.exit(main())
