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
is this module's own: a weight file must be a ``state_dict`` of this class (a checkpoint of another
implementation needs its keys renamed first).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ConvBN(nn.Sequential):
    """Convolution -> BatchNorm -> ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        )


class InceptionModule(nn.Module):
    """One row of Fig. 5: ``ones`` 1x1; ``reduce3`` -> ``out3`` 3x3; ``reduce_double`` -> ``out_double``
    -> ``out_double`` 3x3; ``pool`` ('avg' or 'max', 3x3) -> ``projection`` 1x1 (0: pass-through).
    ``stride`` 2 makes a reduction module (no 1x1 branch, max-pool pass-through)."""

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
    ) -> None:
        super().__init__()
        self.ones = ConvBN(in_channels, ones, 1) if ones else None
        self.branch3 = nn.Sequential(ConvBN(in_channels, reduce3, 1), ConvBN(reduce3, out3, 3, stride, 1))
        self.double3 = nn.Sequential(
            ConvBN(in_channels, reduce_double, 1),
            ConvBN(reduce_double, out_double, 3, 1, 1),
            ConvBN(out_double, out_double, 3, stride, 1),
        )
        pooling = nn.AvgPool2d(3, 1, 1) if pool == "avg" else nn.MaxPool2d(3, stride, 1)
        self.pool = nn.Sequential(pooling, ConvBN(in_channels, projection, 1)) if projection else pooling
        self.out_channels = ones + out3 + out_double + (projection or in_channels)

    def forward(self, features: Tensor) -> Tensor:
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
    """The convolutional part of BN-Inception (everything before the global pooling); 1024 channels out."""

    def __init__(self, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1_7x7_s2 = ConvBN(in_channels, 64, 7, 2, 3)
        self.pool1_3x3_s2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2_3x3_reduce = ConvBN(64, 64, 1)
        self.conv2_3x3 = ConvBN(64, 192, 3, 1, 1)
        self.pool2_3x3_s2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        channels = 192
        for name, *row in INCEPTION_TABLE:
            module = InceptionModule(channels, *row)
            self.add_module(name, module)
            channels = module.out_channels
        self.out_channels = channels

    def forward(self, images: Tensor) -> Tensor:
        features = images
        for module in self.children():
            features = module(features)
        return features
