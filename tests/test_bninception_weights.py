"""BN-Inception's ImageNet weights, Cadene's conversion of the Caffe model: renamed onto dmlbench's
``BNInception``, which then computes what the reference implementation (pretrainedmodels 0.7.4, random
seeded weights) computes from the same image; ``model.pretrained: true`` downloads the file into torch's
hub folder from a server on 127.0.0.1 (``DMLBENCH_MIRROR``), checks the sha256 prefix its name carries
and records the hash in run.json; ``--offline`` names the file; image sizes the Caffe pooling cannot
take are one line before a run starts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import torchvision

import cadene_weights
import replicas
from cli_runner import run_cli
from fetch_server import Served, server  # noqa: F401  (server: a fixture)

from dmlbench.errors import UserInputError
from dmlbench.models import build_trunk
from dmlbench.models.bninception import BNInception, CaffeInput, cadene_state_dict


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    return cadene_weights.reference_network(seed=0)


@pytest.mark.parametrize("size", [224, 227])
def test_the_converted_weights_compute_the_reference_features(reference: torch.nn.Module, size: int,
                                                              tmp_path: Path) -> None:
    """dmlbench's input (RGB in [0, 1]) through ``CaffeInput`` and the trunk, against pretrainedmodels'
    own preprocessing (BGR, 0-255, ``Normalize(mean, std=1)``) and network: the same last feature map,
    bit for bit, and pooled features within 1e-5 (AvgPool2d(7) and global pooling sum in another order)."""
    torch.save(reference.state_dict(), tmp_path / cadene_weights.OFFICIAL_NAME)
    trunk, dim = build_trunk("bninception", pretrained=str(tmp_path / cadene_weights.OFFICIAL_NAME))
    trunk.eval()
    pixels = torch.randint(0, 256, (2, 3, size, size), generator=torch.Generator().manual_seed(size), dtype=torch.uint8)
    ours = pixels.to(torch.float32) / 255.0  # what every dmlbench reader returns
    theirs = torchvision.transforms.Normalize([104, 117, 128], [1, 1, 1])(ours[:, [2, 1, 0]] * 255)
    with torch.no_grad():
        expected_map = reference.features(theirs)
        expected = reference.global_pool(expected_map).flatten(1)
        assert torch.equal(trunk.features(trunk.inputs(ours)), expected_map)
        features = trunk(ours)
    assert dim == 1024 and features.shape == (2, 1024) and expected_map.shape[-2:] == (7, 7)
    assert expected.std() > 1.0  # not a comparison of near-zero numbers
    torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-5)


def test_every_tensor_of_the_layout_finds_its_place(reference: torch.nn.Module) -> None:
    state = reference.state_dict()
    converted = cadene_state_dict(state)
    target = BNInception(caffe_pooling=True).state_dict()
    assert converted.keys() == target.keys()
    assert all(converted[key].shape == target[key].shape for key in target)
    for theirs, ours in [("conv1_7x7_s2.weight", "conv1_7x7_s2.0.weight"), ("conv2_3x3_reduce_bn.bias", "conv2_3x3_reduce.1.bias"),
                         ("inception_3a_1x1.weight", "inception_3a.ones.0.weight"),
                         ("inception_3a_1x1_bn.running_var", "inception_3a.ones.1.running_var"),
                         ("inception_3c_3x3_reduce.bias", "inception_3c.branch3.0.0.bias"),
                         ("inception_4e_3x3_bn.weight", "inception_4e.branch3.1.1.weight"),
                         ("inception_4a_double_3x3_reduce.weight", "inception_4a.double3.0.0.weight"),
                         ("inception_4d_double_3x3_1_bn.running_mean", "inception_4d.double3.1.1.running_mean"),
                         ("inception_5a_double_3x3_2.weight", "inception_5a.double3.2.0.weight"),
                         ("inception_5b_pool_proj_bn.bias", "inception_5b.pool.1.1.bias")]:
        assert torch.equal(converted[ours], state[theirs]), theirs
    assert not any(key.startswith("last_linear") for key in converted)


def test_the_file_as_old_torch_wrote_it_loads_the_same(reference: torch.nn.Module, tmp_path: Path) -> None:
    """BatchNorm vectors stored as [1, C], no num_batches_tracked, torch's legacy (pre-zip) format."""
    modern, old = tmp_path / "modern.pth", tmp_path / "old.pth"
    state = reference.state_dict()
    torch.save(state, modern)
    legacy = {key: value.unsqueeze(0) if "_bn." in key and value.dim() == 1 else value
              for key, value in state.items() if not key.endswith("num_batches_tracked")}
    torch.save(legacy, old, _use_new_zipfile_serialization=False)
    loaded = [build_trunk("bninception", pretrained=str(path))[0].state_dict() for path in (modern, old)]
    assert loaded[0].keys() == loaded[1].keys()
    assert all(torch.equal(loaded[0][key], loaded[1][key]) for key in loaded[0])


def test_a_damaged_cadene_file_is_one_line_naming_the_tensor(reference: torch.nn.Module, tmp_path: Path) -> None:
    state = dict(reference.state_dict())
    del state["inception_4b_3x3_bn.running_var"]
    torch.save(state, tmp_path / "cut.pth")
    expected = r"does not fit trunk bninception: 1 missing tensor\(s\), e.g. 'inception_4b.branch3.1.1.running_var'"
    with pytest.raises(UserInputError, match=expected):
        build_trunk("bninception", pretrained=str(tmp_path / "cut.pth"))


