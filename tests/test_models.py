import math

import pytest
import torch

from dmlbench import models
from dmlbench.errors import UserInputError
from dmlbench.models.bninception import BNInception
from dmlbench.models.trunks import MaxPool2x2


def test_small_cnn_embeddings_are_unit_norm_and_seeded() -> None:
    first = models.build("small_cnn", embedding_dim=16, seed=3)
    second = models.build("small_cnn", embedding_dim=16, seed=3)
    images = torch.rand(4, 1, 32, 32)
    first.eval(), second.eval()
    out = first(images)
    assert out.shape == (4, 16)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(4))
    torch.testing.assert_close(out, second(images))


@pytest.mark.parametrize("shape", [(3, 4, 24, 24), (2, 3, 7, 9), (2, 2, 3, 3), (1, 1, 2, 2), (2, 1, 5, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_window_maximum_pooling_is_max_pool2d(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    # Small integers after a ReLU: most windows hold ties; odd sizes drop the last row or column.
    rows = torch.relu(torch.randint(-2, 3, shape, generator=torch.Generator().manual_seed(0))).to(dtype)
    rows[0, 0, 0, 0] = float("nan")
    expected = torch.nn.functional.max_pool2d(rows, 2)
    with torch.no_grad():
        assert torch.equal(MaxPool2x2()(rows).isnan(), expected.isnan())
        assert torch.equal(MaxPool2x2()(rows).nan_to_num(), expected.nan_to_num())
    # With gradients it is max_pool2d itself: its gradient goes to the first maximum of a window.
    leaf = rows.nan_to_num().requires_grad_(True)
    MaxPool2x2()(leaf).sum().backward()
    reference = rows.nan_to_num().requires_grad_(True)
    torch.nn.functional.max_pool2d(reference, 2).sum().backward()
    assert torch.equal(leaf.grad, reference.grad)


def test_small_cnn_embeds_the_same_bits_with_either_pooling() -> None:
    model = models.build("small_cnn", embedding_dim=16, seed=3).eval()
    images = torch.rand(8, 1, 24, 24, generator=torch.Generator().manual_seed(1)).round()  # glyph-like: ties
    with torch.no_grad():
        ours = model(images)
        swapped = 0
        for module in model.modules():
            for name, child in module.named_children():
                if isinstance(child, MaxPool2x2):
                    setattr(module, name, torch.nn.MaxPool2d(2))
                    swapped += 1
        assert swapped == 4 and torch.equal(ours, model(images))


def test_seeded_build_leaves_global_random_state_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    models.build("small_cnn", embedding_dim=8, seed=0)
    torch.testing.assert_close(torch.rand(3), expected)


def test_head_without_normalisation_and_layer_norm() -> None:
    model = models.build("small_cnn", embedding_dim=8, normalize=False, layer_norm=False, seed=0)
    assert isinstance(model.head.norm, torch.nn.Identity)
    assert not torch.allclose(model(torch.rand(2, 1, 32, 32)).norm(dim=1), torch.ones(2))


def test_layer_norm_has_no_affine_parameters() -> None:
    model = models.build("small_cnn", embedding_dim=8, seed=0)
    assert list(model.head.norm.parameters()) == []


def test_seed_002_head_matches_its_formula_in_float64() -> None:
    """LayerNorm without parameters -> bias-free linear -> L2 normalisation (Zhai & Wu 2019 §3.2, §4.1)."""
    model = models.build("small_cnn", embedding_dim=64, bias=False, seed=1).double().eval()
    assert model.head.linear.bias is None
    images = torch.rand(3, 1, 32, 32, dtype=torch.float64)
    features = model.trunk(images)
    weight = model.head.linear.weight
    expected = []
    for row in features:
        centred = row - row.mean()
        standardised = centred / torch.sqrt((centred**2).mean() + 1e-5)
        projected = weight @ standardised
        expected.append(projected / projected.norm())
    torch.testing.assert_close(model(images), torch.stack(expected))


@pytest.mark.parametrize("dim", [64, 2048])
def test_embedding_sizes_of_the_seeds(dim: int) -> None:
    assert models.build("small_cnn", embedding_dim=dim, seed=0).eval()(torch.rand(2, 1, 16, 16)).shape == (2, dim)


def test_binarised_output_is_the_sign_at_evaluation_only() -> None:
    model = models.build("small_cnn", embedding_dim=32, binarize_output=True, freeze_bn=True, seed=0)
    reference = models.build("small_cnn", embedding_dim=32, freeze_bn=True, seed=0)
    images = torch.rand(5, 1, 16, 16)
    # Frozen BatchNorm makes the training-mode forward equal to the evaluation-mode one.
    floats = reference.train()(images)
    torch.testing.assert_close(model.train()(images), floats)
    bits = model.eval()(images)
    assert torch.equal(bits, torch.sign(floats) / math.sqrt(32))
    assert torch.equal(bits.abs(), torch.full_like(bits, 1 / math.sqrt(32)))


def test_max_pooling_takes_the_maximum_of_the_last_feature_map() -> None:
    trunk, _ = models.build_trunk("small_cnn", pooling="max")
    trunk.eval()
    images = torch.rand(2, 1, 32, 32)
    feature_map = trunk[:4](images)
    torch.testing.assert_close(trunk(images), feature_map.amax(dim=(2, 3)))
    with pytest.raises(UserInputError, match="model.pooling must be one of avg, max"):
        models.build_trunk("small_cnn", pooling="median")


def test_frozen_batchnorm_keeps_statistics_and_affine_parameters() -> None:
    model = models.build("small_cnn", embedding_dim=8, freeze_bn=True, seed=0)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in norms]
    model.train()
    assert all(not m.training and not any(p.requires_grad for p in m.parameters()) for m in norms)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(torch.rand(8, 1, 16, 16)).sum().backward()
    optimizer.step()
    for module, state in zip(norms, before):
        for key, value in module.state_dict().items():
            assert torch.equal(value, state[key]), key
    assert model.head.linear.weight.grad is not None


def test_bninception_follows_the_papers_table() -> None:
    """Ioffe & Szegedy 2015, Fig. 5: output depth of every inception module, 1024-d features."""
    network = BNInception()
    depths = [getattr(network, name).out_channels for name in (
        "inception_3a", "inception_3b", "inception_3c", "inception_4a", "inception_4b",
        "inception_4c", "inception_4d", "inception_4e", "inception_5a", "inception_5b",
    )]
    assert depths == [256, 320, 576, 576, 576, 608, 608, 1056, 1024, 1024]
    # About 10.3 M parameters without the classifier (11.3 M with ImageNet's 1000-way layer).
    assert 10.2e6 < sum(p.numel() for p in network.parameters()) < 10.4e6
    network.eval()
    with torch.no_grad():
        assert network(torch.rand(1, 3, 224, 224)).shape == (1, 1024, 7, 7)
        for size in (17, 24, 33):  # the branches line up for any input size
            assert network(torch.rand(1, 3, size, size)).shape[:2] == (1, 1024)


@pytest.mark.parametrize("trunk", ["bninception", "small_cnn", "timm/test_resnet"])
def test_weight_file_round_trip(trunk: str, tmp_path) -> None:
    """A trunk's state_dict saved to a local file loads into a new trunk that then computes the same."""
    options = {"in_channels": 3} if trunk == "small_cnn" else {}
    source, dim = models.build_trunk(trunk, **options)
    with torch.no_grad():
        for parameter in source.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.01)
    weights = tmp_path / "weights.pt"
    torch.save(source.state_dict(), weights)
    loaded, loaded_dim = models.build_trunk(trunk, pretrained=str(weights), **options)
    assert loaded_dim == dim
    images = torch.rand(2, 3, 40, 40)
    if trunk.startswith("timm/"):  # a file in timm's layout holds ImageNet weights: their standardisation comes first
        config = source.pretrained_cfg
        images_seen = (images - torch.tensor(config["mean"]).view(1, 3, 1, 1)) / torch.tensor(config["std"]).view(1, 3, 1, 1)
    else:
        images_seen = images
    torch.testing.assert_close(loaded.eval()(images), source.eval()(images_seen))


@pytest.mark.parametrize("trunk", ["resnet50", "googlenet"])
def test_torchvision_trunk_weight_file_round_trip(trunk: str, tmp_path) -> None:
    """A torchvision-format state_dict (with its classifier, and for googlenet its auxiliary heads)
    loads into the trunk."""
    import torchvision

    _, feature_dim = models.build_trunk(trunk)
    assert feature_dim == {"resnet50": 2048, "googlenet": 1024}[trunk]
    extra = {"aux_logits": True, "init_weights": True} if trunk == "googlenet" else {}
    reference_state = getattr(torchvision.models, trunk)(weights=None, **extra).state_dict()
    weights = tmp_path / "weights.pt"
    torch.save(reference_state, weights)
    loaded, _ = models.build_trunk(trunk, pretrained=str(weights))
    loaded_state = {key.removeprefix("network."): value for key, value in loaded.state_dict().items()}
    assert set(loaded_state) == {key for key in reference_state if not key.startswith(("fc.", "aux1.", "aux2."))}
    for key, value in loaded_state.items():
        torch.testing.assert_close(value, reference_state[key])


def test_imagenet_weights_see_their_standardised_inputs(tmp_path) -> None:
    """torchvision's ImageNet weights were trained on colours standardised by their mean and SD: the loaded
    trunk fed dmlbench's [0, 1] images gives exactly the features torchvision's network gives on the
    standardised images (before, the weights saw [0, 1] images)."""
    import torchvision

    torch.manual_seed(0)
    reference = torchvision.models.resnet50(weights=None)
    weights = tmp_path / "resnet50.pt"
    torch.save(reference.state_dict(), weights)
    reference.fc = torch.nn.Identity()
    loaded, _ = models.build_trunk("resnet50", pretrained=str(weights))
    images = torch.rand(2, 3, 64, 64)
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    torch.testing.assert_close(loaded.eval()(images), reference.eval()((images - mean) / std))
    random_weights, _ = models.build_trunk("resnet50")
    assert not any(isinstance(module, models.trunks.ImageNetInput) for module in random_weights.modules())


def test_pretrained_true_reads_torchvisions_hub_folder_and_offline_names_the_missing_file(tmp_path, monkeypatch) -> None:
    """The download itself: tests/test_pretrained_weights.py (a server on 127.0.0.1)."""
    import torchvision

    monkeypatch.setenv("DMLBENCH_OFFLINE", "1")
    # Through TORCH_HOME, not torch.hub.set_dir: set_dir cannot be undone, and later tests' TORCH_HOME
    # would be ignored in this process.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(UserInputError, match=r"resnet50\): offline: .*checkpoints/resnet50-0676ba61.pth is missing; download https://download.pytorch.org/"):
        models.build_trunk("resnet50", pretrained=True)
    state = torchvision.models.resnet50(weights=None).state_dict()
    name = torchvision.models.ResNet50_Weights.IMAGENET1K_V1.url.rsplit("/", 1)[1]
    torch.save(state, tmp_path / "hub" / "checkpoints" / name)  # the folder the offline message named
    loaded, _ = models.build_trunk("resnet50", pretrained=True)
    torch.testing.assert_close(loaded.state_dict()["network.conv1.weight"], state["conv1.weight"])


def test_pretrained_true_reads_timms_hugging_face_cache_only(tmp_path, monkeypatch) -> None:
    from huggingface_hub import constants
    from safetensors.torch import save_file

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(UserInputError, match="not in the Hugging Face cache .*huggingface-cli download timm/test_resnet"):
        models.build_trunk("timm/test_resnet", pretrained=True)
    source, _ = models.build_trunk("timm/test_resnet")
    repo = tmp_path / "models--timm--test_resnet.r160_in1k"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    state = {key: value + 1.0 if value.is_floating_point() else value for key, value in source.state_dict().items()}
    save_file(state, str(repo / "snapshots" / "abc123" / "model.safetensors"))
    loaded, _ = models.build_trunk("timm/test_resnet", pretrained=True)
    for key, value in loaded.state_dict().items():
        torch.testing.assert_close(value, state[key.removeprefix("network.")])
    config = source.pretrained_cfg  # its weights' own standardisation comes first
    torch.testing.assert_close(loaded.inputs.mean.flatten(), torch.tensor(config["mean"], dtype=torch.float32))


def test_timm_models_by_name_with_either_pooling() -> None:
    for pooling in ("avg", "max"):
        model = models.build("timm/test_vit", embedding_dim=16, pooling=pooling, seed=0).eval()
        assert model(torch.rand(2, 3, 160, 160)).shape == (2, 16)
    with pytest.raises(UserInputError, match="timm has no model 'no_such_net'"):
        models.build_trunk("timm/no_such_net")


def test_a_weight_file_of_another_architecture_is_one_clear_error(tmp_path) -> None:
    import torchvision

    weights = tmp_path / "resnet18.pt"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), weights)
    with pytest.raises(UserInputError) as error:
        models.build_trunk("resnet50", pretrained=str(weights))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"weights file {weights} does not fit trunk resnet50: ")
    assert "missing tensor(s)" in message and "of another shape" in message
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserInputError, match="cannot be read"):
        models.build_trunk("bninception", pretrained=str(tmp_path / "junk.pt"))
    torch.save({"model": {"weight": 1}}, tmp_path / "nested.pt")
    with pytest.raises(UserInputError, match="cannot be read|is not a state_dict"):
        models.build_trunk("bninception", pretrained=str(tmp_path / "nested.pt"))


