"""How a run uses its device: the autocast precision (``training.precision``, ``auto`` resolved per
device), cuDNN's deterministic kernels or its fastest ones (``training.deterministic``), channels_last
memory for convolutional trunks on CUDA and ``torch.compile`` (``training.compile``); what was
chosen goes into ``run.json`` (``training_choices.acceleration``). The CPU is left exactly as it was:
``auto`` is fp32 there and nothing else applies, so CPU results keep their bytes."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from dmlbench.errors import UserInputError
from dmlbench.training.placement import reproducible_cuda

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Acceleration:
    """The resolved choices of one run (``resolve``); ``record()`` is what ``run.json`` keeps."""

    precision: str
    deterministic: bool
    channels_last: bool
    compile: bool

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype, ``None`` for fp32 (no autocast)."""
        return AUTOCAST_DTYPES.get(self.precision)

    def record(self) -> dict[str, Any]:
        return asdict(self)

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """The model in channels_last memory when chosen (in place; the values are unchanged)."""
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def prepare_images(self, images: torch.Tensor) -> torch.Tensor:
        """A batch in the memory format the model's convolutions run fastest on."""
        if self.channels_last and images.dim() == 4:
            return images.contiguous(memory_format=torch.channels_last)
        return images


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto``: bf16 on a CUDA device with bfloat16 support, else fp32 (the CPU, MPS, older GPUs);
    an explicit precision this device cannot run is a ``UserInputError``."""
    if precision == "auto":
        return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    if precision == "fp16" and device.type == "cpu":
        raise UserInputError(
            "training.precision=fp16 needs a CUDA or MPS device (CPU autocast supports bf16 only); "
            "use training.precision=bf16 or fp32"
        )
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserInputError(f"training.precision=bf16: {torch.cuda.get_device_name(device)} has no bfloat16 support; use fp16")
    return precision


def configure_cuda(deterministic: bool) -> None:
    """Deterministic kernels and IEEE float32 (``placement.reproducible_cuda``, what ``placement.resolve_device``
    already set), or with ``deterministic=False`` the fastest: cuDNN benchmarking picks kernels by
    timing (so they may differ between runs) and float32 products round to TF32."""
    reproducible_cuda()
    if deterministic:
        return
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True


def is_convolutional(model: nn.Module) -> bool:
    return any(isinstance(module, nn.Conv2d) for module in model.modules())


def resolve(training: Any, model: nn.Module, device: torch.device) -> Acceleration:
    """The choices of ``training`` (the config's ``training`` section) for ``model`` on ``device``;
    sets up a CUDA device's kernels (``configure_cuda``). channels_last only for a convolutional trunk
    on CUDA: on the CPU it would change the order of oneDNN's sums, hence the bytes of a result."""
    precision = resolve_precision(training.precision, device)
    if device.type == "cuda":
        configure_cuda(training.deterministic)
    channels_last = device.type == "cuda" and is_convolutional(model)
    return Acceleration(precision, training.deterministic or device.type != "cuda", channels_last, training.compile)
