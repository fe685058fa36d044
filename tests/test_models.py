import pytest
import torch

from dmlbench import models
from dmlbench.errors import UserInputError


def test_small_cnn_embeddings_are_unit_norm_and_seeded() -> None:
    first = models.build("small_cnn", embedding_dim=16, seed=3)
    second = models.build("small_cnn", embedding_dim=16, seed=3)
    images = torch.rand(4, 1, 32, 32)
    first.eval(), second.eval()
    out = first(images)
    assert out.shape == (4, 16)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(4))
    torch.testing.assert_close(out, second(images))


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


@pytest.mark.parametrize("trunk", ["resnet50", "googlenet"])
def test_torchvision_trunk_weight_file_round_trip(trunk: str, tmp_path) -> None:
    """A torchvision-format state_dict saved locally loads into the trunk (its classifier is dropped)."""
    import torchvision

    _, feature_dim = models.TRUNKS.build(trunk)
    assert feature_dim == {"resnet50": 2048, "googlenet": 1024}[trunk]
    extra = {"aux_logits": False, "init_weights": True} if trunk == "googlenet" else {}
    reference_state = getattr(torchvision.models, trunk)(weights=None, **extra).state_dict()
    weights = tmp_path / "weights.pt"
    torch.save(reference_state, weights)
    loaded, _ = models.TRUNKS.build(trunk, weights_path=str(weights))
    loaded_state = loaded.state_dict()
    assert set(loaded_state) == {key for key in reference_state if not key.startswith("fc.")}
    for key, value in loaded_state.items():
        torch.testing.assert_close(value, reference_state[key])


def test_missing_weight_file_is_a_user_error(tmp_path) -> None:
    with pytest.raises(UserInputError, match="does not exist"):
        models.TRUNKS.build("resnet50", weights_path=str(tmp_path / "nope.pt"))


def test_grayscale_resnet_accepts_one_channel() -> None:
    model = models.build("resnet50", embedding_dim=8, in_channels=1, seed=0).eval()
    assert model(torch.rand(1, 1, 64, 64)).shape == (1, 8)


def test_bad_embedding_dim() -> None:
    with pytest.raises(UserInputError, match="embedding_dim"):
        models.build("small_cnn", embedding_dim=0)
