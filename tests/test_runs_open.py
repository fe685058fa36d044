"""A finished run opened once (``training.runs.Run``): every use of an opened run shares one load of
its dataset, gives what opening the run for each use gives, and a reproduction opens each fold run
once."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import optuna
import pytest
import torch

from dmlbench import config as config_module
from dmlbench.data.base import ImageDataset
from dmlbench.errors import UserInputError
from dmlbench.training import runs, train
from dmlbench.training.placement import STANDALONE, Placement
from dmlbench.training.run_evaluation import evaluate_run
from dmlbench.training.runs import Run, embed_run, embed_test_split, run_test_domains
from protocol_fixtures import benchmark_spec, reproduce
from training_fixtures import TINY

torch.set_num_threads(1)
optuna.logging.set_verbosity(logging.WARNING)

FAST = [*TINY, "sampler.params={samples_per_class: 4}", "training.epochs=1", "training.max_steps_per_epoch=2"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("opened") / "run"
    train(config_module.load(None, FAST), directory, progress=False)
    return directory


def _count_dataset_loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often ``training.runs`` loads a run's dataset from here on."""
    loads = [0]
    original = runs.load_dataset

    def counted(config: config_module.Config) -> ImageDataset:
        loads[0] += 1
        return original(config)

    monkeypatch.setattr(runs, "load_dataset", counted)
    return loads


def test_every_use_of_an_opened_run_shares_one_dataset_load_and_equals_a_fresh_open(
        run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loads = _count_dataset_loads(monkeypatch)
    run = Run.open(run_dir)
    assert loads == [0]  # the record and config only: a stored evaluation needs no dataset
    opened = {"train": embed_run(run, "train"), "validation": embed_run(run, "validation"),
              "test": embed_test_split(run), "untrained": embed_test_split(run, untrained=True)}
    mask, domains = runs.test_query_mask(run), run_test_domains(run)
    assert loads == [1]
    fresh = {"train": embed_run(run_dir, "train"), "validation": embed_run(run_dir, "validation"),
             "test": embed_test_split(run_dir), "untrained": embed_test_split(run_dir, untrained=True)}
    assert loads == [5]  # a run directory is opened again by each call
    for name, (embeddings, labels) in opened.items():
        assert torch.equal(embeddings, fresh[name][0]) and torch.equal(labels, fresh[name][1]), name
    assert mask is None and runs.test_query_mask(run_dir) is None  # glyphs declare no query/gallery roles
    assert domains is None and run_test_domains(run_dir) is None
    # The splits are class-disjoint and the test split is the one evaluate_run scores.
    train_classes, test_classes = set(opened["train"][1].tolist()), set(opened["test"][1].tolist())
    assert train_classes and test_classes and not train_classes & test_classes


def test_a_stored_evaluation_is_read_without_loading_the_dataset(run_dir: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "run"
    copy.mkdir()
    for path in run_dir.iterdir():
        if path.is_file():
            (copy / path.name).write_bytes(path.read_bytes())
    first = evaluate_run(copy)
    loads = _count_dataset_loads(monkeypatch)
    assert evaluate_run(Run.open(copy)) == first
    assert loads == [0]
    assert evaluate_run(copy, ks=(1, 2)) != first  # other options: evaluated anew, from one load
    assert loads == [1]


def test_open_refuses_an_unfinished_run_and_first_use_a_changed_dataset(run_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    copy.mkdir()
    for path in run_dir.iterdir():
        if path.is_file():
            (copy / path.name).write_bytes(path.read_bytes())
    record = json.loads((copy / "run.json").read_text())
    (copy / "run.json").write_text(json.dumps({**record, "status": "interrupted"}))
    with pytest.raises(UserInputError, match="not completed"):
        Run.open(copy)
    changed = {**record, "dataset": {**record["dataset"], "content_hash": "0" * 64}}
    (copy / "run.json").write_text(json.dumps(changed))
    run = Run.open(copy)
    with pytest.raises(UserInputError, match="differs from the one run"):
        embed_test_split(run)
    with pytest.raises(UserInputError, match="does not exist"):
        Run.open(tmp_path / "missing")


def test_a_reproduction_opens_each_fold_run_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    original = Run.__dict__["open"].__func__

    def counted(cls: type[Run], run_dir: str | Path, placement: Placement = STANDALONE) -> Run:
        opened.append(Path(run_dir).name)
        return original(cls, run_dir, placement)

    monkeypatch.setattr(Run, "open", classmethod(counted))
    loads = _count_dataset_loads(monkeypatch)
    spec = benchmark_spec(config_module.apply_overrides({}, list(FAST)),
                          {"name": "triplet", "overrides": {"loss.name": "triplet"}},
                          reproductions=2, first_seed=5, folds=2, epochs=1)
    reproduced = reproduce(spec, tmp_path, "triplet", {"loss.params.margin": 0.3})
    assert all(outcome.scores is not None for outcome in reproduced.outcomes)
    # 2 reproductions x 2 folds; opening a run for every read took 2 x (2 folds + 2 + 2 folds) = 12
    assert sorted(opened) == ["fold_0", "fold_0", "fold_1", "fold_1"]
    assert loads == [4]


def test_one_evaluate_call_embeds_each_split_once_per_model(run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``dmlbench evaluate RUN --analysis --per-query --verification --open-set``: the test split once with the
    trained model and once with the untrained one (the scores), the training split once (the analysis);
    per-query results, verification and the open set reuse the trained test embeddings."""
    from cli_runner import run_cli

    from dmlbench.training import run_evaluation

    copy = tmp_path / "run"
    copy.mkdir()
    for path in run_dir.iterdir():
        if path.is_file() and path.name != "test_metrics.json":  # no stored scores: everything is computed
            (copy / path.name).write_bytes(path.read_bytes())
    embedded: list[tuple[int, bool]] = []
    original = run_evaluation.embed

    def counted(model: torch.nn.Module, dataset: ImageDataset, batch_size: int, device: torch.device):
        embedded.append((len(dataset), model.training))
        return original(model, dataset, batch_size, device)

    monkeypatch.setattr(run_evaluation, "embed", counted)
    code, out, err = run_cli(["evaluate", str(copy), "--analysis", "--per-query", str(tmp_path / "q.csv"), "--verification",
                              "--open-set", "--json", str(tmp_path / "e.json")], capsys)
    assert code == 0, err
    run = Run.open(copy)
    sizes = {name: len(getattr(run.splits, name)) for name in ("train", "test")}
    assert sorted(size for size, _ in embedded) == sorted([sizes["test"], sizes["test"], sizes["train"]])
    results = json.loads((tmp_path / "e.json").read_text())
    assert {"untrained", "analysis", "verification", "open_set"} <= set(results)
