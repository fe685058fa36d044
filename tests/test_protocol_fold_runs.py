"""Training restricted to a fold's explicit classes (data.train_classes / data.val_classes)."""

import json
from pathlib import Path

import pytest
import torch

from dmlbench import config as config_module
from dmlbench.errors import UserInputError
from dmlbench.protocol.design.folds import fold_layout
from dmlbench.training import loop, train
from dmlbench.training.setup import load_dataset, make_splits, training_view
from training_fixtures import TINY

torch.set_num_threads(1)


def tiny_config(*overrides: str) -> config_module.Config:
    return config_module.load(None, [*TINY, "training.epochs=1", "sampler.params={samples_per_class: 4}", *overrides])


def fold_overrides(fold) -> list[str]:
    return [f"data.train_classes={list(fold.train_classes)}", f"data.val_classes={list(fold.val_classes)}"]


def test_fold_run_trains_and_validates_on_exactly_the_fold_classes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tiny_config()
    dataset = load_dataset(config)
    layout = fold_layout(dataset.labels, k=2)
    fold = layout.folds[1]
    seen_labels: list[set[int]] = []
    real_validate = loop._validate

    def spy(source, *args, **kwargs):
        seen_labels.append(set(source.setup.validation_set.labels.tolist()))
        return real_validate(source, *args, **kwargs)

    monkeypatch.setattr(loop, "_validate", spy)
    result = train(tiny_config(*fold_overrides(fold)), tmp_path / "run", progress=False,
                   record={"method": "m", "stage": "search", "trial": 3, "fold": 1})
    record = json.loads((result.run_dir / "run.json").read_text())
    assert record["status"] == "completed"
    assert record["train_classes"] == list(fold.train_classes)
    assert record["val_classes"] == list(fold.val_classes)
    assert (record["method"], record["stage"], record["trial"], record["fold"]) == ("m", "search", 3, 1)
    assert record["dataset"]["content_hash"] == dataset.content_hash
    assert all(labels == set(fold.val_classes) for labels in seen_labels)


def test_training_view_holds_no_test_item() -> None:
    config = tiny_config()
    dataset = load_dataset(config)
    splits = make_splits(config, dataset)
    view, view_splits = training_view(dataset, splits)
    assert len(view) == len(splits.train) + len(splits.validation) and len(view_splits.test) == 0
    test_classes = set(dataset.labels[splits.test].tolist())
    assert not set(view.labels.tolist()) & test_classes
    assert torch.equal(view.labels[view_splits.train], dataset.labels[splits.train])
    assert torch.equal(view.images[view_splits.validation], dataset.images[splits.validation])


def test_a_test_class_is_refused(tmp_path: Path) -> None:
    config = tiny_config()
    layout = fold_layout(load_dataset(config).labels, k=2)
    bad = tiny_config(f"data.train_classes={list(layout.folds[0].train_classes)}",
                      f"data.val_classes={[layout.test_classes[0]]}")
    with pytest.raises(UserInputError, match=f"class {layout.test_classes[0]} is a test class"):
        train(bad, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.train_classes=[0, 1]"], "must be given together"),
        (["data.train_classes=[0, 1]", "data.val_classes=[1, 2]"], "share class 1"),
        (["data.train_classes=[]", "data.val_classes=[1, 2]"], "must not be empty"),
        (["data.train_classes=[0, 0]", "data.val_classes=[1, 2]"], "must not repeat"),
    ],
)
def test_explicit_classes_are_checked(overrides: list[str], message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        tiny_config(*overrides)


def test_an_unknown_class_is_refused() -> None:
    config = tiny_config("data.train_classes=[0, 1]", "data.val_classes=[100000]")
    with pytest.raises(UserInputError, match="class 100000 is not a class"):
        make_splits(config, load_dataset(config))