def test_missing_weight_file_is_a_user_error(tmp_path) -> None:
    with pytest.raises(UserInputError, match="does not exist"):
        models.build_trunk("resnet50", pretrained=str(tmp_path / "nope.pt"))
    with pytest.raises(UserInputError, match="does not exist"):
        models.build_trunk("bninception", pretrained=str(tmp_path / "nope.pt"))


def test_grayscale_resnet_accepts_one_channel() -> None:
    model = models.build("resnet50", embedding_dim=8, in_channels=1, seed=0).eval()
    assert model(torch.rand(1, 1, 64, 64)).shape == (1, 8)


def test_ensemble_concatenates_independent_members() -> None:
    """DREML with one network per learner: member k's embedding is chunk k."""
    model = models.build("small_cnn", embedding_dim=24, ensemble=3, seed=0).eval()
    images = torch.rand(4, 1, 16, 16)
    out = model(images)
    assert out.shape == (4, 24) and model.embedding_dim == 24
    for k, member in enumerate(model.members):
        torch.testing.assert_close(out[:, 8 * k : 8 * (k + 1)], member(images))
    first, second = (member.trunk[0][0].weight for member in model.members[:2])
    assert not torch.equal(first, second)
    assert len(model.trunk_parameters()) == 3 * len(model.members[0].trunk_parameters())
    with pytest.raises(UserInputError, match="not divisible by model.ensemble=5"):
        models.build("small_cnn", embedding_dim=24, ensemble=5)


