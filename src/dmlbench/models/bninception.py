"""BN-Inception (Ioffe & Szegedy 2015, "Batch Normalization", §4.1 and Fig. 5): the Inception
network with batch normalisation after every convolution, the usual DML backbone (seeds 000-002).

Built from the paper's Fig. 5 table. Every convolution is followed by BatchNorm and ReLU. Inception
modules have four branches: a 1x1 convolution, a 1x1 reduction followed by a 3x3 convolution, a 1x1
reduction followed by two 3x3 convolutions ("double 3x3", the paper's replacement of the 5x5), and a
3x3 pooling followed by a 1x1 projection. The stride-2 modules (3c, 4e) have no 1x1 branch, their
3x3 branches stride 2, and their pooling branch is a max pooling passed through unchanged. Output:
the 1024 channels of module 5b, pooled globally (7x7 at 224x224 input).

Choices the paper leaves open: the stem's max poolings round up (``ceil_mode``, as the original
Caffe release); the stride-2 modules' pass-through pooling pads by one like their stride-2
convolutions, so the branches have the same spatial size for any input size. The parameter layout
is this module's own.

ImageNet weights: the Caffe model Y. Xiong trained on ImageNet (Google released none), in Cadene's
``pretrainedmodels`` conversion, ``bn_inception-52deb4733.pth``, the weights the DML code bases start
from. ``cadene_state_dict`` renames its tensors to this class's; ``BNInception(caffe_pooling=True)``
pools as that network was trained (the stride-2 modules' pass-through max pooling unpadded, rounding
up: the maps entering 3c and 4e need even sides, which 224 and 227 px inputs give); ``CaffeInput``
turns dmlbench's images into the input it was trained on. Facts from pretrainedmodels 0.7.4
(``models/bninception.py``): convolutions with bias, BatchNorm with torch's defaults (eps 1e-5,
momentum 0.1), input BGR in 0-255 minus the mean (104, 117, 128), standard deviation 1.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from dmlbench.errors import UserInputError


class ConvBN(nn.Sequential):
    """Convolution -> BatchNorm -> ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        )


def _size_error(module: str, height: int, width: int) -> UserInputError:
    return UserInputError(
        f"bninception with Cadene's ImageNet weights pools as the Caffe release: the map entering {module} is "
        f"{height}x{width}, its sides must be even; set data.image_size to a side of 32k-1 to 32k+6 pixels (224, 227, 256)")


