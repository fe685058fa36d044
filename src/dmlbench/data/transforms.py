"""Augmentation presets and the evaluation transform, with per-item seeding.

Every preset works on a *base image*: the picture resized so that its shorter side is
``base_size(image_size)`` (256 for 224, as in the papers) and centre-cropped to a square of that
side. The evaluation transform is the centre ``image_size`` crop of the base image (seed 001 §3.1:
"resized to 256 and then center cropped"). Random parameters are drawn from a ``torch.Generator``
seeded from ``(seed, epoch, root index)`` alone, so an item looks the same in a resumed run, in an
uninterrupted one and on whichever DDP rank draws it; torch's global RNG is never used.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from dmlbench.errors import UserInputError

AUGMENTATIONS = ("none", "reality_check", "base", "reduced", "big", "advanced")

# Random-resized-crop ranges: torchvision's defaults (Szegedy et al. 2015) for Roth et al. 2020 §4.1
# (seed 003); for Musgrave et al. 2020 §3.1 (seed 001) crop sides between 40 and 256 of the 256 base.
_BASE_SCALE = (0.08, 1.0)
_REALITY_CHECK_SCALE = ((40 / 256) ** 2, 1.0)
_RATIO = (3 / 4, 4 / 3)
# Seed 003 §4.2 names colour jitter of brightness and hue for "advanced" without amounts; these are ours.
_JITTER_BRIGHTNESS, _JITTER_CONTRAST, _JITTER_SATURATION, _JITTER_HUE = 0.3, 0.3, 0.3, 0.05


def check_augmentation(name: str) -> str:
    if name not in AUGMENTATIONS:
        raise UserInputError(f"data.augmentation must be one of {', '.join(AUGMENTATIONS)}, got {name!r}")
    return name


def base_size(image_size: int) -> int:
    """Side of the base image: 256/224 of ``image_size`` (256 for 224), as in seeds 001 and 003."""
    return max(image_size, round(image_size * 256 / 224))


def output_size(image_size: int, augmentation: str) -> int:
    """Side of the images a dataset returns: ``image_size``, or the whole base image for ``big``
    (seed 003 §4.2: "Base but crops images to 256x256"; evaluation then uses the same size)."""
    return base_size(image_size) if augmentation == "big" else image_size


def item_generator(seed: int, epoch: int, root_index: int) -> torch.Generator:
    """A generator that depends only on ``(seed, epoch, root_index)`` (numpy's SeedSequence mixes them)."""
    state = np.random.SeedSequence([int(seed), int(epoch), int(root_index)]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 31 ^ int(state[1]))


def evaluation_view(base: Tensor, size: int) -> Tensor:
    """Centre ``size`` x ``size`` crop of a square base image ``[C, B, B]``."""
    from torchvision.transforms.v2 import functional as F  # imported on first use: torchvision takes seconds
    return F.center_crop(base, [size, size])


def augment(base: Tensor, augmentation: str, size: int, generator: torch.Generator) -> Tensor:
    """One training view ``[C, size, size]`` (uint8) of the square base image ``[C, B, B]`` (uint8)."""
    from torchvision.transforms.v2 import functional as F  # imported on first use: torchvision takes seconds
    if augmentation == "none":
        return evaluation_view(base, size)
    if augmentation == "reduced":
        # Seed 003 §4.2 "Red.": resize the shorter side to 256 (the base image), random 224 crop, flip.
        side = base.shape[-1]
        top = int(torch.randint(0, side - size + 1, (1,), generator=generator))
        left = int(torch.randint(0, side - size + 1, (1,), generator=generator))
        view = base[:, top:top + size, left:left + size]
    else:
        scale = _REALITY_CHECK_SCALE if augmentation == "reality_check" else _BASE_SCALE
        top, left, height, width = _random_resized_crop_box(base.shape[-2], base.shape[-1], scale, generator)
        view = F.resized_crop(base, top, left, height, width, [size, size], antialias=True)
    if float(torch.rand((), generator=generator)) < 0.5:
        view = F.horizontal_flip(view)
    if augmentation == "advanced":
        view = _colour_jitter(view, generator)
    return view.contiguous()


def _random_resized_crop_box(
    height: int, width: int, scale: tuple[float, float], generator: torch.Generator
) -> tuple[int, int, int, int]:
    """The crop box of a random resized crop (Szegedy et al. 2015): area share in ``scale``, aspect
    ratio log-uniform in [3/4, 4/3]; ten tries, then the largest centred box of a valid ratio."""
    area = height * width
    log_low, log_high = math.log(_RATIO[0]), math.log(_RATIO[1])
    for _ in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * float(torch.rand((), generator=generator)))
        ratio = math.exp(log_low + (log_high - log_low) * float(torch.rand((), generator=generator)))
        crop_width = round(math.sqrt(target * ratio))
        crop_height = round(math.sqrt(target / ratio))
        if 0 < crop_width <= width and 0 < crop_height <= height:
            top = int(torch.randint(0, height - crop_height + 1, (1,), generator=generator))
            left = int(torch.randint(0, width - crop_width + 1, (1,), generator=generator))
            return top, left, crop_height, crop_width
    side = min(height, width)
    return (height - side) // 2, (width - side) // 2, side, side


def _colour_jitter(view: Tensor, generator: torch.Generator) -> Tensor:
    """Brightness, contrast, saturation and hue, each with a random factor, in a random order."""
    from torchvision.transforms.v2 import functional as F  # imported on first use: torchvision takes seconds
    def factor(amount: float) -> float:
        return 1.0 + amount * (2.0 * float(torch.rand((), generator=generator)) - 1.0)

    operations = []
    operations.append(lambda image, value=factor(_JITTER_BRIGHTNESS): F.adjust_brightness(image, value))
    operations.append(lambda image, value=factor(_JITTER_CONTRAST): F.adjust_contrast(image, value))
    if view.shape[0] == 3:
        operations.append(lambda image, value=factor(_JITTER_SATURATION): F.adjust_saturation(image, value))
        operations.append(lambda image, value=factor(_JITTER_HUE) - 1.0: F.adjust_hue(image, value))
    for position in torch.randperm(len(operations), generator=generator).tolist():
        view = operations[position](view)
    return view
