"""Feature extractors. Each constructor returns ``(module, feature_dim)``: the module maps images to
globally pooled features ``[batch, feature_dim]``.

Every constructor takes ``pooling`` (``avg`` or ``max``, the global pooling of the last feature map)
and ``pretrained``: ``False`` (random weights), ``True`` (the library's cache: torch's hub checkpoint
folder, where a missing ImageNet checkpoint of torchvision, or for BN-Inception Cadene's conversion
of the Caffe model, is downloaded and checked; or the Hugging Face cache of timm, never downloaded)
or the path of a local weight file (a ``state_dict``; the classifier's keys, if present, are
ignored). A missing file names where to put it; a file of another architecture is a ``UserInputError``.

``timm/<model_name>`` names any model of the optional ``timm`` package (``pip install dmlbench[timm]``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from dmlbench.errors import UserInputError
from dmlbench.registry import Registry
from dmlbench.validation import check_positive_int

TRUNKS: Registry[tuple[nn.Module, int]] = Registry("trunk")

TIMM_PREFIX = "timm/"
POOLINGS = ("avg", "max")
Pretrained = bool | str


def trunk_constructor(name: str) -> tuple[Callable[..., tuple[nn.Module, int]], dict[str, Any]]:
    """The constructor of trunk ``name`` and the arguments the name itself fixes (``timm/<model>``)."""
    if name.startswith(TIMM_PREFIX):
        model_name = name.removeprefix(TIMM_PREFIX)
        if not model_name:
            raise UserInputError("model.trunk 'timm/' needs a model name, e.g. timm/resnet18")
        return TRUNKS.get("timm"), {"model_name": model_name}
    if name == "timm":
        raise UserInputError("model.trunk: write timm/<model_name>, e.g. timm/resnet18")
    return TRUNKS.get(name), {}


def build_trunk(name: str, **options: Any) -> tuple[nn.Module, int]:
    constructor, fixed = trunk_constructor(name)
    return constructor(**fixed, **options)


def global_pool(pooling: str) -> nn.Sequential:
    """Global average or max pooling of a ``[batch, C, H, W]`` map to ``[batch, C]``."""
    if pooling not in POOLINGS:
        raise UserInputError(f"model.pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    pool = nn.AdaptiveAvgPool2d(1) if pooling == "avg" else nn.AdaptiveMaxPool2d(1)
    return nn.Sequential(pool, nn.Flatten())


def _window_maximum(rows: Tensor) -> Tensor:
    """``max_pool2d(rows, 2)`` of ``rows`` ``[N, C, H, W]`` (an odd last row or column dropped): the
    maximum of each window's four entries, exact like the pooling itself."""
    height, width = rows.shape[-2] // 2 * 2, rows.shape[-1] // 2 * 2
    windows = rows[..., :height, :width].unflatten(-1, (-1, 2)).unflatten(-3, (-1, 2))  # [N, C, H/2, 2, W/2, 2]
    top = torch.maximum(windows[..., 0, :, 0], windows[..., 0, :, 1])
    return torch.maximum(top, torch.maximum(windows[..., 1, :, 0], windows[..., 1, :, 1]))


class MaxPool2x2(nn.Module):
    """``nn.MaxPool2d(2)``. Without gradients on the CPU (embedding, validation) it is the maximum of
    each window's four entries: torch's ``max_pool2d`` for channels-first maps took half of the small
    CNN's inference time on this project's CPU, about ten times these element-wise maxima (the
    built-in benchmark's model, 512 images: 69 -> 44 ms; the whole benchmark 307 -> 268 s, the same
    bytes). With gradients, on other devices and for exporters and compilers it is ``max_pool2d``
    itself (in training a faster forward did not pay for a backward of our own)."""

    def forward(self, rows: Tensor) -> Tensor:
        if (
            (rows.requires_grad and torch.is_grad_enabled())
            or rows.device.type != "cpu"
            or torch.jit.is_tracing()
            or torch.compiler.is_compiling()
            or torch.onnx.is_in_onnx_export()
        ):
            return nn.functional.max_pool2d(rows, 2)
        return _window_maximum(rows)


