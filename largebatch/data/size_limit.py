"""The largest image a loader or the converter decodes: ``data.max_pixels``.

A JPEG's header states its size, and a decoder allocates what the header asks for: a
record claiming tens of thousands of pixels a side asks for gigabytes, and the run would
end in an out-of-memory kill instead of an error naming the record. So every loader reads
the header first (the native loader and the media pipeline's reader here, DALI with
``fn.peek_image_shape``), as do ``largebatch data convert`` and ``verify``, and refuses an
image above the limit as a ``DataError`` naming the shard, record and byte offset (the
source file, for the converter).
"""

from __future__ import annotations

from collections.abc import Callable

import simplejpeg

from largebatch.errors import DataError


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
