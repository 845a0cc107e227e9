"""JPEG decode fused with crop and resize, for the native loader.

Training: Inception-style random-resized-crop (Szegedy et al., 2015, "Going deeper with
convolutions"), with torchvision's ``RandomResizedCrop.get_params`` sampling rule (area
fraction uniform in ``scale``, log-aspect uniform in ``log(ratio)``, ten tries, then a
centre crop clamped to ``ratio``), then a horizontal flip. Evaluation: resize the shorter
side to ``image_size / eval_crop_ratio`` and take the centre ``image_size`` square.

The crop box is chosen from the JPEG header alone; the JPEG is then decoded at the
smallest DCT scale (1/8 .. 1) that still leaves the crop at least ``image_size`` pixels
on each side, and the box is resized with Pillow's antialiasing bilinear filter in one
call. Decoding a 500x375 image for a crop of a quarter of its area is then 2-4x cheaper
than a full decode, and the output differs from a full-size decode only by what the
antialiasing filter removes anyway.
"""

from __future__ import annotations

import math

import numpy as np
import simplejpeg
from PIL import Image

Box = tuple[float, float, float, float]  # left, top, width, height in source pixels


def random_resized_crop_box(
    height: int,
    width: int,
    rng: np.random.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> Box:
    """A random crop box, sampled as torchvision's ``RandomResizedCrop.get_params``."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        crop_w = round(math.sqrt(target_area * aspect))
        crop_h = round(math.sqrt(target_area / aspect))
        if 0 < crop_w <= width and 0 < crop_h <= height:
            top = int(rng.integers(0, height - crop_h + 1))
            left = int(rng.integers(0, width - crop_w + 1))
            return left, top, crop_w, crop_h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        crop_w, crop_h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        crop_h, crop_w = height, round(height * ratio[1])
    else:
        crop_w, crop_h = width, height
    return (width - crop_w) // 2, (height - crop_h) // 2, crop_w, crop_h


def center_crop_box(height: int, width: int, image_size: int, crop_ratio: float) -> Box:
    """The source box that "resize shorter side to size/crop_ratio, centre crop size" keeps."""
    resized_short = image_size / crop_ratio
    side = (
        image_size * min(height, width) / resized_short
    )  # the crop's side in source pixels
    side_h, side_w = min(side, height), min(side, width)
    return (width - side_w) / 2, (height - side_h) / 2, side_w, side_h


def decode_crop_resize(
    jpeg: bytes,
    box: Box,
    image_size: int,
    channels: int,
    header: tuple[int, int] | None = None,
) -> np.ndarray:
    """Decode ``jpeg`` at the smallest sufficient DCT scale, crop ``box`` and resize it.

    Args:
        jpeg: the JPEG bytes.
        box: ``(left, top, width, height)`` in full-resolution pixels.
        image_size: output side.
        channels: 3 (RGB) or 1 (gray).
        header: ``(height, width)`` if already read from the header.

    Returns:
        ``uint8`` array ``(image_size, image_size, channels)``.

    Raises:
        ValueError: when the JPEG does not decode.
    """
    if header is None:
        height, width = simplejpeg.decode_jpeg_header(jpeg)[:2]
    else:
        height, width = header
    left, top, crop_w, crop_h = box
    # The decoded image must keep the crop at least image_size on each side.
    min_h = math.ceil(image_size * height / crop_h)
    min_w = math.ceil(image_size * width / crop_w)
    colorspace = "GRAY" if channels == 1 else "RGB"
    pixels = simplejpeg.decode_jpeg(
        jpeg,
        colorspace=colorspace,
        min_height=min(min_h, height),
        min_width=min(min_w, width),
    )
    sy, sx = pixels.shape[0] / height, pixels.shape[1] / width
    image = Image.fromarray(pixels[:, :, 0] if channels == 1 else pixels)
    resized = image.resize(
        (image_size, image_size),
        Image.BILINEAR,
        box=(left * sx, top * sy, (left + crop_w) * sx, (top + crop_h) * sy),
    )
    out = np.asarray(resized)
    return out[:, :, None] if channels == 1 else out
