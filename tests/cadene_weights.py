"""BN-Inception weight files in the layout of Cadene's conversion of the Caffe model, for the tests: the
reference network of pretrainedmodels 0.7.4 (its ``models/bninception.py``, loaded alone: the package's
``__init__`` imports modules that need more than it declares) with random seeded weights, and that
file placed where ``model.pretrained: true`` looks for it."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

from dmlbench.models import trunks

OFFICIAL_NAME = "bn_inception-52deb4733.pth"


def reference_module() -> ModuleType:
    """pretrainedmodels' ``models/bninception.py``, imported without its package."""
    package = importlib.util.find_spec("pretrainedmodels")
    assert package is not None and package.submodule_search_locations, "pip install -e '.[test]' (pretrainedmodels)"
    path = Path(package.submodule_search_locations[0]) / "models" / "bninception.py"
    spec = importlib.util.spec_from_file_location("pretrainedmodels_bninception", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_network(seed: int = 0) -> nn.Module:
    """Cadene's ``BNInception`` in evaluation mode with random weights drawn from ``seed``: He-scaled
    convolutions (the first one scaled down to the 0-255 input) and BatchNorm statistics around
    one, so that activations keep a size of order one to a hundred through the network."""
    network = reference_module().BNInception()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in network.state_dict().items():
            if not tensor.is_floating_point():
                continue
            if name.endswith(("running_var", "_bn.weight")):
                tensor.copy_(torch.rand(tensor.shape, generator=generator) + 0.5)
            elif tensor.dim() == 4:
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * (2 / tensor[0].numel()) ** 0.5)
            else:
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.1)
        network.conv1_7x7_s2.weight.div_(64)
    return network.eval()


def weight_file(path: Path, seed: int = 0) -> bytes:
    """A Cadene-layout ``state_dict`` (with its ImageNet classifier) saved at ``path``; its bytes."""
    torch.save(reference_network(seed).state_dict(), path)
    return path.read_bytes()


def hub_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private torch hub (``TORCH_HOME``), nothing downloaded or forbidden yet; its checkpoints folder."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.delenv("DMLBENCH_OFFLINE", raising=False)
    monkeypatch.delenv("DMLBENCH_MIRROR", raising=False)
    return tmp_path / "torch" / "hub" / "checkpoints"


def name_carrying_its_hash(data: bytes, monkeypatch: pytest.MonkeyPatch) -> str:
    """The official file name with ``data``'s own sha256 prefix in place of the real file's (9 hex
    digits, as Cadene's name has); ``pretrained: true`` then asks for that name."""
    name = f"bn_inception-{hashlib.sha256(data).hexdigest()[:9]}.pth"
    monkeypatch.setattr(trunks, "BNINCEPTION_WEIGHTS_URL", trunks.BNINCEPTION_WEIGHTS_URL.replace(OFFICIAL_NAME, name))
    return name
