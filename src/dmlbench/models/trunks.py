"""Feature extractors. Each constructor returns ``(module, feature_dim)``; weights are random unless a
local weight file is given (nothing is ever downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from dmlbench.errors import UserInputError
from dmlbench.registry import Registry
from dmlbench.validation import check_positive_int

TRUNKS: Registry[tuple[nn.Module, int]] = Registry("trunk")


def _conv_stage(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


@TRUNKS.register("small_cnn")
def small_cnn(in_channels: int = 1, width: int = 32) -> tuple[nn.Module, int]:
    """Four conv-BN-ReLU-pool stages doubling the width (about 0.4 M parameters at width 32): sized so
    that a training step at batch 112 on 32x32 images takes a fraction of a second on a laptop CPU."""
    check_positive_int("in_channels", in_channels)
    check_positive_int("width", width)
    widths = [width, 2 * width, 4 * width, 8 * width]
    stages = [_conv_stage(cin, cout) for cin, cout in zip([in_channels, *widths[:-1]], widths)]
    trunk = nn.Sequential(*stages, nn.AdaptiveAvgPool2d(1), nn.Flatten())
    return trunk, widths[-1]


def _torchvision_trunk(name: str, in_channels: int, weights_path: str | None) -> tuple[nn.Module, int]:
    import torchvision

    constructor = getattr(torchvision.models, name)
    kwargs = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
    network = constructor(weights=None, **kwargs)
    if weights_path is not None:
        load_weight_file(network, weights_path)
    if in_channels != 3:
        _adapt_first_conv(network, in_channels)
    feature_dim = network.fc.in_features
    network.fc = nn.Identity()
    return network, feature_dim


def _adapt_first_conv(network: nn.Module, in_channels: int) -> None:
    """Grayscale input for an RGB network: average the first convolution's weights over colours."""
    for module_name, module in network.named_modules():
        if isinstance(module, nn.Conv2d) and module.in_channels == 3:
            replacement = nn.Conv2d(
                in_channels, module.out_channels, module.kernel_size, module.stride,
                module.padding, bias=module.bias is not None,
            )
            with torch.no_grad():
                replacement.weight.copy_(module.weight.mean(dim=1, keepdim=True).expand_as(replacement.weight))
            parent = network.get_submodule(module_name.rpartition(".")[0]) if "." in module_name else network
            setattr(parent, module_name.rpartition(".")[2], replacement)
            return


def load_weight_file(network: nn.Module, weights_path: str) -> None:
    """Load a local ``state_dict`` file; a missing file or mismatched keys are user errors."""
    path = Path(weights_path)
    if not path.is_file():
        raise UserInputError(f"weights file {path} does not exist")
    state = torch.load(path, map_location="cpu", weights_only=True)
    try:
        network.load_state_dict(state)
    except RuntimeError as error:
        first_line = str(error).strip().splitlines()[0]
        raise UserInputError(f"weights file {path} does not fit the network: {first_line}") from None


@TRUNKS.register("resnet50")
def resnet50(in_channels: int = 3, weights_path: str | None = None) -> tuple[nn.Module, int]:
    """ResNet-50 (He et al. 2016), the trunk of seed 003/004; random weights or a local file."""
    return _torchvision_trunk("resnet50", in_channels, weights_path)


@TRUNKS.register("googlenet")
def googlenet(in_channels: int = 3, weights_path: str | None = None) -> tuple[nn.Module, int]:
    """GoogLeNet (Szegedy et al. 2015), the trunk of seed 000 and older papers; random weights or a local file."""
    return _torchvision_trunk("googlenet", in_channels, weights_path)