def _stem_side(side: int) -> int:
    """The side of the map leaving the stem (``conv1_7x7_s2`` to ``pool2_3x3_s2``) for an input side."""
    side = (side + 2 * 3 - 7) // 2 + 1
    for _ in range(2):  # unpadded 3x3 stride-2 max poolings rounding up
        side = -(-(side - 3) // 2) + 1
    return side


class InceptionModule(nn.Module):
    """One row of Fig. 5: ``ones`` 1x1; ``reduce3`` -> ``out3`` 3x3; ``reduce_double`` -> ``out_double``
    -> ``out_double`` 3x3; ``pool`` ('avg' or 'max', 3x3) -> ``projection`` 1x1 (0: pass-through).
    ``stride`` 2 makes a reduction module (no 1x1 branch, max-pool pass-through), whose pooling pads
    by one, or with ``caffe_pooling`` pools as the Caffe release (unpadded, rounding up)."""

    def __init__(
        self,
        in_channels: int,
        ones: int,
        reduce3: int,
        out3: int,
        reduce_double: int,
        out_double: int,
        pool: str,
        projection: int,
        stride: int = 1,
        caffe_pooling: bool = False,
        name: str = "",
    ) -> None:
        super().__init__()
        self.name = name
        self.ones = ConvBN(in_channels, ones, 1) if ones else None
        self.branch3 = nn.Sequential(ConvBN(in_channels, reduce3, 1), ConvBN(reduce3, out3, 3, stride, 1))
        self.double3 = nn.Sequential(
            ConvBN(in_channels, reduce_double, 1),
            ConvBN(reduce_double, out_double, 3, 1, 1),
            ConvBN(out_double, out_double, 3, stride, 1),
        )
        # Unpadded and rounding up, a stride-2 pooling of an odd side gives one row less than the
        # stride-2 convolutions beside it; ``forward`` refuses such an input in one line.
        self.unpadded = caffe_pooling and stride == 2
        if pool == "avg":
            pooling: nn.Module = nn.AvgPool2d(3, 1, 1)
        elif self.unpadded:
            pooling = nn.MaxPool2d(3, stride, ceil_mode=True)
        else:
            pooling = nn.MaxPool2d(3, stride, 1)
        self.pool = nn.Sequential(pooling, ConvBN(in_channels, projection, 1)) if projection else pooling
        self.out_channels = ones + out3 + out_double + (projection or in_channels)

    def forward(self, features: Tensor) -> Tensor:
        if self.unpadded and (features.shape[-2] % 2 or features.shape[-1] % 2):
            raise _size_error(self.name, features.shape[-2], features.shape[-1])
        branches = [self.branch3(features), self.double3(features), self.pool(features)]
        if self.ones is not None:
            branches.insert(0, self.ones(features))
        return torch.cat(branches, dim=1)


# Fig. 5 of Ioffe & Szegedy 2015: (name, ones, reduce3, out3, reduce_double, out_double, pool, projection, stride).
INCEPTION_TABLE = (
    ("inception_3a", 64, 64, 64, 64, 96, "avg", 32, 1),
    ("inception_3b", 64, 64, 96, 64, 96, "avg", 64, 1),
    ("inception_3c", 0, 128, 160, 64, 96, "max", 0, 2),
    ("inception_4a", 224, 64, 96, 96, 128, "avg", 128, 1),
    ("inception_4b", 192, 96, 128, 96, 128, "avg", 128, 1),
    ("inception_4c", 160, 128, 160, 128, 160, "avg", 128, 1),
    ("inception_4d", 96, 128, 192, 160, 192, "avg", 128, 1),
    ("inception_4e", 0, 128, 192, 192, 256, "max", 0, 2),
    ("inception_5a", 352, 192, 320, 160, 224, "avg", 128, 1),
    ("inception_5b", 352, 192, 320, 192, 224, "max", 128, 1),
)


class BNInception(nn.Module):
    """The convolutional part of BN-Inception (everything before the global pooling); 1024 channels out.
    ``caffe_pooling``: the stride-2 modules pool as the Caffe release (for its ImageNet weights)."""

    def __init__(self, in_channels: int = 3, caffe_pooling: bool = False) -> None:
        super().__init__()
        self.caffe_pooling = caffe_pooling
        self.conv1_7x7_s2 = ConvBN(in_channels, 64, 7, 2, 3)
        self.pool1_3x3_s2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2_3x3_reduce = ConvBN(64, 64, 1)
        self.conv2_3x3 = ConvBN(64, 192, 3, 1, 1)
        self.pool2_3x3_s2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        channels = 192
        for name, *row in INCEPTION_TABLE:
            module = InceptionModule(channels, *row, caffe_pooling=caffe_pooling, name=name)
            self.add_module(name, module)
            channels = module.out_channels
        self.out_channels = channels

    def forward(self, images: Tensor) -> Tensor:
        features = images
        for module in self.children():
            features = module(features)
        return features

    def input_size_error(self, height: int, width: int) -> UserInputError | None:
        """The refusal ``forward`` would give an input of ``height`` x ``width`` (only with ``caffe_pooling``),
        found from the sizes alone, so that a run says it before it starts; ``None`` when the branches line up."""
        if not self.caffe_pooling:
            return None
        sides = [_stem_side(height), _stem_side(width)]
        for name in ("inception_3c", "inception_4e"):  # the stride-1 modules keep the side
            if sides[0] % 2 or sides[1] % 2:
                return _size_error(name, *sides)
            sides = [side // 2 for side in sides]
        return None


# The Caffe model's input (pretrainedmodels 0.7.4, ``pretrained_settings['bninception']``): BGR in
# 0-255, this mean subtracted per channel (in BGR order), standard deviation 1.
CAFFE_BGR_MEAN = (104.0, 117.0, 128.0)


class CaffeInput(nn.Module):
    """dmlbench's images, RGB in [0, 1] (every reader's output, ``data.base``), turned into what the
    Caffe BN-Inception was trained on: BGR, times 255, minus ``CAFFE_BGR_MEAN``. The same float
    operations as pretrainedmodels' ``TransformImage`` (``ToSpaceBGR``, ``ToRange255``, ``Normalize``),
    so the result is exact; a fixed module rather than folded into the first convolution, whose zero
    padding would then pad with the mean. One channel (grey images, whose first convolution
    ``trunks`` averages over colours, an approximation as for every trunk) subtracts the mean of the
    three means. Its buffer is not saved: a constant of the weights, not state."""

    def __init__(self, channels: int = 3) -> None:
        super().__init__()
        mean = CAFFE_BGR_MEAN if channels == 3 else (sum(CAFFE_BGR_MEAN) / 3,) * channels
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.reverse = channels == 3

    def forward(self, images: Tensor) -> Tensor:
        return (images.flip(1) if self.reverse else images) * 255.0 - self.mean


# Cadene's name of each convolution of a module (its BatchNorm: the name + "_bn") -> the ConvBN it is here.
CADENE_BRANCHES = {
    "1x1": "ones", "3x3_reduce": "branch3.0", "3x3": "branch3.1", "double_3x3_reduce": "double3.0",
    "double_3x3_1": "double3.1", "double_3x3_2": "double3.2", "pool_proj": "pool.1",
}
CADENE_STEM = ("conv1_7x7_s2", "conv2_3x3_reduce", "conv2_3x3")
CADENE_CLASSIFIER = "last_linear."


def is_cadene_layout(state: Mapping[str, Tensor]) -> bool:
    """Whether a ``state_dict`` names its tensors as Cadene's conversion does (``conv1_7x7_s2_bn.weight``)."""
    return "conv1_7x7_s2_bn.weight" in state


def _renamed(key: str) -> str:
    """``key`` of Cadene's layout as ``BNInception`` names it; an unknown key unchanged (the caller reports it)."""
    layer, _, tensor = key.rpartition(".")
    base = layer.removesuffix("_bn")
    position = "1" if base != layer else "0"  # ConvBN: 0 the convolution, 1 its BatchNorm
    if base in CADENE_STEM:
        return f"{base}.{position}.{tensor}"
    module, _, branch = base.partition("_")[2].partition("_")
    if base.startswith("inception_") and branch in CADENE_BRANCHES:
        return f"inception_{module}.{CADENE_BRANCHES[branch]}.{position}.{tensor}"
    return key


def cadene_state_dict(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Cadene's BN-Inception ``state_dict`` (pretrainedmodels' ``bninception``) as ``BNInception``'s,
    without the ImageNet classifier (``last_linear``). The file predates torch 0.4: the DML code bases
    that load it squeeze BatchNorm vectors stored as ``[1, C]``, as done here (``[C]`` is kept), and
    it has no ``num_batches_tracked``, which then starts at 0 as in a new layer (only momentum
    ``None`` reads it)."""
    converted: dict[str, Tensor] = {}
    for key, value in state.items():
        if key.startswith(CADENE_CLASSIFIER):
            continue
        renamed = _renamed(key)
        batchnorm = renamed != key and key.rpartition(".")[0].endswith("_bn")
        if batchnorm and value.dim() == 2 and value.shape[0] == 1:
            value = value.reshape(-1)
        converted[renamed] = value
        if batchnorm:
            converted.setdefault(renamed.rpartition(".")[0] + ".num_batches_tracked", torch.tensor(0))
    return converted
