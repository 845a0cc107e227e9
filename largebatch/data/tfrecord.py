"""TFRecord files, their index files, and the shards of a split.

A TFRecord file is a sequence of records, each::

    uint64  length              little-endian
    uint32  masked_crc32c(length bytes)
    byte    data[length]
    uint32  masked_crc32c(data)

where ``masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8`` (mod 2**32) over the
CRC-32C (Castagnoli) of ``x`` (TensorFlow's ``core/lib/hash/crc32c.h``).

An index file holds one ``"<offset> <size>\\n"`` line per record, ``size`` counting the
whole record (16 header and footer bytes included): exactly what DALI's
``tfrecord2idx`` writes, so ``fn.readers.tfrecord`` reads the same files.

Shards of a split are named as in the ImageNet TFRecord convention,
``<split>-00000-of-00008``; each has its index beside it, ``<split>-00000-of-00008.idx``.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
from pathlib import Path

import crc32c
import numpy as np

from largebatch.errors import DataError

_MASK_DELTA = 0xA282EAD8
HEADER_BYTES = 12  # length + its CRC
FOOTER_BYTES = 4  # data CRC
INDEX_SUFFIX = ".idx"
SHARD_NAME_PATTERN = re.compile(r"^(?P<split>.+)-(?P<num>\d{5})-of-(?P<total>\d{5})$")


def masked_crc(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC-32C of ``data``."""
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def shard_name(split: str, number: int, total: int) -> str:
    """``train-00003-of-00008``: the ImageNet TFRecord shard naming."""
    return f"{split}-{number:05d}-of-{total:05d}"


def index_path_for(path: str | os.PathLike) -> Path:
    """Where a shard's index file lives: beside it, with ``.idx`` appended."""
    return Path(f"{os.fspath(path)}{INDEX_SUFFIX}")


def check_header(path, header: bytes, offset: int, record: int, verify_crc: bool) -> int:
    length, length_crc = struct.unpack("<QI", header)
    if verify_crc and masked_crc(header[:8]) != length_crc:
        raise DataError(
            f"record {record} at byte offset {offset}: length CRC mismatch (corrupt or not a TFRecord file)",
            path=str(path),
        )
    return length


def read_record_at(
    fd: int,
    offset: int,
    size: int,
    *,
    verify_crc: bool = True,
    path: str = "",
    record: int = -1,
) -> bytes:
    """Read the record an index entry points at, with ``os.pread`` on an open descriptor.

    Raises:
        DataError: when the bytes there are not the record the index promises.
    """
    buf = os.pread(fd, size, offset)
    where = f"record {record} at byte offset {offset}"
    if len(buf) < size:
        raise DataError(
            f"{where}: index says {size} bytes but the file ends after {len(buf)} "
            f"(truncated file, or an index that does not match it; rebuild with `largebatch data index {path}`)",
            path=path,
        )
    length = check_header(path, buf[:HEADER_BYTES], offset, record, verify_crc)
    if HEADER_BYTES + length + FOOTER_BYTES != size:
        raise DataError(
            f"{where}: index says {size} bytes, the record header says "
            f"{HEADER_BYTES + length + FOOTER_BYTES} (index does not match its file; "
            f"rebuild with `largebatch data index {path}`)",
            path=path,
        )
    data = buf[HEADER_BYTES : HEADER_BYTES + length]
    if verify_crc and masked_crc(data) != struct.unpack("<I", buf[-FOOTER_BYTES:])[0]:
        raise DataError(f"{where}: data CRC mismatch (corrupt record)", path=path)
    return data


INDEX_LINE_BYTES = 2 * len(str(2**63 - 1)) + 2  # "<offset> <size>\n" with both at their largest


def index_size_limit(shard_size: int) -> int:
    """The most bytes an index of a shard of ``shard_size`` bytes can need: one
    ``"<offset> <size>\\n"`` line (two 19-digit numbers at most) per record of at least
    ``HEADER_BYTES + FOOTER_BYTES`` bytes."""
    return INDEX_LINE_BYTES * (shard_size // (HEADER_BYTES + FOOTER_BYTES) + 1)


def read_index(path: str | os.PathLike) -> np.ndarray:
    """Read an index file; one larger than its shard (beside it) could need is refused
    before it is read.

    Returns:
        ``int64`` array of shape ``(records, 2)``: offset and size per record.

    Raises:
        DataError: when the file is missing, too large for its shard, or a line is not
            two decimal integers below 2^63.
    """
    path = Path(path)
    shard = os.fspath(path).removesuffix(INDEX_SUFFIX)
    fix = f"rebuild it with `largebatch data index {shard}`"
    if not path.is_file():
        raise DataError(f"index file missing; create it with `largebatch data index {shard}`", path=str(path))
    limit = index_size_limit(os.stat(shard).st_size) if os.path.isfile(shard) else None
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        raw = handle.read(-1 if limit is None else min(size, limit) + 1)  # never more than the shard could need
    if limit is not None and max(size, len(raw)) > limit:
        raise DataError(
            f"{max(size, len(raw))} bytes, more than an index of its {os.stat(shard).st_size}-byte shard can need ({limit}): "
            f"not the index of {shard}; {fix}",
            path=str(path),
        )
    text = raw.decode("utf-8", errors="replace")
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if len(parts) != 2 or not all(p.isascii() and p.isdigit() and len(p) <= 19 and int(p) < 2**63 for p in parts):
            raise DataError(f"line {number}: expected '<offset> <size>' (two whole numbers), got {line!r:.60}; {fix}", path=str(path))
        rows.append((int(parts[0]), int(parts[1])))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 2)


