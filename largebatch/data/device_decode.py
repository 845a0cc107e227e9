"""JPEG decoding on the run's device for the native loader (``data.decode``).

With ``data.decode='device'`` the loader's workers do everything but decode: they read and
CRC-check each record, parse its Example, check its label and its header's size against
``data.max_pixels``, and draw its crop box and flip by the randomness rule
(``largebatch.randomness``: the same box and flip the CPU path draws for that sample). A
micro-batch crosses to the training process as an ``EncodedBatch``: the JPEGs end to end,
the crop bounds, flips and labels. There ``decode_batch`` decodes the whole micro-batch
with one ``torchvision.io.decode_jpeg(list, device=...)`` call (batched nvJPEG on CUDA;
libjpeg-turbo on the CPU, which is how the path is tested without a GPU), then crops,
resizes with torch's antialiased filter (``data.interpolation``), rounds to whole grey
levels as the CPU path's uint8 resize does, flips and normalises, on the device.

The CPU path decodes at a reduced DCT scale (1/2, 1/4, 1/8) when the crop allows
(``largebatch.data.decode``); nvJPEG has no such scale, so the device path decodes every
JPEG at full size and resizes from there. The pixels therefore differ a little from the
CPU path's (the reduced-scale IDCT averages differently from a full decode and an
antialiased resize, and nvJPEG's IDCT rounds differently from libjpeg-turbo's): docs/data.md
gives the measured difference. The samples, crops, flips and labels are the same.

``data.decode='auto'`` is ``'device'`` on CUDA when torchvision can decode there (a one-image
probe) and no policy that works on pixels in the workers (``data.auto_augment``,
``data.color_jitter``, ``data.cache_decoded``) is on; otherwise ``'cpu'``.
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import simplejpeg
import torch
import torch.nn.functional as F

from largebatch.config.sections import DataConfig
from largebatch.data.size_limit import undecodable
from largebatch.errors import DataError, UserError

__all__ = ["EncodedBatch", "decode_batch", "decode_on_device"]

_PIXEL_POLICIES = ("auto_augment", "color_jitter", "cache_decoded")


class EncodedBatch(NamedTuple):
    """A micro-batch as the workers hand it over for decoding on the device (NumPy arrays,
    which cross the process boundary as bytes).

    Attributes:
        data: the micro-batch's JPEGs end to end (uint8).
        offsets: image ``j`` is ``data[offsets[j]:offsets[j + 1]]`` (int64, one more than images).
        crops: ``(top, left, bottom, right)`` per image in full-size pixels (int64).
        flips: mirror image ``j`` after the resize (bool).
        labels: 0-based labels (int64).
        seeds: per-sample policy seeds (random erasing), None for evaluation.
        records: each image's record number, to name one that does not decode.
    """

    data: np.ndarray
    offsets: np.ndarray
    crops: np.ndarray
    flips: np.ndarray
    labels: np.ndarray
    seeds: np.ndarray | None
    records: np.ndarray


def _probe_jpeg() -> torch.Tensor:
    pixels = np.zeros((8, 8, 3), dtype=np.uint8)
    return torch.frombuffer(bytearray(simplejpeg.encode_jpeg(pixels)), dtype=torch.uint8)


def _decode_jpegs(jpegs: list[torch.Tensor], channels: int, device: torch.device) -> list[torch.Tensor]:
    from torchvision.io import ImageReadMode, decode_jpeg

    mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
    with warnings.catch_warnings():  # torchvision 0.29 deprecates its decoders in favour of TorchCodec's
        warnings.simplefilter("ignore", DeprecationWarning)
        return decode_jpeg(jpegs, mode=mode, device=device)


def device_decode_error(device: torch.device) -> str:
    """Why torchvision cannot decode JPEGs on ``device`` ('' when it can)."""
    if device.type not in ("cpu", "cuda"):
        return f"torchvision decodes JPEGs on the CPU and on CUDA (nvJPEG), not on {device.type!r}"
    try:
        _decode_jpegs([_probe_jpeg()], 3, device)
    except (RuntimeError, ImportError) as err:
        return f"torchvision cannot decode a JPEG on {device} ({str(err).splitlines()[0]})"
    return ""


def decode_on_device(data_cfg: DataConfig, device: torch.device) -> bool:
    """Whether the native loader decodes on ``device`` (``data.decode``, 'auto' resolved).

    Raises:
        UserError: ``data.decode='device'`` where torchvision cannot decode JPEGs (an HPU,
            a torchvision built without nvJPEG).
    """
    if data_cfg.decode == "cpu":
        return False
    if data_cfg.decode == "auto":
        if device.type != "cuda" or any(getattr(data_cfg, key) for key in _PIXEL_POLICIES):
            return False
        return not device_decode_error(device)
    reason = device_decode_error(device)
    if reason:
        raise UserError(f"is 'device', but {reason}; set data.decode to 'cpu' or 'auto'", key="data.decode")
    return True


def encode_batch(jpegs: list[bytes], crops: np.ndarray, flips: np.ndarray, labels: np.ndarray, seeds, records: np.ndarray) -> EncodedBatch:
    """An ``EncodedBatch`` of ``jpegs`` and their drawn parameters (``EncodedBatch``'s fields)."""
    offsets = np.zeros(len(jpegs) + 1, dtype=np.int64)
    np.cumsum([len(jpeg) for jpeg in jpegs], out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    for jpeg, start, stop in zip(jpegs, offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        data[start:stop] = np.frombuffer(jpeg, dtype=np.uint8)
    return EncodedBatch(data, offsets, crops, flips, labels, seeds, records)


def _torchvision_message(err: Exception) -> str:
    """torchvision's error without the C++ source location it starts with."""
    return re.sub(r"^.*?\.cpp:\d+, ", "", str(err).splitlines()[0])


def decode_batch(
    batch: EncodedBatch,
    image_size: int,
    channels: int,
    device: torch.device,
    mode: str,
    where: Callable[[int], str],
) -> torch.Tensor:
    """Decode, crop, resize and flip a micro-batch on ``device``.

    Args:
        batch: the workers' hand-over.
        image_size: the output side.
        channels: 3 (RGB) or 1 (grey).
        device: where to decode (CUDA: nvJPEG; the CPU: libjpeg-turbo).
        mode: the resize filter, ``bilinear`` or ``bicubic`` (antialiased, as the CPU path).
        where: a record number's place (shard, record, byte offset) for the error message.

    Returns:
        float32 NCHW ``(images, channels, image_size, image_size)`` on ``device``, whole grey
        levels 0-255 (not yet normalised), contiguous.

    Raises:
        DataError: a JPEG does not decode, naming its record.
    """
    data = torch.from_numpy(batch.data)
    jpegs = [data[int(a) : int(b)] for a, b in zip(batch.offsets[:-1], batch.offsets[1:], strict=True)]
    try:
        decoded = _decode_jpegs(jpegs, channels, device)
    except RuntimeError:  # the batched call names no image: one by one
        decoded = [_decode_one(jpeg, record, channels, device, where) for jpeg, record in zip(jpegs, batch.records.tolist(), strict=True)]
    out = torch.empty((len(jpegs), channels, image_size, image_size), dtype=torch.float32, device=device)
    crops, flips = batch.crops.tolist(), batch.flips.tolist()
    for j, (image, (top, left, bottom, right), flip) in enumerate(zip(decoded, crops, flips, strict=True)):
        crop = image[:, top:bottom, left:right]
        if crop.shape[1:] != (image_size, image_size):
            # float, as torch's antialiased filters on CUDA take no uint8; rounded below as the CPU path's uint8 resize rounds
            crop = F.interpolate(crop.unsqueeze(0).float(), size=(image_size, image_size), mode=mode, antialias=True)[0]
        # flipped image by image: a batch-wide index would be a host-to-device copy that waits for the decode
        out[j] = crop.flip(-1) if flip else crop
    return out.round_().clamp_(0, 255)


_fell_back: set[str] = set()  # records decoded on the CPU instead, each named once per process


def _decode_one(jpeg: torch.Tensor, record: int, channels: int, device: torch.device, where: Callable[[int], str]) -> torch.Tensor:
    """One JPEG decoded on ``device``. One the device's decoder refuses but libjpeg-turbo
    reads (nvJPEG lacks some rare chroma layouts the CPU path decodes) is decoded on the CPU
    and moved to ``device``, with a warning line naming it; one neither decodes is a
    ``DataError`` naming its record."""
    try:
        return _decode_jpegs([jpeg], channels, device)[0]
    except RuntimeError as err:
        refused = err
    if device.type != "cpu":
        try:
            image = _decode_jpegs([jpeg], channels, torch.device("cpu"))[0]
        except RuntimeError as err:
            refused = err
        else:
            if where(record) not in _fell_back:
                _fell_back.add(where(record))
                reason = _torchvision_message(refused)
                print(
                    f"largebatch: warning: {where(record)}: {device.type}'s JPEG decoder refuses it ({reason}); decoded on the CPU",
                    file=sys.stderr,
                    flush=True,
                )
            return image.to(device)
    raise DataError(f"{where(record)}: {undecodable(jpeg.numpy().tobytes(), ValueError(_torchvision_message(refused)))}") from refused
