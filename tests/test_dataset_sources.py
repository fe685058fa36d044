"""A dataset is one module: its constructor and its ``DatasetSource`` registered together (``register_dataset``);
``data.root``, ``data check --root``, ``data fetch`` and the messages that list the datasets read from files
follow the descriptor, with no list of names to extend elsewhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dmlbench import config as config_module
from dmlbench import data
from dmlbench.data import base
from dmlbench.errors import UserInputError
from dmlbench.training.setup import load_dataset

# A dataset decoded from a folder (like emoji): eight 8x8 tiles per class, one class per line of ROOT/classes.txt.
PLUGIN = '''
import torch
import dmlbench
from dmlbench.data import DatasetSource, ImageDataset


@dmlbench.register_dataset("tiles", source=DatasetSource("rooted", terms="drawn for this test"))
def tiles(root=None, seed=0):
    from pathlib import Path

    names = (Path(root) / "classes.txt").read_text().split()
    labels = torch.arange(len(names)).repeat_interleave(8)
    generator = torch.Generator().manual_seed(seed)
    images = (torch.rand(len(labels), 1, 8, 8, generator=generator) * 255).to(torch.uint8)
    return ImageDataset(images, labels, names, name="tiles")
'''


def test_the_built_in_datasets_say_how_they_are_read_and_fetched() -> None:
    kinds = {name: (data.dataset_source(name).kind, data.dataset_source(name).fetch) for name in data.DATASETS.names()}
    assert kinds == {"glyphs": ("memory", None), "emoji": ("rooted", "npm"), "folder": ("files", None), "csv": ("files", None),
                     **{name: ("files", "archives") for name in ("cub200", "cars196", "sop", "inshop")}}
    assert data.rooted_datasets() == ["cars196", "csv", "cub200", "emoji", "folder", "inshop", "sop"]
    assert "Apache-2.0" in data.dataset_source("emoji").terms and data.dataset_source("cub200").terms


def test_a_dataset_registered_without_a_source_takes_no_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """``DATASETS.register`` alone (a plugin written before sources existed) is a ``memory`` dataset:
    ``data.root`` is refused with one line that lists the datasets it is for."""
    monkeypatch.setattr(base.DATASETS, "_constructors", dict(base.DATASETS._constructors))
    base.DATASETS.register("plain")(lambda seed=0: data.build("glyphs", max_classes=4, image_size=8))
    config = config_module.from_dict({"data": {"name": "plain", "root": "/anywhere"}})
    with pytest.raises(UserInputError, match=r"data.root is for the datasets read from files \(cars196, .*\), not 'plain'"):
        load_dataset(config)


def test_a_new_rooted_dataset_is_one_module_and_reads_its_root(tmp_path: Path) -> None:
    (tmp_path / "tiles.py").write_text(PLUGIN)
    root = tmp_path / "tiles-data"
    root.mkdir()
    (root / "classes.txt").write_text("\n".join(f"class{index}" for index in range(6)))
    command = [sys.executable, "-m", "dmlbench", "--plugin", str(tmp_path / "tiles.py"), "data", "check", "tiles"]
    checked = subprocess.run([*command, "--root", str(root)], capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith("dataset        tiles  (48 images of shape 1x8x8)\n"), checked.stdout
    missing = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert (missing.returncode, missing.stderr) == (2, "dmlbench: error: dataset 'tiles' reads files: give --root PATH\n")
    glyphs = subprocess.run([sys.executable, "-m", "dmlbench", "--plugin", str(tmp_path / "tiles.py"), "data", "check",
                             "glyphs", "--root", str(root)], capture_output=True, text=True, timeout=300)
    assert glyphs.returncode == 2 and "(cars196, csv, cub200, emoji, folder, inshop, sop, tiles), not 'glyphs'" in glyphs.stderr
