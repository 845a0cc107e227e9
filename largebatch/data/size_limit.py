"""What is checked before an image is decoded: that it is a JPEG, and its size (``data.max_pixels``).

A JPEG's header states its size, and a decoder allocates what the header asks for: a
record claiming tens of thousands of pixels a side asks for gigabytes, and the run would
end in an out-of-memory kill instead of an error naming the record. So every loader reads
the header first (the native loader and the media pipeline's reader here, DALI with
``fn.peek_image_shape``), as do ``largebatch data convert`` and ``verify``, and refuses an
image above the limit as a ``DataError`` naming the shard, record and byte offset (the
source file, for the converter). Before that, an ``image/encoded`` that is not a JPEG at all
(a PNG, which DALI would decode and the native loader cannot) is named as such
(``not_a_jpeg``, ``undecodable``), whichever loader meets it.
"""

from __future__ import annotations

from collections.abc import Callable

import simplejpeg

from largebatch.errors import DataError

JPEG_MAGIC = b"\xff\xd8"  # a JPEG's first bytes (its SOI marker)
_OTHER_FORMATS = (
    (b"\x89PNG", "a PNG"),
    (b"GIF8", "a GIF"),
    (b"BM", "a BMP"),
    (b"II*\x00", "a TIFF"),
    (b"MM\x00*", "a TIFF"),
    (b"RIFF", "a WebP"),
)


def not_a_jpeg(head: bytes) -> str:
    """Why an ``image/encoded`` starting with ``head`` (its first bytes) is refused: every
    loader reads JPEGs only (DALI would decode a PNG that the native loader cannot)."""
    kind = next((name for magic, name in _OTHER_FORMATS if head.startswith(magic)), "not an image format the loaders read")
    return (
        f"image/encoded is not a JPEG (it starts with {head[:4].hex()}, {kind}); the loaders read JPEGs only: convert the "
        "images with `largebatch data convert`, which re-encodes other formats as JPEG"
    )


def undecodable(jpeg: bytes, err: Exception) -> str:
    """Why an ``image/encoded`` failed to decode: not a JPEG at all, or a broken one."""
    return f"JPEG does not decode ({err})" if jpeg.startswith(JPEG_MAGIC) else not_a_jpeg(jpeg[:8])


def too_large(height: int, width: int, max_pixels: int, setting: str = "data.max_pixels") -> str:
    """Why an image above the size limit ``setting`` is refused, and the fix."""
    return (
        f"the image header says {width}x{height} pixels ({height * width / 1e6:.1f} megapixels), more than {setting} "
        f"{max_pixels} ({max_pixels / 1e6:g} megapixels); decoding it would take {3 * height * width / 2**30:.1f} GiB. "
        f"Shrink or drop the image, or raise {setting}"
    )


def checked_size(jpeg: bytes, max_pixels: int, where: Callable[[], str]) -> tuple[int, int]:
    """``(height, width)`` from the JPEG's header, nothing decoded.

    Args:
        where: gives the record's place for the message (the shard, record and byte
            offset), called only when there is one.

    Raises:
        ValueError: the header does not parse.
        DataError: the image has more than ``max_pixels`` pixels.
    """
    height, width = simplejpeg.decode_jpeg_header(jpeg)[:2]
    if height * width > max_pixels:
        raise DataError(f"{where()}: {too_large(height, width, max_pixels)}")
    return height, width
