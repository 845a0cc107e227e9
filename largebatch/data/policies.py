"""The DeiT recipe's augmentations, from timm and torchvision, for the native loader.

After the random-resized crop and flip (``largebatch.data.decode``), on the uint8 image:

* ``data.auto_augment``: timm's policy string, built as timm's ``create_transform`` builds
  it: ``'rand-...'`` RandAugment (``rand_augment_transform``), ``'augmix-...'`` AugMix
  (``augment_and_mix_transform``), otherwise AutoAugment (``auto_augment_transform``:
  ``'original'``, ``'originalr'``, ``'v0'``, ``'v0r'``, ...), with timm's hyperparameters
  (``translate_const`` 45% of the image side, the fill colour the dataset mean) and
  bicubic resampling;
* ``data.color_jitter``: torchvision's ``ColorJitter`` with that strength for brightness,
  contrast and saturation, only without ``auto_augment`` (timm leaves it off under
  RandAugment; a config setting both is refused rather than silently ignored).

After normalisation, on the device: ``data.reprob`` / ``remode`` / ``recount``: timm's
``RandomErasing`` per image, as timm's ``PrefetchLoader`` applies it.

Each policy draws from Python's, NumPy's and torch's global generators; every image runs
it with those seeded from its own seed (``largebatch.randomness.augmentation_seeds``,
``seeded_globals``), so its result depends on ``(seed, epoch, sample index)`` only: the
same on any worker or rank count and after a resume.

DALI and the media pipeline have none of these here, nor a resize filter other than
bilinear (``data.interpolation``): a config that asks for them with ``data.loader`` 'dali'
or 'mediapipe' is an error naming the key (``refuse_policies``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from largebatch.config.sections import DataConfig
from largebatch.errors import ConfigError
from largebatch.randomness import seeded_globals


def _active(data_cfg: DataConfig) -> list[str]:
    """The policy keys this config turns on."""
    on = []
    if data_cfg.auto_augment:
        on.append("auto_augment")
    if data_cfg.color_jitter:
        on.append("color_jitter")
    if data_cfg.reprob > 0:
        on.append("reprob")
    if data_cfg.repeated_aug > 1:
        on.append("repeated_aug")
    if data_cfg.interpolation != "bilinear":
        on.append("interpolation")
    return on


WHY_NOT = {
    "dali": "DALI's own RandAugment/AutoAugment draw from the pipeline's generator (not exact on resume) and are not timm's policies",
    "mediapipe": "Habana's media pipeline is not given them here",
    "synthetic": "synthetic images are not augmented",
}


def refuse_policies(data_cfg: DataConfig, loader: str) -> None:
    """A ``ConfigError`` naming the first policy key the ``loader`` lacks, and why
    (``synthetic`` repeats samples: it takes ``repeated_aug``)."""
    for key in _active(data_cfg):
        if loader == "synthetic" and key == "repeated_aug":
            continue
        raise ConfigError(
            f"{key} is available with data.loader='native' only (and repeated_aug with 'synthetic'), "
            f"not with data.loader={loader!r} ({WHY_NOT.get(loader, 'not offered')}); switch the loader or unset data.{key}",
            key=f"data.{key}",
        )


def image_policy(data_cfg: DataConfig) -> Callable[[Any], Any] | None:
    """The PIL-image transform of ``auto_augment`` / ``color_jitter`` (None: neither).

    Raises:
        ConfigError: both set, or a policy string timm does not parse.
    """
    policy, jitter = data_cfg.auto_augment, data_cfg.color_jitter
    if policy and jitter:
        raise ConfigError(
            "color_jitter is not applied under auto_augment (timm turns it off there); unset one of them",
            key="data.color_jitter",
        )
    if jitter:
        from torchvision.transforms import ColorJitter

        return ColorJitter(jitter, jitter, jitter)
    if not policy:
        return None
    from PIL import Image
    from timm.data.auto_augment import augment_and_mix_transform, auto_augment_transform, rand_augment_transform

    mean = [min(255, round(255 * m)) for m in data_cfg.mean]
    hparams: dict[str, Any] = {
        "translate_const": int(data_cfg.image_size * 0.45),
        "img_mean": mean[0] if len(mean) == 1 else tuple(mean),  # a grey image's fill is one number
        "interpolation": Image.BICUBIC,
    }
    try:
        if policy.startswith("rand"):
            return _zero_bit_posterize(rand_augment_transform(policy, hparams))
        if policy.startswith("augmix"):
            return _zero_bit_posterize(augment_and_mix_transform(policy, {**hparams, "translate_pct": 0.3}))
        return _zero_bit_posterize(auto_augment_transform(policy, hparams))
    except (AssertionError, ValueError, KeyError, IndexError) as err:
        raise ConfigError(
            f"timm does not parse the policy {policy!r} ({type(err).__name__}: {err}); e.g. 'rand-m9-mstd0.5-inc1', "
            "'original', 'v0', 'augmix-m5-w4-d2'",
            key="data.auto_augment",
        ) from err


def posterize_any_bits(img, bits_to_keep: int, **kwargs):
    """timm's ``posterize``, also for 0 bits kept: a black image, as Pillow gave before
    version 11 refused 0 (timm's increasing posterize asks for it at high magnitudes)."""
    from PIL import Image
    from timm.data import auto_augment

    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    return auto_augment.posterize(img, bits_to_keep, **kwargs)


def _zero_bit_posterize(transform):
    """``transform`` with its posterize operations on ``posterize_any_bits`` (this
    transform's own operations only; timm's module is left as it is)."""
    from timm.data import auto_augment

    ops = [op for sub in getattr(transform, "policy", []) for op in sub] + list(getattr(transform, "ops", []))
    for op in ops:
        if op.aug_fn is auto_augment.posterize:
            op.aug_fn = posterize_any_bits
    return transform


def apply_policy(policy: Callable[[Any], Any], image: np.ndarray, seed: int) -> None:
    """Run ``policy`` on the uint8 CHW ``image`` in place, its draws seeded by ``seed``."""
    from PIL import Image

    pil = Image.fromarray(image[0] if image.shape[0] == 1 else np.ascontiguousarray(image.transpose(1, 2, 0)))
    with seeded_globals(seed):
        out = np.asarray(policy(pil))
    image[...] = out[None] if out.ndim == 2 else out.transpose(2, 0, 1)


def random_eraser(data_cfg: DataConfig, device: torch.device):
    """timm's ``RandomErasing`` for ``data.reprob`` > 0 (None otherwise)."""
    if not data_cfg.reprob > 0:
        return None
    from timm.data.random_erasing import RandomErasing

    return RandomErasing(data_cfg.reprob, mode=data_cfg.remode, max_count=data_cfg.recount, device=device)


def erase(eraser, images: torch.Tensor, seeds: np.ndarray) -> None:
    """Random erasing of each normalised image of ``images`` in place, image ``j``'s draws seeded by ``seeds[j]``."""
    for j, seed in enumerate(seeds.tolist()):
        with seeded_globals(seed, images.device):
            eraser(images[j])