def test_bad_embedding_dim() -> None:
    with pytest.raises(UserInputError, match="embedding_dim"):
        models.build("small_cnn", embedding_dim=0)


def test_cli_trains_a_real_backbone_and_refuses_a_wrong_weight_file(tmp_path, capsys) -> None:
    import torchvision
    from cli_runner import run_cli
    from training_fixtures import TINY

    config = tmp_path / "run.yaml"
    config.write_text("seed: 0\n")
    base = ["train", str(config), *TINY, "training.epochs=1", "training.max_steps_per_epoch=1", "training.batch_size=16",
            "model.options={in_channels: 1}", "model.freeze_bn=true", "-q"]
    code, out, err = run_cli([*base, "model.trunk=bninception", "-o", str(tmp_path / "ok")], capsys)
    assert code == 0, err
    weights = tmp_path / "googlenet.pt"
    torch.save(torchvision.models.googlenet(weights=None, aux_logits=False, init_weights=False).state_dict(), weights)
    code, out, err = run_cli([*base, "model.trunk=resnet50", f"model.pretrained={weights}", "-o", str(tmp_path / "bad")], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"dmlbench: error: weights file {weights} does not fit trunk resnet50")
    assert not (tmp_path / "bad").exists()
    code, out, err = run_cli([*base, "training.precision=fp16", "training.device=cpu", "-o", str(tmp_path / "fp16")], capsys)
    assert code == 2 and err.count("\n") == 1 and "fp16 needs a CUDA or MPS device" in err


def test_imagenet_googlenet_sees_a_grey_image_as_three_equal_colours(tmp_path) -> None:
    """torchvision's transform_input re-normalises each colour of ImageNet GoogLeNet's input; a grey image
    (in_channels 1) is shown as three equal colours, giving exactly the features of that colour image
    (it raised IndexError before), and 2 channels are a one-line error."""
    import torchvision

    from dmlbench.errors import UserInputError

    torch.manual_seed(0)
    reference = torchvision.models.googlenet(weights=None, aux_logits=False, init_weights=True, transform_input=True)
    weights = tmp_path / "googlenet.pt"
    torch.save(reference.state_dict(), weights)
    reference.fc = torch.nn.Identity()
    grey, _ = models.build_trunk("googlenet", in_channels=1, pretrained=str(weights))
    images = torch.rand(2, 1, 64, 64)
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    torch.testing.assert_close(grey.eval()(images), reference.eval()((images.expand(-1, 3, -1, -1) - mean) / std))
    with pytest.raises(UserInputError, match="in_channels=2"):
        models.build_trunk("googlenet", in_channels=2, pretrained=str(weights))