def _conv_stage(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
        MaxPool2x2(),
    )


@TRUNKS.register("small_cnn")
def small_cnn(
    in_channels: int = 1, width: int = 32, pooling: str = "avg", pretrained: Pretrained = False
) -> tuple[nn.Module, int]:
    """Four conv-BN-ReLU-pool stages doubling the width (about 0.4 M parameters at width 32): sized so
    that a training step at batch 112 on 32x32 images takes a fraction of a second on a laptop CPU."""
    check_positive_int("in_channels", in_channels)
    check_positive_int("width", width)
    widths = [width, 2 * width, 4 * width, 8 * width]
    stages = [_conv_stage(cin, cout) for cin, cout in zip([in_channels, *widths[:-1]], widths)]
    trunk = nn.Sequential(*stages, *global_pool(pooling))
    if pretrained is True:
        raise UserInputError("model.pretrained=true: small_cnn has no pretrained weights; give a weight file path")
    if pretrained:
        load_weight_file(trunk, str(pretrained), "small_cnn")
    return trunk, widths[-1]


class PooledFeatures(nn.Module):
    """A convolutional network without its head, followed by global pooling; ``inputs`` (optional, without
    saved state) turns the images into what the network's weights expect first."""

    def __init__(self, features: nn.Module, pooling: str, inputs: nn.Module | None = None) -> None:
        super().__init__()
        self.inputs = inputs if inputs is not None else nn.Identity()
        self.features = features
        self.pool = global_pool(pooling)

    def forward(self, images: Tensor) -> Tensor:
        return self.pool(self.features(self.inputs(images)))


# Cadene's pretrainedmodels conversion of the Caffe BN-Inception trained on ImageNet (pretrainedmodels
# 0.7.4, ``pretrained_settings['bninception']``): the weights seed 001 and the DML code bases start from.
BNINCEPTION_WEIGHTS_URL = "http://data.lip6.fr/cadene/pretrainedmodels/bn_inception-52deb4733.pth"
# torchvision's weight enums of the trunks that take ``pretrained: true``, by attribute name (imported lazily).
TORCHVISION_WEIGHTS = {"resnet50": "ResNet50_Weights", "googlenet": "GoogLeNet_Weights"}


def hub_urls(trunk: str) -> list[str]:
    """The ImageNet checkpoints ``pretrained: true`` reads from torch's hub folder for ``trunk``, the one
    downloaded first (torchvision's ``IMAGENET1K_V1``); empty for a trunk without them."""
    if trunk == "bninception":
        return [BNINCEPTION_WEIGHTS_URL]
    if trunk in TORCHVISION_WEIGHTS:
        import torchvision

        return [member.url for member in getattr(torchvision.models, TORCHVISION_WEIGHTS[trunk])]
    return []


def _hub_checkpoint(urls: Sequence[str], trunk: str) -> str:
    """The first of ``urls``' files present in torch's hub folder; when none is, the first downloaded
    there (``DMLBENCH_MIRROR`` honoured, nothing under ``DMLBENCH_OFFLINE``), its sha256 checked against
    the prefix its name carries, as torch.hub does."""
    from dmlbench.download import Remote, download, mirror_base, name_hash_prefix

    folder = Path(torch.hub.get_dir()) / "checkpoints"
    names = [os.path.basename(url) for url in urls]
    for name in names:
        if (folder / name).is_file():
            return str(folder / name)
    remote = Remote(names[0], urls[0], sha256_prefix=name_hash_prefix(names[0]))
    try:
        download(remote, folder / names[0], mirror=mirror_base())
    except UserInputError as error:
        raise UserInputError(f"model.pretrained=true ({trunk}): {error}; or give model.pretrained=PATH") from None
    return str(folder / names[0])


