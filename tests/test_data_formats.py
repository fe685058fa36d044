"""The file formats on replicas of their exact on-disk layouts: counts, declared splits, labels, roles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import replicas
from dmlbench import data
from dmlbench.data.files import FileDataset
from dmlbench.data.splits import standard_splits, train_test_split
from dmlbench.errors import UserInputError
from dmlbench.protocol.design.folds import development_and_test_classes

# format -> (images, classes, train items, test items, roles present)
EXPECTED = {
    "cub200": (12, 4, 6, 6, False),
    "cars196": (12, 4, 6, 6, False),
    "sop": (10, 5, 6, 4, False),
    "inshop": (11, 5, 4, 7, True),
    "folder": (12, 4, 6, 6, False),
    "csv": (8, 4, 4, 4, True),
}


@pytest.fixture(scope="module")
def replica_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("replicas")
    return {name: builder(root) for name, builder in replicas.BUILDERS.items()}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_replica_counts_splits_and_labels(name: str, replica_roots: dict[str, Path]) -> None:
    images, classes, train_items, test_items, has_roles = EXPECTED[name]
    dataset = data.build(name, root=str(replica_roots[name]), image_size=16)
    assert isinstance(dataset, FileDataset)
    assert len(dataset) == images and len(dataset.class_names) == classes
    pool, test = train_test_split(dataset)
    assert (len(pool), len(test)) == (train_items, test_items)
    labels = dataset.labels.numpy()
    assert not set(labels[pool]) & set(labels[test])  # class-disjoint
    assert (dataset.roles is not None) == has_roles
    batch, batch_labels, index = dataset.batch(np.arange(len(dataset)))
    assert batch.shape == (images, 3, 16, 16) and batch.dtype == torch.float32
    assert 0.0 <= float(batch.min()) and float(batch.max()) <= 1.0
    assert torch.equal(batch_labels, dataset.labels) and torch.equal(index, torch.arange(images))
    development, test_classes = development_and_test_classes(dataset)
    assert set(development) == set(labels[pool]) and set(test_classes) == set(labels[test])


def test_declared_split_overrides_the_first_half_rule(replica_roots: dict[str, Path]) -> None:
    dataset = data.build("sop", root=str(replica_roots["sop"]), image_size=16)
    labels = dataset.labels.numpy()
    # SOP replica: 3 train classes and 2 test classes, the real file split; the first-half rule would give 3/2 too
    # but by sorted id; the declared split must match the files exactly.
    pool, test = train_test_split(dataset)
    assert sorted(set(labels[test])) == [3, 4]
    splits = standard_splits(dataset, 0.34, seed=0)
    assert np.array_equal(np.sort(splits.test), test)
    assert len(splits.train) + len(splits.validation) == len(pool)


def test_cub_labels_and_class_names(replica_roots: dict[str, Path]) -> None:
    dataset = data.build("cub200", root=str(replica_roots["cub200"]), image_size=16)
    assert dataset.class_names == ["001.Bird_1", "002.Bird_2", "101.Bird_101", "102.Bird_102"]
    assert dataset.paths[0].name == "Bird_1_0.jpg"


def test_cars_reads_the_mat_file(replica_roots: dict[str, Path]) -> None:
    dataset = data.build("cars196", root=str(replica_roots["cars196"]), image_size=16)
    assert dataset.class_names == ["Car model 1", "Car model 2", "Car model 99", "Car model 100"]
    assert dataset.paths[3].relative_to(replica_roots["cars196"]).as_posix() == "car_ims/000004.jpg"


def test_inshop_and_csv_roles(replica_roots: dict[str, Path]) -> None:
    inshop = data.build("inshop", root=str(replica_roots["inshop"]), image_size=16)
    assert inshop.roles.tolist() == ["", "", "", "", "query", "gallery", "gallery", "query", "query", "gallery", "gallery"]
    assert inshop.class_names[0] == "id_00000001"
    table = data.build("csv", root=str(replica_roots["csv"]), image_size=16)
    assert table.class_names == ["a", "b", "c", "d"]
    assert table.roles.tolist() == ["", "", "", "", "query", "gallery", "query", "gallery"]
    subset = table.subset([6, 4])
    assert subset.roles.tolist() == ["query", "query"] and subset.source_indices.tolist() == [6, 4]


def test_evaluation_view_is_resize_then_centre_crop(tmp_path: Path) -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (20, 40, 3), dtype=np.uint8)
    (tmp_path / "only").mkdir()
    Image.fromarray(pixels).save(tmp_path / "only" / "a.png")
    Image.fromarray(pixels).save(tmp_path / "only" / "b.png")
    (tmp_path / "other").mkdir()
    Image.fromarray(pixels[::-1].copy()).save(tmp_path / "other" / "c.png")
    dataset = data.build("folder", root=str(tmp_path), image_size=14)  # base side 16
    image = dataset.batch([0])[0][0]
    resized = np.asarray(Image.fromarray(pixels).resize((32, 16), Image.Resampling.BILINEAR))
    # 32x16 -> centre 16x16 base (left 8) -> centre 14x14 (top 1, left 1).
    expected = torch.from_numpy(resized[1:15, 9:23].copy()).permute(2, 0, 1).float() / 255
    assert torch.equal(image, expected)


def test_content_hash_follows_listing_and_size(replica_roots: dict[str, Path], tmp_path: Path) -> None:
    root = replicas.folder(tmp_path)
    first = data.build("folder", root=str(root), image_size=16).content_hash
    assert data.build("folder", root=str(root), image_size=16).content_hash == first
    assert data.build("folder", root=str(root), image_size=24).content_hash != first
    replicas.write_image(root / "class_0" / "extra.png", 99)
    assert data.build("folder", root=str(root), image_size=16).content_hash != first


@pytest.mark.parametrize(
    ("name", "make", "message"),
    [
        ("cub200", lambda root: (root / "images.txt").write_text("1 a.jpg\n"), "has no image_class_labels.txt (it should hold lines '<image_id> <class_id 1-200>')"),
        ("cub200", lambda root: None, "has no images.txt"),
        ("cars196", lambda root: None, "has no cars_annos.mat"),
        ("sop", lambda root: (root / "Ebay_train.txt").write_text("h\n"), "has no Ebay_test.txt"),
        ("inshop", lambda root: None, "has no list_eval_partition.txt"),
        ("folder", lambda root: None, "has no class sub-folders"),
    ],
)
def test_missing_file_names_it_and_its_contents(name: str, make, message: str, tmp_path: Path) -> None:
    make(tmp_path)
    with pytest.raises(UserInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        data.build(name, root=str(tmp_path))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("file,label\na.png,1\n", "has no column 'path'"),
        ("path\na.png\n", "has no column 'label'"),
        ("path,label,split\na.png,1,val\n", "split must be train or test, got 'val'"),
        ("path,label,role\na.png,1,probe\n", "role must be query or gallery, got 'probe'"),
        ("path,label,split,role\na.png,1,train,query\n", "belongs to the test split"),
        ("path,label,colour\na.png,1,red\n", "unknown column 'colour'"),
    ],
)
def test_bad_csv_is_one_clear_error(text: str, message: str, tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text(text)
    with pytest.raises(UserInputError, match=message):
        data.build("csv", root=str(tmp_path / "data.csv"))


def test_missing_root_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="set data.root"):
        data.build("folder")
    with pytest.raises(UserInputError, match="is not a directory"):
        data.build("sop", root=str(tmp_path / "absent"))


@pytest.mark.parametrize("shape", [(24, 24), (24, 24, 3)], ids=["grey", "colour"])
def test_a_16_bit_png_decodes_as_its_8_bit_image(shape: tuple[int, ...], tmp_path: Path) -> None:
    """A 16-bit grey PNG once decoded as white (Pillow's conversion clips 16-bit grey); both depths keep the
    high byte, as Pillow reads 16-bit colour, so the 16-bit file and its 8-bit twin train on the same pixels."""
    from dmlbench.deploy.images import decode

    rng = np.random.default_rng(0)
    deep = rng.integers(0, 65536, shape).astype(np.uint16)
    replicas.write_png16(tmp_path / "deep" / "a" / "0.png", deep)
    shallow = (deep >> 8).astype(np.uint8)
    (tmp_path / "shallow" / "a").mkdir(parents=True)
    Image.fromarray(shallow).save(tmp_path / "shallow" / "a" / "0.png")
    channels = 1 if len(shape) == 2 else 3
    torch.testing.assert_close(decode(tmp_path / "deep" / "a" / "0.png", channels),
                               decode(tmp_path / "shallow" / "a" / "0.png", channels), rtol=0, atol=0)
    assert decode(tmp_path / "deep" / "a" / "0.png", channels).float().mean() < 200  # not the white it once was
    images = [data.build("folder", root=str(tmp_path / name), image_size=16) for name in ("deep", "shallow")]
    torch.testing.assert_close(images[0].batch([0])[0], images[1].batch([0])[0], rtol=0, atol=0)
