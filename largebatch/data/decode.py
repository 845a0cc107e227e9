"""JPEG decode fused with crop and resize, for the native loader.

Training: Inception-style random-resized-crop (Szegedy et al., 2015, "Going deeper with
convolutions"), with torchvision's ``RandomResizedCrop.get_params`` sampling rule (area
fraction uniform in ``scale``, log-aspect uniform in ``log(ratio)``, ten tries, then a
centre crop clamped to ``ratio``), then a horizontal flip. Evaluation: resize the shorter
side to ``image_size / eval_crop_ratio`` and take the centre ``image_size`` square.

The crop box is chosen from the JPEG header alone. The JPEG is then decoded at the
smallest DCT scale among 1, 1/2, 1/4 and 1/8 that still leaves the crop at least
``image_size`` pixels on each side, so a reduced-scale decode never has to be upsampled.
Only these power-of-two scales are used: libjpeg-turbo's other scales (3/4, 7/8, ...)
decode *slower* than a full decode on this data (``bench/results/loaders.md``). The box
is cut from the decoded array without a copy and resized to ``image_size`` with torch's
antialiased filter on uint8, bilinear or bicubic (``data.interpolation``; Pillow's
``resize`` filters within one grey level, 2-3x faster than Pillow here); the flip is
applied after the resize, on the smaller image.

Before anything is decoded, the header's size is checked against ``data.max_pixels``
(``largebatch.data.size_limit``).
"""

from __future__ import annotations

import math

import numpy as np
import simplejpeg
import torch
import torch.nn.functional as F

from largebatch.randomness import CROP_ATTEMPTS

Box = tuple[float, float, float, float]  # left, top, width, height in source pixels

DCT_SCALES = (8, 4, 2, 1)  # decode at 1/k of full size, tried largest k first