def pretrained_weights(trunk: str, pretrained: Pretrained) -> dict[str, str] | None:
    """The weight file a trunk starts from, ``{"file": name, "sha256": ...}`` (recorded in run.json and
    benchmark.json), fetched first when ``pretrained`` is true; ``None`` for random weights or a
    trunk whose constructor resolves ``true`` itself (a plugin's)."""
    from dmlbench.download import name_hash_prefix
    from dmlbench.files import file_sha256

    if not pretrained:
        return None
    if isinstance(pretrained, str):
        path = Path(pretrained).expanduser()
        if not path.is_file():
            raise UserInputError(f"weights file {path} does not exist")
    elif hub_urls(trunk):
        path = Path(_hub_checkpoint(hub_urls(trunk), trunk))
    elif trunk.startswith(TIMM_PREFIX):
        import timm

        path = Path(_timm_cached_weights(timm, trunk.removeprefix(TIMM_PREFIX)))
    else:
        return None
    digest = file_sha256(path)
    prefix = name_hash_prefix(path.name) if pretrained is True and hub_urls(trunk) else None
    if prefix and not digest.startswith(prefix):
        raise UserInputError(f"{path} has sha256 {digest}, which does not start with the {prefix} its name carries; "
                             "delete it (it is downloaded again) or give model.pretrained=PATH")
    return {"file": path.name, "sha256": digest}


def _torchvision_trunk(name: str, in_channels: int, pooling: str, pretrained: Pretrained) -> tuple[nn.Module, int]:
    import torchvision

    check_positive_int("in_channels", in_channels)
    weight_file = None
    if pretrained is True:
        weight_file = _hub_checkpoint(hub_urls(name), name)
    elif pretrained:
        weight_file = str(pretrained)
    if name == "googlenet":
        # torchvision's ImageNet GoogLeNet expects its inputs re-normalised (transform_input), as its own
        # pretrained constructor sets; the auxiliary classifiers are training-time heads, never used here.
        network = torchvision.models.googlenet(
            weights=None, aux_logits=False, init_weights=weight_file is None, transform_input=weight_file is not None
        )
        ignored: tuple[str, ...] = ("fc.", "aux1.", "aux2.")
    else:
        network = torchvision.models.resnet50(weights=None)
        ignored = ("fc.",)
    feature_dim = network.fc.in_features
    network.fc = nn.Identity()
    if weight_file is not None:
        load_weight_file(network, weight_file, name, ignored)
    # Both networks end in global average pooling, then dropout (googlenet), then fc.
    network.avgpool = global_pool(pooling)[0]
    if weight_file is None:
        if in_channels != 3:
            _adapt_first_conv(network, in_channels)
        return network, feature_dim
    if name == "googlenet" and in_channels != 3:
        # transform_input re-normalises each of the three colours, so the network is shown the grey
        # image as three equal colours rather than given a one-channel first convolution.
        check_grey_to_colour(in_channels)
        inputs: nn.Module = nn.Sequential(RepeatChannels(3), ImageNetInput(3))
    else:
        if in_channels != 3:
            _adapt_first_conv(network, in_channels)
        inputs = ImageNetInput(in_channels)
    return InputAdapted(inputs, network), feature_dim


