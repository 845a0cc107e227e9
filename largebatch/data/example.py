"""``tf.train.Example`` protobuf decoding, without TensorFlow or protobuf.

The messages (from TensorFlow's ``example.proto`` / ``feature.proto``)::

    message Example   { Features features = 1; }
    message Features  { map<string, Feature> feature = 1; }   // entries: key = 1, value = 2
    message Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                     Int64List int64_list = 3; } }
    message BytesList { repeated bytes value = 1; }
    message FloatList { repeated float value = 1 [packed = true]; }
    message Int64List { repeated int64 value = 1 [packed = true]; }

Only these messages are handled; they are all the ImageNet TFRecord schema needs. The
decoder accepts packed and unpacked repeated scalars, as the protobuf wire format
requires (the encoder, for the shard tools, is ``largebatch.shards.records``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

from largebatch.errors import DataError

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5


class ExampleDecodeError(ValueError):
    """The bytes are not a well-formed ``tf.train.Example``."""


def _read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
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


def _field_at(buf: bytes, pos: int, end: int) -> tuple[int, int, int, int]:
    """The field that starts at ``pos``: ``(number, wire_type, value, next_pos)``.

    ``value`` is the integer of a varint field and the payload's first byte for the
    others (their payload ends at ``next_pos``). One-byte keys and lengths, nearly all
    of them in an Example, take the short path.
    """
    key = buf[pos]
    if key < 0x80:
        pos += 1
    else:
        key, pos = _read_varint(buf, pos, end)
    wire_type = key & 7
    if wire_type == _LEN:
        if pos >= end:
            raise ExampleDecodeError("truncated length")
        length = buf[pos]
        if length < 0x80:
            pos += 1
        else:
            length, pos = _read_varint(buf, pos, end)
        stop = pos + length
        if stop > end:
            raise ExampleDecodeError(f"field {key >> 3} claims {length} bytes, only {end - pos} left")
        return key >> 3, wire_type, pos, stop
    if wire_type == _VARINT:
        value, pos = _read_varint(buf, pos, end)
        return key >> 3, wire_type, value, pos
    width = 8 if wire_type == _FIXED64 else 4 if wire_type == _FIXED32 else 0
    if not width:
        raise ExampleDecodeError(f"unsupported wire type {wire_type} for field {key >> 3}")
    if pos + width > end:
        raise ExampleDecodeError(f"truncated fixed{8 * width}")
    return key >> 3, wire_type, pos, pos + width


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _decode_feature(buf: bytes, pos: int, end: int) -> list:
    values: list = []
    while pos < end:
        kind, wire_type, start, pos = _field_at(buf, pos, end)
        if wire_type != _LEN:
            raise ExampleDecodeError(f"Feature field {kind} has wire type {wire_type}")
        at = start
        while at < pos:
            number, item_type, item, at = _field_at(buf, at, pos)
            if number != 1:
                continue
            if kind == 1:  # bytes_list
                if item_type != _LEN:
                    raise ExampleDecodeError(f"bytes_list value has wire type {item_type}")
                values.append(buf[item:at])
            elif kind == 3:  # int64_list, packed or not
                if item_type == _LEN:
                    while item < at:
                        value, item = _read_varint(buf, item, at)
                        values.append(_signed64(value))
                elif item_type == _VARINT:
                    values.append(_signed64(item))
                else:
                    raise ExampleDecodeError(f"int64_list value has wire type {item_type}")
            elif kind == 2:  # float_list, packed or not
                if item_type not in (_LEN, _FIXED32) or (at - item) % 4:
                    raise ExampleDecodeError("float_list payload is not a whole number of floats")
                values.extend(struct.unpack(f"<{(at - item) // 4}f", buf[item:at]))
    return values


def decode_example(data: bytes | memoryview, keys: Iterable[str] | None = None) -> dict[str, list]:
    """Parse a serialised ``tf.train.Example``.

    Args:
        data: the serialised message (a TFRecord's payload).
        keys: only decode these features (all when ``None``); the others are skipped
            without decoding their values.

    Returns:
        Feature name to its list of values (``bytes``, ``int`` or ``float``). A name
        that occurs twice keeps its last value, as protobuf's map fields do.

    Raises:
        ExampleDecodeError: when the bytes are not a well-formed Example.
    """
    buf = data if isinstance(data, bytes) else bytes(data)
    wanted = None if keys is None else {key.encode() for key in keys}
    out: dict[str, list] = {}
    pos, end = 0, len(buf)
    while pos < end:
        number, wire_type, start, pos = _field_at(buf, pos, end)
        if number != 1 or wire_type != _LEN:
            continue
        while start < pos:  # Features: map entries
            entry, entry_type, at, start = _field_at(buf, start, pos)
            if entry != 1 or entry_type != _LEN:
                continue
            name = value = None
            while at < start:  # one entry: key = 1, value = 2
                part, part_type, part_start, at = _field_at(buf, at, start)
                if part_type != _LEN:
                    continue
                if part == 1:
                    name = buf[part_start:at]
                elif part == 2:
                    value = (part_start, at)
            if name is None or (wanted is not None and name not in wanted):
                continue
            try:
                text = name.decode()
            except UnicodeDecodeError as err:
                raise ExampleDecodeError(f"feature name is not UTF-8 ({err})") from err
            out[text] = _decode_feature(buf, *value) if value else []
    return out


IMAGE, LABEL = "image/encoded", "image/class/label"


def _holds(values: list) -> str:
    if not values:
        return "holds no value"
    kinds = "/".join(sorted({"bytes" if isinstance(v, bytes) else "int64" if isinstance(v, int) else "float" for v in values}))
    return f"holds {len(values)} {kinds} value{'s' if len(values) > 1 else ''}" + (f" ({values[0]!r:.40})" if len(values) == 1 else "")


def image_and_label(features: Mapping[str, list]) -> tuple[bytes, int]:
    """The encoded image and the stored class number of a decoded ImageNet-schema Example
    (``decode_example(data, (IMAGE, LABEL))``).

    Raises:
        ExampleDecodeError: either feature is missing, holds other than one value, or
            holds another kind: a float label (1.5 is no class), a bytes label, an int64
            image.
    """
    image, label = features.get(IMAGE, []), features.get(LABEL, [])
    if len(image) != 1 or not isinstance(image[0], bytes):
        raise ExampleDecodeError(
            f"{IMAGE} {_holds(image)}, expected one bytes value (the JPEG); "
            "write the records with `largebatch data convert` (the ImageNet schema)"
        )
    if len(label) != 1 or not isinstance(label[0], int):
        raise ExampleDecodeError(
            f"{LABEL} {_holds(label)}, expected one int64 class number; "
            "write the records with `largebatch data convert` (labels as int64_list)"
        )
    return image[0], label[0]


def class_number(stored: int, *, num_classes: int, label_offset: int, where: str, path: str | None = None, keys: str = "data.") -> int:
    """The 0-based class of a record whose stored label is ``stored`` (``stored - label_offset``).

    Raises:
        DataError: the class is outside ``0 .. num_classes - 1``, naming the record
            (``where``, and ``path`` when given), the label, the range and both settings
            (as config keys, ``data.num_classes``; ``keys=""`` for the bare names
            ``data verify`` reads from ``dataset.json``).
    """
    label = stored - label_offset
    if not 0 <= label < num_classes:
        raise DataError(
            f"{where}: label {stored} is outside {label_offset}..{label_offset + num_classes - 1} "
            f"({keys}num_classes {num_classes}, {keys}label_offset {label_offset})",
            path=path,
        )
    return label