def random_resized_crop_box(
    height: int,
    width: int,
    draws: np.ndarray,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> Box:
    """A random crop box, sampled by torchvision's ``RandomResizedCrop.get_params`` rule
    from pre-drawn uniforms, so the box is a function of the sample, not of a stream.

    Args:
        height, width: the image's size.
        draws: at least ``2 * CROP_ATTEMPTS + 2`` uniforms in [0, 1): the area fraction
            and log-aspect of each try, then the top and left position
            (``largebatch.randomness.augmentation_uniforms``).
        scale: range of the crop's area as a fraction of the image's.
        ratio: range of the crop's aspect ratio (width / height).

    Returns:
        ``(left, top, width, height)`` in whole pixels. Sizes round half up and positions
        are ``floor(u * (free + 1))``, the rule the DALI loader's graph computes too.
    """
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for attempt in range(CROP_ATTEMPTS):
        target_area = area * (scale[0] + (scale[1] - scale[0]) * draws[2 * attempt])
        aspect = math.exp(log_lo + (log_hi - log_lo) * draws[2 * attempt + 1])
        crop_w = math.floor(math.sqrt(target_area * aspect) + 0.5)
        crop_h = math.floor(math.sqrt(target_area / aspect) + 0.5)
        if 0 < crop_w <= width and 0 < crop_h <= height:
            top = math.floor(draws[2 * CROP_ATTEMPTS] * (height - crop_h + 1))
            left = math.floor(draws[2 * CROP_ATTEMPTS + 1] * (width - crop_w + 1))
            return left, top, crop_w, crop_h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        crop_w, crop_h = width, math.floor(width / ratio[0] + 0.5)
    elif in_ratio > ratio[1]:
        crop_h, crop_w = height, math.floor(height * ratio[1] + 0.5)
    else:
        crop_w, crop_h = width, height
    return (width - crop_w) // 2, (height - crop_h) // 2, crop_w, crop_h


def center_crop_box(height: int, width: int, image_size: int, crop_ratio: float) -> Box:
    """The source box that "resize shorter side to size/crop_ratio, centre crop size" keeps."""
    resized_short = image_size / crop_ratio
    side = image_size * min(height, width) / resized_short  # in source pixels
    side_h, side_w = min(side, height), min(side, width)
    return (width - side_w) / 2, (height - side_h) / 2, side_w, side_h


def dct_scale(box: Box, image_size: int) -> int:
    """The largest ``k`` in 8, 4, 2, 1 whose 1/k decode keeps ``box`` >= ``image_size``."""
    _, _, crop_w, crop_h = box
    for k in DCT_SCALES:
        if min(crop_w, crop_h) >= k * image_size:
            return k
    return 1


def decode_at_scale(jpeg: bytes, k: int, channels: int, header: tuple[int, int]) -> np.ndarray:
    """Decode at 1/``k`` scale: ``uint8 (ceil(height / k), ceil(width / k), channels)``."""
    height, width = header
    # libjpeg-turbo picks the smallest of its M/8 scales that reaches these sizes: 1/k.
    return simplejpeg.decode_jpeg(
        jpeg,
        colorspace="GRAY" if channels == 1 else "RGB",
        min_height=math.ceil(height / k),
        min_width=math.ceil(width / k),
    )


def decode_crop_resize(
    jpeg: bytes,
    box: Box,
    image_size: int,
    channels: int,
    header: tuple[int, int] | None = None,
    flip: bool = False,
    out: np.ndarray | None = None,
    mode: str = "bilinear",
) -> torch.Tensor | np.ndarray:
    """Decode ``jpeg`` at the smallest sufficient DCT scale, crop ``box``, resize, flip.

    Args:
        jpeg: the JPEG bytes.
        box: ``(left, top, width, height)`` in full-resolution pixels.
        image_size: output side.
        channels: 3 (RGB) or 1 (gray).
        header: ``(height, width)`` if already read from the header.
        flip: mirror the output left-right.
        out: a ``uint8`` array ``(channels, image_size, image_size)`` to write into
            (a loader's batch slot); a crop that needs no resizing then never leaves
            NumPy, which saves most of the per-image overhead on small images.
        mode: the resize filter, ``bilinear`` or ``bicubic`` (antialiased).

    Returns:
        ``out`` when given, else a new contiguous ``uint8`` tensor
        ``(channels, image_size, image_size)``.

    Raises:
        ValueError: when the JPEG does not decode.
    """
    if header is None:
        height, width = simplejpeg.decode_jpeg_header(jpeg)[:2]
    else:
        height, width = header
    pixels = decode_at_scale(jpeg, dct_scale(box, image_size), channels, (height, width))
    return crop_resize(pixels, (height, width), box, image_size, flip, out, mode)


def crop_bounds(decoded: tuple[int, int], header: tuple[int, int], box: Box) -> tuple[int, int, int, int]:
    """``(top, left, bottom, right)``: the whole pixels of an image decoded at size
    ``decoded`` (any DCT scale of the full size ``header``) that ``box`` covers, at least one."""
    (rows, cols), (height, width) = decoded, header
    # The decoded size is ceil(full / k); map the box through the actual ratio.
    sy, sx = rows / height, cols / width
    left, top, crop_w, crop_h = box
    x0 = min(round(left * sx), cols - 1)
    y0 = min(round(top * sy), rows - 1)
    x1 = min(max(round((left + crop_w) * sx), x0 + 1), cols)
    y1 = min(max(round((top + crop_h) * sy), y0 + 1), rows)
    return y0, x0, y1, x1


def crop_resize(
    pixels: np.ndarray,
    header: tuple[int, int],
    box: Box,
    image_size: int,
    flip: bool = False,
    out: np.ndarray | None = None,
    mode: str = "bilinear",
) -> torch.Tensor | np.ndarray:
    """Crop ``box`` from ``pixels``, an image of full size ``header`` decoded at any DCT
    scale, resize to ``image_size``, flip; the rest as ``decode_crop_resize`` (``pixels``
    is only read)."""
    y0, x0, y1, x1 = crop_bounds(pixels.shape[:2], header, box)
    crop = pixels[y0:y1, x0:x1]
    if crop.shape[:2] == (image_size, image_size):
        resized = crop[:, ::-1] if flip else crop
        if out is None:
            return torch.from_numpy(np.ascontiguousarray(resized.transpose(2, 0, 1)))
        out[...] = resized.transpose(2, 0, 1)
        return out
    # An HWC view is channels-last NCHW for torch: its uint8 antialias kernel's fast layout.
    image = F.interpolate(
        torch.from_numpy(crop).permute(2, 0, 1).unsqueeze(0),
        size=(image_size, image_size),
        mode=mode,
        antialias=True,
    )[0]
    if flip:
        image = image.flip(-1)
    if out is None:
        return image.contiguous()
    torch.from_numpy(out).copy_(image)
    return out
