"""training.precision auto, training.deterministic, channels_last and what run.json records of them.

This machine may lack a GPU: the CUDA choices are checked on the flags torch exposes (CUDA's presence
monkeypatched), the CPU's on real runs."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from training_fixtures import TINY

from dmlbench import config as config_module
from dmlbench import models
from dmlbench.errors import UserInputError
from dmlbench.training import acceleration, train

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture
def cuda_flags(monkeypatch: pytest.MonkeyPatch):
    """Restores every global flag ``configure_cuda`` sets (monkeypatch cannot restore the deterministic mode)."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cuda.matmul.allow_tf32)
    for flag in ("benchmark", "deterministic", "allow_tf32"):
        monkeypatch.setattr(torch.backends.cudnn, flag, getattr(torch.backends.cudnn, flag))
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.backends.cuda.matmul.allow_tf32 = before[2]


def test_auto_is_fp32_on_the_cpu_and_bf16_on_a_gpu_that_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert acceleration.resolve_precision("auto", CPU) == "fp32"
    assert acceleration.resolve_precision("bf16", CPU) == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert acceleration.resolve_precision("auto", CUDA) == "bf16"
    assert acceleration.resolve_precision("fp32", CUDA) == "fp32"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert acceleration.resolve_precision("auto", CUDA) == "fp32"  # an older GPU: no error, the exact path
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Old GPU")
    with pytest.raises(UserInputError, match="Old GPU has no bfloat16"):
        acceleration.resolve_precision("bf16", CUDA)
    with pytest.raises(UserInputError, match="fp16 needs a CUDA or MPS device"):
        acceleration.resolve_precision("fp16", CPU)


def test_deterministic_false_turns_on_benchmarking_and_tf32_and_true_turns_them_off(cuda_flags: None) -> None:
    acceleration.configure_cuda(False)
    assert torch.backends.cudnn.benchmark and not torch.backends.cudnn.deterministic
    assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    assert not torch.are_deterministic_algorithms_enabled()
    acceleration.configure_cuda(True)  # a later run of the same process gets its deterministic kernels back
    assert not torch.backends.cudnn.benchmark and torch.backends.cudnn.deterministic
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    assert torch.are_deterministic_algorithms_enabled()


def test_channels_last_only_for_a_convolutional_trunk_on_cuda(cuda_flags: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    training = config_module.load(None, list(TINY)).training
    cnn = models.build("small_cnn", embedding_dim=8, seed=0, in_channels=1, width=4)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    on_cuda = acceleration.resolve(training, cnn, CUDA)
    assert on_cuda.record() == {"precision": "bf16", "deterministic": True, "channels_last": True, "compile": False}
    assert on_cuda.dtype is torch.bfloat16
    assert not acceleration.resolve(training, mlp, CUDA).channels_last
    on_cpu = acceleration.resolve(training.model_copy(update={"deterministic": False}), cnn, CPU)
    assert on_cpu.record() == {"precision": "fp32", "deterministic": True, "channels_last": False, "compile": False}
    assert on_cpu.dtype is None and on_cpu.prepare_model(cnn) is cnn


def test_channels_last_moves_memory_not_values() -> None:
    """What CUDA runs get, checked for its values on the CPU: the same embeddings from both layouts."""
    choice = acceleration.Acceleration("fp32", True, True, False)
    plain = models.build("small_cnn", embedding_dim=8, seed=3, in_channels=3, width=4).eval()
    moved = choice.prepare_model(models.build("small_cnn", embedding_dim=8, seed=3, in_channels=3, width=4).eval())
    images = torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    prepared = choice.prepare_images(images)
    assert prepared.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous(memory_format=torch.channels_last)
    conv = next(module for module in moved.modules() if isinstance(module, nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        torch.testing.assert_close(moved(prepared), plain(images), rtol=0, atol=1e-6)


def test_run_json_records_the_resolved_choices(tmp_path: Path) -> None:
    result = train(config_module.load(None, [*TINY, "training.epochs=1"]), tmp_path / "run", progress=False)
    choices = json.loads((result.run_dir / "run.json").read_text())["training_choices"]
    assert choices["training"]["precision"] == "auto" and choices["training"]["deterministic"] is True
    assert choices["acceleration"] == {"precision": "fp32", "deterministic": True, "channels_last": False, "compile": False}


def test_images_go_to_a_gpu_augmented_or_not_within_a_quarter_of_its_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    from dmlbench import data
    from dmlbench.data.base import ImageDataset
    from dmlbench.training.setup import held_on

    dataset = data.build("glyphs", max_classes=4, augmentations_per_font=0, image_size=16)
    assert held_on(dataset, CPU) is dataset
    moved = []
    monkeypatch.setattr(ImageDataset, "on_device", lambda self, device: moved.append(device) or self)
    size = dataset.images.numel()
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (4 * size, 8 * size))
    held_on(dataset, CUDA)
    held_on(dataset.with_augmentation("base", seed=0), CUDA)  # its views are cut on the GPU too
    assert moved == [CUDA, CUDA]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (4 * size - 1, 8 * size))
    held_on(dataset, CUDA)
    assert moved == [CUDA, CUDA]


def test_a_file_dataset_goes_to_a_gpu_by_the_bytes_of_the_parts_it_touches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file dataset on a CUDA device had no ``augmentation`` to ask (an AttributeError before any
    training); it is now held there when its parts' base images fit, the training items' part only."""
    import replicas

    from dmlbench import data
    from dmlbench.data.files import FileDataset
    from dmlbench.training.setup import held_on

    root = replicas.folder(tmp_path / "data", classes=2, per_class=3)
    dataset = data.build("folder", root=str(root), image_size=16, augmentation="base")
    development = dataset.subset([0, 2])  # class_0: the development part, 3 images of 3 x 18 x 18
    assert development.held_bytes() == 3 * 3 * 18 * 18 and dataset.held_bytes() == 2 * development.held_bytes()
    moved = []
    monkeypatch.setattr(FileDataset, "on_device", lambda self, device: moved.append(device) or self)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (4 * development.held_bytes(), 10**9))
    held_on(development, CUDA)
    held_on(dataset, CUDA)
    assert moved == [CUDA]


def test_a_dataset_on_a_device_gives_the_same_batches() -> None:
    from dmlbench import data

    dataset = data.build("glyphs", max_classes=4, augmentations_per_font=0, image_size=16)
    normalized = dataset.with_normalization(*dataset.pixel_statistics())
    for source in (dataset, normalized, normalized.subset([5, 1, 9])):
        held = source.on_device(CPU)
        assert held.content_hash == source.content_hash
        for expected, found in zip(source.batch([2, 0, 1], epoch=1), held.batch([2, 0, 1], epoch=1)):
            assert torch.equal(expected, found)
