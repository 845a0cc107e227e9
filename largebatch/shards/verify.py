"""``largebatch data index`` and ``verify``: index files written by walking TFRecord files, and
every record of a split checked (index entry, both CRCs, the Example, its label, the JPEG).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import simplejpeg
from tqdm import tqdm

from largebatch.data.example import IMAGE, LABEL, ExampleDecodeError, class_number, decode_example, image_and_label
from largebatch.data.size_limit import checked_size, undecodable
from largebatch.data.tfrecord import SHARD_NAME_PATTERN, check_index_layout, index_path_for, list_shards, read_index
from largebatch.errors import DataError
from largebatch.shards.convert import MAX_PIXELS, META_FILE, no_bar
from largebatch.shards.pool import Tick, run_jobs
from largebatch.shards.records import iter_records, scan_index, write_index


def index_files(paths: Sequence[str | os.PathLike], *, workers: int = 1) -> list[Path]:
    """Write ``<file>.idx`` for each TFRecord file (CRCs are checked while walking it),
    ``workers`` files at a time."""
    paths = [Path(path) for path in paths]
    for path in paths:
        if not path.is_file():
            raise DataError("no such TFRecord file", path=str(path))
    return run_jobs(index_file, [(path,) for path in paths], workers=workers)


def index_file(path: Path, tick: Tick) -> Path:
    """Write one file's index; its path."""
    write_index(index_path_for(path), scan_index(path, verify_crc=True))
    tick(1)
    return index_path_for(path)


def find_splits(root: str | os.PathLike) -> list[str]:
    """Split names that have shard files under ``root``."""
    root = Path(root)
    if not root.is_dir():
        raise DataError("no such folder", path=str(root))
    splits = sorted({m.group("split") for p in root.iterdir() if (m := SHARD_NAME_PATTERN.match(p.name))})
    if not splits:
        raise DataError("no TFRecord shards (files named <split>-00000-of-00008)", path=str(root))
    return splits


@dataclasses.dataclass(frozen=True)
class RecordChecks:
    """What :func:`verify_shard` checks in each record besides its CRCs and index entry."""

    num_classes: int | None
    label_offset: int
    decode: bool
    max_pixels: int


def check_split_meta(root: str | os.PathLike, split: str, meta: dict, records: int) -> None:
    """The split's shards hold what ``dataset.json`` says: its record and shard counts
    (shards and a ``dataset.json`` of two conversions mixed in one folder disagree).

    Raises:
        DataError: naming both counts and the fix.
    """
    listed = (meta.get("splits") or {}).get(split)
    if listed is None:
        return
    shards = len(list_shards(root, split))
    if (listed.get("records"), listed.get("shards")) != (records, shards):
        raise DataError(
            f"dataset.json says split {split!r} has {listed.get('records')} records in {listed.get('shards')} shards, "
            f"its shards hold {records} in {shards}: the shards are not the ones dataset.json describes; convert again "
            "into an empty --out (or with --force)",
            path=str(Path(root) / META_FILE),
        )


def verify_split(
    root: str | os.PathLike,
    split: str,
    *,
    num_classes: int | None,
    label_offset: int,
    decode: bool = True,
    progress: bool | None = None,
    max_pixels: int = MAX_PIXELS,
    workers: int = 1,
) -> int:
    """Check every record of a split: index against file, both CRCs, Example, label, the
    JPEG header's size against ``max_pixels`` (before decoding), the JPEG; ``workers``
    shards at a time.

    Returns:
        The number of records checked.

    Raises:
        DataError: on the first problem (in shard order, whatever ``workers`` is), naming
            the file, record number and byte offset.
    """
    shards = list_shards(root, split)
    indexes = []
    for path in shards:
        index = read_index(index_path_for(path))
        check_index_layout(
            index,
            path.stat().st_size,
            path=str(path),
            index_path=str(index_path_for(path)),
        )
        indexes.append(index)
    total = sum(len(i) for i in indexes)
    checks = RecordChecks(num_classes, label_offset, decode, max_pixels)
    with tqdm(total=total, unit="rec", desc=f"verify {split}", disable=no_bar(progress)) as bar:
        jobs = [(path, index, checks) for path, index in zip(shards, indexes)]
        return sum(run_jobs(verify_shard, jobs, workers=workers, bar=bar))


def verify_shard(path: Path, index: np.ndarray, checks: RecordChecks, tick: Tick) -> int:
    """Check one shard's records against its index and ``checks``; the records checked.

    Raises:
        DataError: the first problem, naming the file, record number and byte offset.
    """
    in_file = 0
    for record, (offset, size, data) in enumerate(iter_records(path, verify_crc=True)):
        where = f"record {record} at byte offset {offset}"
        if record >= len(index) or tuple(index[record]) != (offset, size):
            raise DataError(
                f"{where}: not in its index file; rebuild with `largebatch data index {path}`",
                path=str(path),
            )
        try:
            jpeg, stored = image_and_label(decode_example(data, (IMAGE, LABEL)))
        except ExampleDecodeError as err:
            raise DataError(f"{where}: not an ImageNet-schema Example ({err})", path=str(path)) from err
        if checks.num_classes is not None:
            class_number(stored, num_classes=checks.num_classes, label_offset=checks.label_offset, where=where, path=str(path), keys="")
        try:
            checked_size(jpeg, checks.max_pixels, lambda: where)  # noqa: B023 - called at once
            if checks.decode:
                simplejpeg.decode_jpeg(jpeg, colorspace="GRAY")
        except DataError as err:
            raise DataError(err.message, path=str(path)) from err
        except ValueError as err:
            raise DataError(f"{where}: {undecodable(jpeg, err)}", path=str(path)) from err
        tick(1)
        in_file = record + 1
    if in_file != len(index):
        raise DataError(
            f"index lists {len(index)} records, the file holds {in_file}; rebuild with `largebatch data index {path}`",
            path=str(index_path_for(path)),
        )
    return in_file