# The per-colour mean and SD torchvision's ImageNet weights were trained with (their transforms' Normalize).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImageNetInput(nn.Module):
    """dmlbench's images, RGB in [0, 1] (every reader's output, ``data.base``), standardised per colour as
    ImageNet weights expect (torchvision's ``mean``/``std`` by default, a timm model's from its
    ``pretrained_cfg``). One channel (a grey image, whose first convolution is averaged over colours)
    uses the mean of the means and of the SDs. Buffers not saved: constants of the weights, not state."""

    def __init__(self, channels: int = 3, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> None:
        super().__init__()
        if channels != len(mean):
            mean, std = (sum(mean) / len(mean),) * channels, (sum(std) / len(std),) * channels
        self.register_buffer("mean", torch.tensor(tuple(mean), dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(tuple(std), dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, images: Tensor) -> Tensor:
        return (images - self.mean) / self.std


class InputAdapted(nn.Module):
    """A network whose weights expect other inputs than dmlbench's images, behind the module that makes them."""

    def __init__(self, inputs: nn.Module, network: nn.Module) -> None:
        super().__init__()
        self.inputs = inputs
        self.network = network

    def forward(self, images: Tensor) -> Tensor:
        return self.network(self.inputs(images))


class RepeatChannels(nn.Module):
    """A one-channel (grey) image as ``channels`` equal channels, for a network that needs colour input."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.channels = channels

    def forward(self, images: Tensor) -> Tensor:
        return images.expand(-1, self.channels, -1, -1)


def check_grey_to_colour(in_channels: int) -> None:
    """Only a grey image can be shown as equal colours; another channel count is a one-line error."""
    if in_channels != 1:
        raise UserInputError(f"in_channels={in_channels}: a trunk with ImageNet colour weights takes 1 (grey) or 3 channels")


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
                if module.bias is not None:
                    replacement.bias.copy_(module.bias)
            parent = network.get_submodule(module_name.rpartition(".")[0]) if "." in module_name else network
            setattr(parent, module_name.rpartition(".")[2], replacement)
            return


def read_weight_file(path: Path) -> Mapping[str, Tensor]:
    """A ``state_dict`` from a ``torch.save`` file or a ``.safetensors`` file; anything else is a user error."""
    if not path.is_file():
        raise UserInputError(f"weights file {path} does not exist")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file is the same user mistake
        raise UserInputError(f"weights file {path} cannot be read ({type(error).__name__})") from None
    if not isinstance(state, Mapping) or not all(isinstance(value, Tensor) for value in state.values()):
        raise UserInputError(f"weights file {path} is not a state_dict (a mapping of parameter names to tensors)")
    return state


def load_weight_file(network: nn.Module, weights_path: str, trunk: str, ignored: tuple[str, ...] = ()) -> None:
    """Load a local ``state_dict`` into ``network`` (keys starting with ``ignored`` are skipped); a file
    that does not fit (missing, unexpected or differently shaped tensors) is one ``UserInputError`` line."""
    path = Path(weights_path)
    load_state(network, read_weight_file(path), path, trunk, ignored)


def load_state(network: nn.Module, state: Mapping[str, Tensor], path: Path, trunk: str,
               ignored: tuple[str, ...] = ()) -> None:
    """Load ``state``, read from ``path``, into ``network`` as ``load_weight_file`` does."""
    state = {key: value for key, value in state.items() if not key.startswith(ignored)}
    expected = network.state_dict()
    missing = [key for key in expected if key not in state]
    unexpected = [key for key in state if key not in expected]
    mismatched = [key for key in expected if key in state and state[key].shape != expected[key].shape]
    if missing or unexpected or mismatched:
        problems = []
        for label, keys in (("missing", missing), ("unexpected", unexpected)):
            if keys:
                problems.append(f"{len(keys)} {label} tensor(s), e.g. {keys[0]!r}")
        if mismatched:
            key = mismatched[0]
            problems.append(
                f"{len(mismatched)} of another shape, e.g. {key!r} {list(state[key].shape)} "
                f"instead of {list(expected[key].shape)}"
            )
        raise UserInputError(f"weights file {path} does not fit trunk {trunk}: {'; '.join(problems)}")
    network.load_state_dict(state)


@TRUNKS.register("resnet50")
def resnet50(in_channels: int = 3, pooling: str = "avg", pretrained: Pretrained = False) -> tuple[nn.Module, int]:
    """ResNet-50 (He et al. 2016), the trunk of seeds 003/004; 2048-d features."""
    return _torchvision_trunk("resnet50", in_channels, pooling, pretrained)


@TRUNKS.register("googlenet")
def googlenet(in_channels: int = 3, pooling: str = "avg", pretrained: Pretrained = False) -> tuple[nn.Module, int]:
    """GoogLeNet (Szegedy et al. 2015), the trunk of seed 000 and older papers; 1024-d features."""
    return _torchvision_trunk("googlenet", in_channels, pooling, pretrained)


@TRUNKS.register("bninception")
def bninception(in_channels: int = 3, pooling: str = "avg", pretrained: Pretrained = False) -> tuple[nn.Module, int]:
    """BN-Inception (Ioffe & Szegedy 2015, Fig. 5), the backbone of seeds 001/002; 1024-d features.

    ``pretrained=True``: the Caffe model's ImageNet weights in Cadene's conversion (``BNINCEPTION_WEIGHTS_URL``,
    fetched into torch's hub folder), in a network that pools as that model was trained and behind
    ``CaffeInput`` (``models.bninception``); a weight file in Cadene's layout is read the same way, any
    other must be a ``state_dict`` of this trunk."""
    from dmlbench.models.bninception import BNInception, CaffeInput, cadene_state_dict, is_cadene_layout

    check_positive_int("in_channels", in_channels)
    path = None
    if pretrained is True:
        path = Path(_hub_checkpoint(hub_urls("bninception"), "bninception"))
    elif pretrained:
        path = Path(str(pretrained))
    state = read_weight_file(path) if path is not None else None
    cadene = pretrained is True or (state is not None and is_cadene_layout(state))
    features = BNInception(3, caffe_pooling=cadene)
    network = PooledFeatures(features, pooling, CaffeInput(in_channels) if cadene else None)
    if path is not None and state is not None:
        if cadene:
            load_state(features, cadene_state_dict(state), path, "bninception")
        else:
            load_state(network, state, path, "bninception")
    if in_channels != 3:
        _adapt_first_conv(network, in_channels)
    return network, features.out_channels


def _timm_cached_weights(timm: Any, model_name: str) -> str:
    """The model's pretrained file in the local Hugging Face cache, or a user error saying where it goes."""
    from huggingface_hub import constants, try_to_load_from_cache

    config = timm.models.get_pretrained_cfg(model_name)
    hub_id = getattr(config, "hf_hub_id", None) if config is not None else None
    if not hub_id:
        raise UserInputError(
            f"model.pretrained=true: timm model {model_name!r} has no Hugging Face weights; give model.pretrained=PATH"
        )
    for filename in ("model.safetensors", "pytorch_model.bin"):
        found = try_to_load_from_cache(hub_id, filename)
        if isinstance(found, str):
            return found
    raise UserInputError(
        f"model.pretrained=true: the weights of timm/{model_name} are not in the Hugging Face cache "
        f"{constants.HF_HUB_CACHE} (nothing is downloaded); fetch them once with "
        f"`huggingface-cli download {hub_id} model.safetensors` or give model.pretrained=PATH"
    )


@TRUNKS.register("timm")
def timm_trunk(
    model_name: str, in_channels: int = 3, pooling: str = "avg", pretrained: Pretrained = False
) -> tuple[nn.Module, int]:
    """Any model of timm (Wightman, PyTorch Image Models) without its classifier: ``model.trunk: timm/<name>``."""
    try:
        import timm
    except ImportError:
        raise UserInputError("model.trunk timm/...: timm is not installed; pip install 'dmlbench[timm]'") from None
    check_positive_int("in_channels", in_channels)
    global_pool(pooling)
    if not timm.is_model(model_name):
        raise UserInputError(f"model.trunk: timm has no model {model_name!r} (timm.list_models() lists them)")
    try:
        network = timm.create_model(model_name, pretrained=False, num_classes=0, global_pool=pooling)
    except (TypeError, ValueError, AssertionError, RuntimeError) as error:
        raise UserInputError(f"model.trunk timm/{model_name} with pooling {pooling!r}: {error}") from None
    weight_file = _timm_cached_weights(timm, model_name) if pretrained is True else pretrained or None
    if weight_file:
        config = getattr(network, "pretrained_cfg", {}) or {}
        classifier = config.get("classifier") or ()
        ignored = tuple(f"{name}." for name in ([classifier] if isinstance(classifier, str) else classifier))
        load_weight_file(network, str(weight_file), f"timm/{model_name}", ignored)
    if in_channels != 3:
        _adapt_first_conv(network, in_channels)
    if not weight_file:
        return network, int(network.num_features)
    config = getattr(network, "pretrained_cfg", {}) or {}
    inputs = ImageNetInput(in_channels, config.get("mean", IMAGENET_MEAN), config.get("std", IMAGENET_STD))
    return InputAdapted(inputs, network), int(network.num_features)
