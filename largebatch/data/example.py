"""``tf.train.Example`` protobuf encoding and decoding, without TensorFlow or protobuf.

The messages (from TensorFlow's ``example.proto`` / ``feature.proto``)::

    message Example   { Features features = 1; }
    message Features  { map<string, Feature> feature = 1; }   // entries: key = 1, value = 2
    message Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                     Int64List int64_list = 3; } }
    message BytesList { repeated bytes value = 1; }
    message FloatList { repeated float value = 1 [packed = true]; }
    message Int64List { repeated int64 value = 1 [packed = true]; }

Only these messages are handled; they are all the ImageNet TFRecord schema needs. The
encoder writes packed repeated scalars (what TensorFlow writes); the decoder accepts
packed and unpacked ones, as the protobuf wire format requires.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

FeatureValue = bytes | str | int | float | Iterable

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5


class ExampleDecodeError(ValueError):
    """The bytes are not a well-formed ``tf.train.Example``."""


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
        items = b"".join(
            _field(1, _LEN, v.encode() if isinstance(v, str) else bytes(v))
            for v in values
        )
        return _field(1, _LEN, items)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        packed = b"".join(_varint(int(v)) for v in values)
        return _field(3, _LEN, _field(1, _LEN, packed))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        packed = struct.pack(f"<{len(values)}f", *values)
        return _field(2, _LEN, _field(1, _LEN, packed))
    raise TypeError(
        f"feature values must be all bytes/str, all int or all float, got {values!r:.80}"
    )


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


def _read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise ExampleDecodeError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ExampleDecodeError("varint longer than 10 bytes")


def _fields(buf: memoryview, pos: int, end: int):
    """Yield ``(field_number, wire_type, value)``; value is an int or a (start, stop) span."""
    while pos < end:
        key, pos = _read_varint(buf, pos, end)
        number, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            value, pos = _read_varint(buf, pos, end)
            yield number, wire_type, value
        elif wire_type == _LEN:
            length, pos = _read_varint(buf, pos, end)
            if pos + length > end:
                raise ExampleDecodeError(
                    f"field {number} claims {length} bytes, only {end - pos} left"
                )
            yield number, wire_type, (pos, pos + length)
            pos += length
        elif wire_type == _FIXED64:
            if pos + 8 > end:
                raise ExampleDecodeError("truncated fixed64")
            yield number, wire_type, (pos, pos + 8)
            pos += 8
        elif wire_type == _FIXED32:
            if pos + 4 > end:
                raise ExampleDecodeError("truncated fixed32")
            yield number, wire_type, (pos, pos + 4)
            pos += 4
        else:
            raise ExampleDecodeError(
                f"unsupported wire type {wire_type} for field {number}"
            )


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _decode_feature(buf: memoryview, start: int, end: int) -> list:
    values: list = []
    for kind, wire_type, span in _fields(buf, start, end):
        if wire_type != _LEN:
            raise ExampleDecodeError(f"Feature field {kind} has wire type {wire_type}")
        lo, hi = span
        for number, item_type, item in _fields(buf, lo, hi):
            if number != 1:
                continue
            if kind == 1:  # bytes_list
                values.append(bytes(buf[item[0] : item[1]]))
            elif kind == 3:  # int64_list, packed or not
                if item_type == _LEN:
                    pos, stop = item
                    while pos < stop:
                        value, pos = _read_varint(buf, pos, stop)
                        values.append(_signed64(value))
                else:
                    values.append(_signed64(item))
            elif kind == 2:  # float_list, packed or not
                chunk = bytes(buf[item[0] : item[1]])
                if len(chunk) % 4:
                    raise ExampleDecodeError(
                        "float_list payload is not a whole number of floats"
                    )
                values.extend(struct.unpack(f"<{len(chunk) // 4}f", chunk))
    return values


def decode_example(
    data: bytes | memoryview, keys: Iterable[str] | None = None
) -> dict[str, list]:
    """Parse a serialised ``tf.train.Example``.

    Args:
        data: the serialised message (a TFRecord's payload).
        keys: only decode these features (all when ``None``).

    Returns:
        Feature name to its list of values (``bytes``, ``int`` or ``float``).

    Raises:
        ExampleDecodeError: when the bytes are not a well-formed Example.
    """
    buf = memoryview(data)
    wanted = set(keys) if keys is not None else None
    out: dict[str, list] = {}
    for number, wire_type, span in _fields(buf, 0, len(buf)):
        if number != 1 or wire_type != _LEN:
            continue
        for entry_number, entry_type, entry_span in _fields(buf, *span):
            if entry_number != 1 or entry_type != _LEN:
                continue
            name, value_span = None, None
            for part, part_type, part_span in _fields(buf, *entry_span):
                if part == 1 and part_type == _LEN:
                    name = bytes(buf[part_span[0] : part_span[1]]).decode()
                elif part == 2 and part_type == _LEN:
                    value_span = part_span
            if name is None or (wanted is not None and name not in wanted):
                continue
            out[name] = _decode_feature(buf, *value_span) if value_span else []
    return out