def check_index_layout(index: np.ndarray, file_size: int, *, path: str, index_path: str) -> None:
    """Cheap consistency check: records are back to back and end where the file ends.

    Raises:
        DataError: naming the first index entry that does not fit.
    """
    expected = 0
    for record, (offset, size) in enumerate(index.tolist()):
        if offset != expected or size < HEADER_BYTES + FOOTER_BYTES:
            raise DataError(
                f"entry {record} says offset {offset} size {size}, expected a record at byte offset "
                f"{expected}: index does not match {path}; rebuild with `largebatch data index {path}`",
                path=index_path,
            )
        expected = offset + size
    if expected != file_size:
        raise DataError(
            f"index covers {expected} bytes in {len(index)} records but {path} has {file_size} bytes: "
            f"index does not match its file (truncated or rewritten shard?); "
            f"rebuild with `largebatch data index {path}`",
            path=index_path,
        )


def list_shards(root: str | os.PathLike, split: str) -> list[Path]:
    """The shard files of ``split`` under ``root``, in order.

    Raises:
        DataError: when ``root`` is missing or holds no shard of ``split``.
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError(
            "data folder not found; convert a dataset with 'largebatch data convert' or set data.root",
            path=str(root),
        )
    shards = sorted(p for p in root.iterdir() if (m := SHARD_NAME_PATTERN.match(p.name)) and m.group("split") == split and p.is_file())
    if not shards:
        raise DataError(
            f"no shards of split {split!r} (expected files named {shard_name(split, 0, 8)} ...); check data.root and the split name",
            path=str(root),
        )
    totals = {int(SHARD_NAME_PATTERN.match(p.name).group("total")) for p in shards}
    if len(totals) != 1 or len(shards) != totals.pop():
        raise DataError(
            f"split {split!r} has {len(shards)} shard files that do not form one complete set "
            f"(first {shards[0].name}, last {shards[-1].name}); finish the conversion or remove stale shards",
            path=str(root),
        )
    return shards


def count_records(root: str | os.PathLike, split: str) -> int:
    """Records in a split, counted from its index files (no shard is read)."""
    return sum(len(read_index(index_path_for(p))) for p in list_shards(root, split))


class ShardSet:
    """Random access to the records of one split by global record number.

    Global record numbers run through the shards in name order, each shard's records in
    file order; this is the numbering ``largebatch.data.sharding`` hands out.

    Args:
        root: the folder holding the shards and their index files.
        split: ``'train'``, ``'validation'``, ...
        verify_crc: check CRCs on every read.

    Raises:
        DataError: missing shards, missing index files, or an index that does not match
            its file's layout (checked up front from file sizes).
    """

    def __init__(self, root: str | os.PathLike, split: str, verify_crc: bool = True) -> None:
        self.root = Path(root)
        self.split = split
        self.verify_crc = verify_crc
        self.paths = list_shards(root, split)
        self.indices = []
        for path in self.paths:
            index_path = index_path_for(path)
            index = read_index(index_path)
            check_index_layout(index, path.stat().st_size, path=str(path), index_path=str(index_path))
            self.indices.append(index)
        counts = np.array([len(i) for i in self.indices], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)])
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard number, record number within that shard)`` of a global record number."""
        if not 0 <= index < len(self):
            raise IndexError(f"record {index} outside 0..{len(self) - 1}")
        shard = int(np.searchsorted(self.starts, index, side="right")) - 1
        return shard, index - int(self.starts[shard])

    def _fd(self, shard: int) -> int:
        if os.getpid() != self._pid:  # descriptors do not survive into forked workers cleanly
            self._fds, self._pid = {}, os.getpid()
        fd = self._fds.get(shard)
        if fd is None:
            try:
                fd = os.open(self.paths[shard], os.O_RDONLY)
            except OSError as err:
                raise DataError(f"cannot open shard: {err.strerror}", path=str(self.paths[shard])) from err
            self._fds[shard] = fd
        return fd

    def read(self, index: int) -> bytes:
        """The payload of global record ``index``, CRC-checked unless disabled."""
        shard, record = self.locate(index)
        offset, size = self.indices[shard][record]
        return read_record_at(
            self._fd(shard),
            int(offset),
            int(size),
            verify_crc=self.verify_crc,
            path=str(self.paths[shard]),
            record=record,
        )

    def where(self, index: int) -> str:
        """``'<shard path> record <n> at byte offset <o>'`` for error messages."""
        shard, record = self.locate(index)
        return f"{self.paths[shard]} record {record} at byte offset {int(self.indices[shard][record][0])}"

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_fds"] = {}
        return state

    def __del__(self) -> None:
        if os.getpid() == getattr(self, "_pid", None) and getattr(self, "_fds", None):
            with contextlib.suppress(OSError):
                self.close()
