"""Model inputs from image files and from dataset items, described by one ``InputSpec``."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dmlbench.config import Config
from dmlbench.data.base import ImageDataset
from dmlbench.data.files import FileDataset, eight_bits
from dmlbench.data.formats import require_utf8_name
from dmlbench.errors import ParameterError, UserInputError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


@dataclass(frozen=True)
class InputSpec:
    """What the model takes: ``channels`` x ``height`` x ``width`` floats in [0, 1], then
    ``(x - mean) / std`` per channel when given (the run's evaluation transform). ``file_format``
    holds the ``image_size`` and ``augmentation`` of a run on image files: a new file then goes
    through exactly the file datasets' evaluation view."""

    channels: int
    height: int
    width: int
    mean: list[float] | None = None
    std: list[float] | None = None
    file_format: dict[str, Any] | None = None

    @classmethod
    def of(cls, dataset: ImageDataset | FileDataset, config: Config) -> InputSpec:
        height, width = dataset.image_size
        file_format = None
        if isinstance(dataset, FileDataset):
            file_format = {"image_size": config.data.image_size, "augmentation": config.data.augmentation}
        return cls(dataset.num_channels, height, width, getattr(dataset, "mean", None), getattr(dataset, "std", None),
                   file_format)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> InputSpec:
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def normalize(self, images: Tensor) -> Tensor:
        if self.mean is None or self.std is None:
            return images
        mean = torch.tensor(self.mean).view(1, -1, 1, 1)
        std = torch.tensor(self.std).view(1, -1, 1, 1)
        return (images - mean) / std


def list_images(images: Path) -> list[Path]:
    """Image files under the folder ``images`` (recursively), sorted by path so that row order is reproducible."""
    if not images.is_dir():
        raise ParameterError("images", f"{images} is not a directory")
    files = sorted(path for path in images.rglob("*") if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file())
    if not files:
        raise ParameterError("images", f"{images} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
    for path in files:
        require_utf8_name(path)
    return files


def split_readable(files: Sequence[Path]) -> tuple[list[Path], list[Path]]:
    """``(readable, unreadable)``: the files Pillow decodes completely, and the others (truncated,
    corrupt, not images), as training leaves them out."""
    from PIL import Image, UnidentifiedImageError

    readable, unreadable = [], []
    for path in files:
        try:
            with Image.open(path) as image:
                image.load()
            readable.append(path)
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
            unreadable.append(path)
    return readable, unreadable


def decode(path: Path, channels: int) -> Tensor:
    """A file as uint8 ``[channels, H, W]`` (grey for 1 channel, RGB for 3); an undecodable file is a user error."""
    from PIL import Image, UnidentifiedImageError

    if not path.is_file():
        raise UserInputError(f"image {path} does not exist")
    try:
        with Image.open(path) as image:
            image = eight_bits(image).convert("L" if channels == 1 else "RGB")
            array = np.asarray(image, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise UserInputError(f"image {path} cannot be decoded: {error}") from None
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array.copy()).permute(2, 0, 1)


def model_inputs(paths: Sequence[Path], spec: InputSpec) -> Tensor:
    """Model inputs of image files: the file datasets' evaluation view for a run on files, else
    decode, resize the shorter side, centre-crop to the spec's size, scale to [0, 1], normalise."""
    from torchvision.transforms.v2 import functional

    if spec.file_format is not None:
        for path in paths:
            if not Path(path).is_file():
                raise UserInputError(f"image {path} does not exist")
        files = FileDataset(
            Path("/"), [str(Path(path).resolve()) for path in paths], torch.zeros(len(paths), dtype=torch.int64),
            ["unlabelled"], name="images", **spec.file_format,
        )
        try:
            return spec.normalize(files.batch(range(len(paths)))[0])
        except UserInputError as error:
            raise UserInputError(f"{error} (it cannot be decoded)") from None
    batch = []
    for path in paths:
        image = decode(path, spec.channels)
        image = functional.resize(image, [min(spec.height, spec.width)], antialias=True)
        image = functional.center_crop(image, [spec.height, spec.width])
        batch.append(image)
    return spec.normalize(torch.stack(batch).to(torch.float32) / 255.0)


def thumbnail_data_uri(image: Tensor | Path, size: int = 96) -> str:
    """A PNG thumbnail as a ``data:`` URI, so that an HTML page carries its images with it."""
    from PIL import Image

    if isinstance(image, Path):
        picture = Image.open(image)
        picture.load()
    else:
        array = image.permute(1, 2, 0).numpy()
        picture = Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
    picture.thumbnail((size, size))
    if picture.size[0] < size // 2:
        # Tiny images (glyphs are 32 px) are enlarged without smoothing so that strokes stay visible.
        scale = max(1, size // max(picture.size))
        picture = picture.resize((picture.size[0] * scale, picture.size[1] * scale), Image.NEAREST)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