def test_caffe_pooling_takes_224_and_227_and_refuses_odd_maps_in_one_line() -> None:
    network = BNInception(caffe_pooling=True).eval()
    default = BNInception().eval()
    assert default.inception_3c.pool.padding == 1 and network.inception_3c.pool.padding == 0  # nothing committed changes
    with torch.no_grad():
        for size in (224, 227):
            assert network(torch.rand(1, 3, size, size)).shape == (1, 1024, 7, 7)
            assert network.input_size_error(size, size) is None
        with pytest.raises(UserInputError, match=r"^bninception with Cadene's ImageNet weights .* the map entering "
                                                  r"inception_3c is 5x5, its sides must be even; set data.image_size") as raised:
            network(torch.rand(1, 3, 40, 40))
        assert "\n" not in str(raised.value)
        for size in (31, 38, 39, 41, 48, 63, 71, 95, 299):  # the sizes alone tell what the network does
            predicted = network.input_size_error(size, 224)
            try:
                network(torch.rand(1, 3, size, 224))
            except UserInputError as error:
                assert predicted is not None and str(predicted) == str(error), size
            else:
                assert predicted is None, size
    assert default.input_size_error(40, 40) is None


def test_the_input_adapter_is_exact_fixed_and_stateless() -> None:
    rgb = torch.tensor([1.0, 0.5, 0.0]).view(1, 3, 1, 1)
    assert CaffeInput()(rgb).flatten().tolist() == [0.0 - 104.0, 127.5 - 117.0, 255.0 - 128.0]
    assert CaffeInput(1)(torch.ones(1, 1, 1, 1)).item() == pytest.approx(255.0 - 349.0 / 3)
    assert CaffeInput().state_dict() == {} and not list(CaffeInput().parameters())


def test_grey_images_through_the_imagenet_weights(reference: torch.nn.Module, tmp_path: Path) -> None:
    torch.save(reference.state_dict(), tmp_path / "weights.pth")
    trunk, _ = build_trunk("bninception", in_channels=1, pretrained=str(tmp_path / "weights.pth"))
    assert trunk.eval()(torch.rand(2, 1, 64, 64)).shape == (2, 1024)


def _train(tmp_path: Path, *extra: str, size: int = 32) -> list[str]:
    data_root = replicas.cub200(tmp_path / "replica", classes=8, per_class=4)
    return [*extra, "train", "configs/glyphs.yaml", "data.name=cub200", f"data.root={data_root}", f"data.image_size={size}",
            "data.options={workers: 1}", "data.validation_fraction=0.5", "model.embedding_dim=16", "training.epochs=1",
            "training.batch_size=8", "evaluation.metrics=[map_at_r]", "model.trunk=bninception", "model.pretrained=true",
            "model.freeze_bn=true", "-o", str(tmp_path / "run"), "-q"]


def test_pretrained_true_downloads_cadenes_file_and_run_json_records_its_hash(
        server: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    folder = cadene_weights.hub_folder(tmp_path, monkeypatch)
    data = cadene_weights.weight_file(tmp_path / "weights.pth")
    name = cadene_weights.name_carrying_its_hash(data, monkeypatch)
    server.files[name] = data
    monkeypatch.setenv("DMLBENCH_MIRROR", server.url)
    code, _, err = run_cli(_train(tmp_path), capsys)
    assert code == 0, err
    assert (folder / name).read_bytes() == data
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["pretrained_weights"]
    assert recorded == {"file": name, "sha256": hashlib.sha256(data).hexdigest()}
    assert [asked for asked, _ in server.requests] == [name]


def test_a_file_whose_sha256_does_not_start_with_the_official_names_prefix_is_refused(
        server: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Under the real name, a file that is not Cadene's (here the test's random weights) fails the check."""
    folder = cadene_weights.hub_folder(tmp_path, monkeypatch)
    server.files[cadene_weights.OFFICIAL_NAME] = cadene_weights.weight_file(tmp_path / "weights.pth")
    monkeypatch.setenv("DMLBENCH_MIRROR", server.url)
    code, _, err = run_cli(_train(tmp_path), capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "model.pretrained=true (bninception)" in err and "does not start with the 52deb4733 its name carries" in err
    assert not folder.is_dir() or not list(folder.iterdir())
    assert [asked for asked, _ in server.requests] == [cadene_weights.OFFICIAL_NAME]


def test_offline_names_cadenes_file_and_its_address(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    folder = cadene_weights.hub_folder(tmp_path, monkeypatch)
    code, _, err = run_cli(_train(tmp_path, "--offline"), capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert (f"offline: {folder / cadene_weights.OFFICIAL_NAME} is missing; download "
            f"http://data.lip6.fr/cadene/pretrainedmodels/{cadene_weights.OFFICIAL_NAME} and place it there by hand") in err


def test_an_image_size_the_caffe_pooling_cannot_take_is_refused_before_the_run_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    folder = cadene_weights.hub_folder(tmp_path, monkeypatch)
    folder.mkdir(parents=True)
    data = cadene_weights.weight_file(tmp_path / "weights.pth")
    (folder / cadene_weights.name_carrying_its_hash(data, monkeypatch)).write_bytes(data)
    code, _, err = run_cli(_train(tmp_path, "--offline", size=40), capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "the map entering inception_3c is 5x5, its sides must be even" in err
    assert not (tmp_path / "run").exists()
