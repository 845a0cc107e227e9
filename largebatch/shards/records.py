"""Writing TFRecord files, their index files and ``tf.train.Example`` records, and walking a
file front to back: what ``largebatch data convert``, ``index`` and ``verify`` need and
no loader does.

The formats are described where they are read (``largebatch.data.tfrecord``: records and
index files; ``largebatch.data.example``: the Example messages); the encoder writes packed
repeated scalars, as TensorFlow does.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Self

import numpy as np

from largebatch.data.tfrecord import FOOTER_BYTES, HEADER_BYTES, check_header, masked_crc
from largebatch.errors import DataError

FeatureValue = bytes | str | int | float | Iterable
_LEN = 2  # protobuf's length-delimited wire type


def encode_record(data: bytes) -> bytes:
    """One framed TFRecord record holding ``data``."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))


class TFRecordWriter:
    """Append records to a TFRecord file and remember each one's index entry.

    Args:
        path: the file to write (created or truncated).

    Example::

        with TFRecordWriter(tmp) as writer:
            writer.write(payload)
        write_index(index_path_for(tmp), writer.index)
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._file = open(self.path, "wb")  # noqa: SIM115 (closed in close())
        self._offset = 0
        self.index: list[tuple[int, int]] = []

    def write(self, data: bytes) -> None:
        """Append one record."""
        record = encode_record(data)
        self._file.write(record)
        self.index.append((self._offset, len(record)))
        self._offset += len(record)

    def close(self, fsync: bool = False) -> None:
        """Flush and close; with ``fsync`` the bytes are on disk when this returns."""
        if self._file.closed:
            return
        self._file.flush()
        if fsync:
            os.fsync(self._file.fileno())
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def iter_records(path: str | os.PathLike, verify_crc: bool = True) -> Iterator[tuple[int, int, bytes]]:
    """Read a TFRecord file front to back.

    Args:
        path: the file.
        verify_crc: check both CRCs of every record.

    Yields:
        ``(offset, size, data)`` per record; ``offset`` and ``size`` are its index entry.

    Raises:
        DataError: on a truncated record or a CRC mismatch, naming the file, the record
            number and its byte offset.
    """
    offset = 0
    with open(path, "rb") as fh:
        file_size = os.fstat(fh.fileno()).st_size
        record = 0
        while True:
            header = fh.read(HEADER_BYTES)
            if not header:
                return
            if len(header) < HEADER_BYTES:
                raise DataError(
                    f"record {record} at byte offset {offset}: truncated header "
                    f"({len(header)} of {HEADER_BYTES} bytes; the file was cut short)",
                    path=str(path),
                )
            length = check_header(path, header, offset, record, verify_crc)
            left = file_size - offset - HEADER_BYTES
            if length + FOOTER_BYTES > left:  # checked before reading: a corrupt length may claim exabytes
                raise DataError(
                    f"record {record} at byte offset {offset}: truncated data "
                    f"(its header claims {length + FOOTER_BYTES} bytes, the file holds {max(left, 0)} more; "
                    "the file was cut short or the header is corrupt); restore the file or convert its source again",
                    path=str(path),
                )
            body = fh.read(length + FOOTER_BYTES)
            data = body[:length]
            if verify_crc and masked_crc(data) != struct.unpack("<I", body[length:])[0]:
                raise DataError(
                    f"record {record} at byte offset {offset}: data CRC mismatch (corrupt record)",
                    path=str(path),
                )
            size = HEADER_BYTES + length + FOOTER_BYTES
            yield offset, size, data
            offset += size
            record += 1


def scan_index(path: str | os.PathLike, verify_crc: bool = False) -> np.ndarray:
    """Index entries of a TFRecord file, found by walking its records.

    Returns:
        ``int64`` array of shape ``(records, 2)``: offset and size per record.
    """
    entries = [(offset, size) for offset, size, _ in iter_records(path, verify_crc)]
    return np.asarray(entries, dtype=np.int64).reshape(-1, 2)


def write_index(path: str | os.PathLike, entries) -> None:
    """Write an index file in ``tfrecord2idx``'s format, atomically (temp file, rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.writelines(f"{int(offset)} {int(size)}\n" for offset, size in entries)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 is sent as its 64-bit two's complement
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    key = _varint((number << 3) | wire_type)
    if wire_type == _LEN:
        return key + _varint(len(payload)) + payload
    return key + payload


def _feature(value: FeatureValue) -> bytes:
    """Encode one ``Feature`` from a Python value (bytes/str, int or float, or a list of one kind)."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values:
        return _field(1, _LEN, b"")  # an empty bytes_list
    if all(isinstance(v, (bytes, bytearray, memoryview, str)) for v in values):
        items = b"".join(_field(1, _LEN, v.encode() if isinstance(v, str) else bytes(v)) for v in values)
        return _field(1, _LEN, items)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        packed = b"".join(_varint(int(v)) for v in values)
        return _field(3, _LEN, _field(1, _LEN, packed))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        packed = struct.pack(f"<{len(values)}f", *values)
        return _field(2, _LEN, _field(1, _LEN, packed))
    raise TypeError(f"feature values must be all bytes/str, all int or all float, got {values!r:.80}")


def encode_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Serialise a ``tf.train.Example``.

    Args:
        features: feature name to value; ``bytes``/``str`` become a ``bytes_list``,
            ``int`` an ``int64_list``, ``float`` a ``float_list``; a list or tuple gives
            several values of one kind.

    Returns:
        The serialised message (keys in sorted order, so the output is deterministic).
    """
    entries = b"".join(
        _field(
            1,
            _LEN,
            _field(1, _LEN, name.encode()) + _field(2, _LEN, _feature(features[name])),
        )
        for name in sorted(features)
    )
    return _field(1, _LEN, entries)
