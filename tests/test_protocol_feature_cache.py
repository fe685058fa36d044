"""The frozen-trunk feature cache (``protocol.frozen_trunk``): trunks per fold, cached features, head-only trials."""

import dataclasses
import json
import logging
import math
from pathlib import Path

import optuna
import pytest
import torch
import yaml

from cli_runner import run_cli
from dmlbench import config as config_module
from dmlbench.errors import RunInterrupted, UserInputError
from dmlbench.evaluation import evaluate
from dmlbench.models.embedding import EmbeddingHead
from dmlbench.protocol.design.benchmark import BenchmarkSpec, apply_spec_overrides, load_spec
from dmlbench.protocol.design.folds import fold_layout
from dmlbench.protocol.design.prepare import prepare
from dmlbench.protocol.units import feature_cache
from dmlbench.protocol.units import search as search_module
from dmlbench.training import TrainingDiverged, evaluate_run, loop, records, train, train_or_resume
from dmlbench.training.features import FoldFeatures
from dmlbench.training.setup import load_dataset
from protocol_fixtures import run_search, study
from training_fixtures import TINY

torch.set_num_threads(1)
optuna.logging.set_verbosity(logging.WARNING)

FAST = [*TINY, "sampler.params={samples_per_class: 4}", "training.max_steps_per_epoch=2"]
SEARCH = {"loss.params.margin": {"low": 0.05, "high": 0.5}}
PROTOCOL = {"trials": 2, "folds": 2, "epochs": 1, "patience": 1, "sampler": "tpe", "search_seed": 0, "frozen_trunk": True}


def base_raw() -> dict:
    return config_module.apply_overrides({}, list(FAST))


def clustered_features(seed: int = 0) -> FoldFeatures:
    """Noisy class centres in 24 dimensions: 12 training and 6 validation classes, 8 items each."""
    generator = torch.Generator().manual_seed(seed)

    def split(classes: range) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.tensor(classes).repeat_interleave(8)
        centres = torch.randn(max(classes) + 1, 24, generator=generator)
        return centres[labels] + 0.3 * torch.randn(len(labels), 24, generator=generator), labels

    train, train_labels = split(range(0, 12))
    validation, validation_labels = split(range(12, 18))
    return FoldFeatures(train, train_labels, validation, validation_labels, {"trunk_run": None, "features": "synthetic"},
                        "synthetic-dataset", unreadable_images=0)


def head_config(*overrides: str) -> config_module.Config:
    return config_module.from_dict(base_raw(), ["loss.name=triplet", "miner.name=semihard", "training.epochs=3",
                                                "training.max_steps_per_epoch=null", *overrides])


def test_head_training_on_features_is_finite_deterministic_and_not_retrained(tmp_path: Path) -> None:
    features = clustered_features()
    config = head_config()
    first = train_or_resume(config, tmp_path / "a", progress=False, record={"stage": "search", "fold": 0}, features=features)
    second = train_or_resume(config, tmp_path / "b", progress=False, record={"stage": "search", "fold": 0}, features=features)
    assert first.best_validation is not None and all(math.isfinite(v) for v in first.best_validation.values())
    assert (first.best_epoch, first.best_validation, first.epochs_run) == (second.best_epoch, second.best_validation, 3)
    metrics = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [entry["epoch"] for entry in metrics] == [0, 1, 2, 3]
    strip = lambda rows: [{k: v for k, v in row.items() if k != "seconds"} for row in rows]  # noqa: E731
    assert strip(metrics) == strip([json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()])
    # Training improved on the untrained head, which is recorded as epoch 0.
    assert first.best_validation["map_at_r"] >= metrics[0]["validation"]["map_at_r"]
    record = json.loads((tmp_path / "a" / "run.json").read_text())
    assert record["status"] == "completed" and record["best_epoch"] == first.best_epoch and record["epochs_run"] == 3
    assert record["frozen_trunk"] == {"trunk_run": None, "features": "synthetic"}
    assert record["samples_seen"] == sum(entry.get("samples", 0) for entry in metrics) > 0
    assert record["train_classes"] == list(range(12)) and record["val_classes"] == list(range(12, 18))
    assert (tmp_path / "a" / "config.yaml").is_file()
    # A completed run is returned as recorded, not trained again.
    before = (tmp_path / "a" / "metrics.jsonl").stat().st_mtime_ns
    again = train_or_resume(config, tmp_path / "a", progress=False, record={"stage": "search", "fold": 0}, features=features)
    assert again.already_complete and again.best_validation == first.best_validation
    assert (tmp_path / "a" / "metrics.jsonl").stat().st_mtime_ns == before
    # One that lost its best checkpoint (a directory copied without its *.pt files) trains again, to the same digits.
    (tmp_path / "a" / "checkpoint_best.pt").unlink()
    (tmp_path / "a" / "checkpoint_last.pt").unlink()
    retrained = train_or_resume(config, tmp_path / "a", progress=False, record={"stage": "search", "fold": 0}, features=features)
    assert not retrained.already_complete and (tmp_path / "a" / "checkpoint_best.pt").is_file()
    assert (retrained.best_epoch, retrained.best_validation) == (first.best_epoch, first.best_validation)
    assert strip(metrics) == strip([json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()])


def test_a_diverging_head_raises_training_diverged_and_is_recorded_failed(tmp_path: Path) -> None:
    config = head_config("optimizer.name=sgd", "optimizer.lr=1e30", "loss.name=contrastive", "miner.name=null")
    with pytest.raises(TrainingDiverged):
        train(config, tmp_path / "run", progress=False, features=clustered_features())
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "failed" and "diverged" in record["reason"]


def strip_seconds(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in entry.items() if k != "seconds"} for entry in records.read_metrics(run_dir)]


def test_a_head_run_records_what_a_full_run_does_and_keeps_its_checkpoints(tmp_path: Path) -> None:
    """The same run.json fields as a full run (packages, environment, dataset hash, plugins, the
    training choices), the same checkpoint names (no head_best.pt), and a best checkpoint whose head
    gives back the recorded best validation scores."""
    config = head_config("model.layer_norm=true")
    # Synthetic rows, recorded as computed from the config's dataset (as the feature cache's are).
    features = dataclasses.replace(clustered_features(), dataset_hash=load_dataset(config).content_hash)
    result = train(config, tmp_path / "head", progress=False, features=features, record={"stage": "search", "fold": 1})
    full = train(head_config("training.epochs=1", "training.max_steps_per_epoch=1"), tmp_path / "full", progress=False)
    head_record = json.loads((tmp_path / "head" / "run.json").read_text())
    full_record = json.loads((full.run_dir / "run.json").read_text())
    assert set(full_record) - set(head_record) == set() and set(head_record) - set(full_record) == {"frozen_trunk", "fold", "stage"}
    assert head_record["dataset"] == {"name": config.data.name, "content_hash": features.dataset_hash}
    assert head_record["dataset"] == full_record["dataset"]
    assert head_record["packages"] == full_record["packages"]
    assert head_record["environment"]["device"] == full_record["environment"]["device"]
    assert head_record["plugins"] == [] and head_record["unreadable_images"] == 0
    assert head_record["training_choices"]["model"] == config.model.model_dump(mode="json")
    assert head_record["split_sizes"] == {"train": 96, "validation": 48, "test": 0}
    assert sorted(path.name for path in (tmp_path / "head").iterdir()) == sorted(
        ["config.yaml", "run.json", "metrics.jsonl", "checkpoint_best.pt", "checkpoint_last.pt"])
    best = torch.load(tmp_path / "head" / "checkpoint_best.pt", weights_only=False)
    assert best["epoch"] == result.best_epoch
    head = EmbeddingHead(24, config.model.embedding_dim, True, config.model.normalize, config.model.bias)
    head.load_state_dict({name.removeprefix("head."): value for name, value in best["model"].items()})
    with torch.no_grad():
        embeddings = head.eval()(features.validation)
    scores = evaluate(embeddings, features.validation_labels, metrics=config.evaluation.metrics, seed=config.seed)
    assert {key: float(value) for key, value in scores.items()} == result.best_validation
    # A head alone embeds no image: evaluating the run is refused in one line, not a load error.
    with pytest.raises(UserInputError, match="trained only a head on cached trunk features"):
        evaluate_run(tmp_path / "head")


def test_a_stopped_head_run_is_interrupted_and_resumes_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in a head run is recorded ``interrupted`` (not ``failed``); ``train_or_resume`` then
    continues it from its last checkpoint to the uninterrupted run's epochs and weights."""
    features = clustered_features()
    config = head_config("sampler.name=ddm", "sampler.params={samples_per_class: 2, big_batch_size: 48}",
                         "optimizer.name=sgd", "optimizer.momentum=0.9", "optimizer.schedule=cosine")
    uninterrupted = train(config, tmp_path / "full", progress=False, features=features)
    real_train_epoch = loop._train_epoch

    def stopped_in_third_epoch(epoch, *args, **kwargs):  # type: ignore[no-untyped-def]
        if epoch == 3:
            raise KeyboardInterrupt
        return real_train_epoch(epoch, *args, **kwargs)

    monkeypatch.setattr(loop, "_train_epoch", stopped_in_third_epoch)
    with pytest.raises(RunInterrupted, match="--resume"):
        train_or_resume(config, tmp_path / "stopped", progress=False, features=features)
    record = json.loads((tmp_path / "stopped" / "run.json").read_text())
    assert record["status"] == "interrupted" and "reason" not in record
    assert [entry["epoch"] for entry in records.read_metrics(tmp_path / "stopped")] == [0, 1, 2]
    monkeypatch.setattr(loop, "_train_epoch", real_train_epoch)
    resumed = train_or_resume(config, tmp_path / "stopped", progress=False, features=features)
    assert not resumed.already_complete and resumed.best_validation == uninterrupted.best_validation
    assert strip_seconds(tmp_path / "stopped") == strip_seconds(tmp_path / "full")
    states = [torch.load(run / "checkpoint_last.pt", weights_only=False) for run in (tmp_path / "full", tmp_path / "stopped")]
    for name, tensor in states[0]["model"].items():
        assert torch.equal(tensor, states[1]["model"][name]), name
    assert torch.equal(states[0]["sampler_memory"], states[1]["sampler_memory"])
    record = json.loads((tmp_path / "stopped" / "run.json").read_text())
    assert record["status"] == "completed" and len(record["resumed"]) == 1


def test_a_head_run_is_tracked_like_a_full_run(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = train(head_config("tracking.backend=tensorboard"), tmp_path / "run", progress=False, features=clustered_features())
    events = EventAccumulator(str(result.run_dir / "tensorboard"))
    events.Reload()
    scalars = {event.step: event.value for event in events.Scalars("validation_map_at_r")}
    logged = {entry["epoch"]: entry["validation"]["map_at_r"] for entry in records.read_metrics(result.run_dir)}
    assert scalars == pytest.approx(logged) and sorted(logged) == [0, 1, 2, 3]


def test_frozen_trunk_search_trains_one_trunk_per_fold_and_reuses_its_features(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    extractions: list[int] = []
    original = feature_cache.FeatureCache._extract

    def counted(self, config, state, key):  # type: ignore[no-untyped-def]
        extractions.append(len(config.data.train_classes))
        return original(self, config, state, key)

    monkeypatch.setattr(feature_cache.FeatureCache, "_extract", counted)
    spec = BenchmarkSpec.model_validate({"base": base_raw(), "protocol": {**PROTOCOL, "trials": 3}, "methods": [
        {"name": "triplet", "overrides": {"loss.name": "triplet"}, "search": SEARCH}]})
    real_train_or_resume = search_module.train_or_resume

    def stopped_in_third_trial(config, run_dir, *args, **kwargs):  # type: ignore[no-untyped-def]
        assert kwargs["features"] is not None  # the search trains heads on the cached features
        if "trial_0002" in str(run_dir):
            raise KeyboardInterrupt
        return real_train_or_resume(config, run_dir, *args, **kwargs)

    monkeypatch.setattr(search_module, "train_or_resume", stopped_in_third_trial)
    with pytest.raises(RunInterrupted):
        run_search(spec, tmp_path)
    monkeypatch.setattr(search_module, "train_or_resume", real_train_or_resume)
    assert len(study(tmp_path, "triplet").trials) == 3 and len(extractions) == 2  # once per fold, not once per trial
    assert sorted(path.name for path in (tmp_path / "features").glob("*.pt")) == ["fold_0.pt", "fold_1.pt"]

    layout = fold_layout(load_dataset(config_module.from_dict(base_raw())), k=2)
    test_classes = set(layout.test_classes)
    for fold in layout.folds:
        trunk = json.loads((tmp_path / "trunks" / f"fold_{fold.index}" / "run.json").read_text())
        assert (trunk["stage"], trunk["fold"], trunk["status"]) == ("trunk", fold.index, "completed")
        assert trunk["train_classes"] == sorted(fold.train_classes)
        assert trunk["val_classes"] == sorted(fold.val_classes)
        assert not (set(trunk["train_classes"]) | set(trunk["val_classes"])) & test_classes
        for trial in range(2):
            run = json.loads((tmp_path / "triplet" / f"trial_{trial:04d}" / f"fold_{fold.index}" / "run.json").read_text())
            assert run["frozen_trunk"]["trunk_run"] == str(tmp_path / "trunks" / f"fold_{fold.index}")
            assert run["frozen_trunk"]["features"] == str(tmp_path / "features" / f"fold_{fold.index}.pt")
            assert run["train_classes"] == sorted(fold.train_classes) and run["val_classes"] == sorted(fold.val_classes)
    payload = torch.load(tmp_path / "features" / "fold_0.pt", weights_only=True)
    assert payload["key"]["dataset_hash"] == load_dataset(config_module.from_dict(base_raw())).content_hash
    assert payload["key"]["trunk_sha256"] == feature_cache.file_sha256(tmp_path / "trunks" / "fold_0" / "checkpoint_best.pt")
    assert set(payload["train_labels"].tolist()) == set(layout.folds[0].train_classes)

    # A later worker (a new process: nothing in memory) reuses the stored features and trunks.
    result = run_search(spec, tmp_path)["triplet"]
    assert result.completed == 3 and result.failed == 0 and len(extractions) == 2
    # A changed key (another trunk) recomputes them.
    payload["key"]["trunk_sha256"] = "0" * 64
    torch.save(payload, tmp_path / "features" / "fold_0.pt")
    prepared = prepare(spec, tmp_path)
    feature_cache.FeatureCache(prepared.plans["triplet"].budgeted, tmp_path, prepared.dataset_hash).features(layout.folds[0])
    assert len(extractions) == 3


def test_a_pretrained_trunk_is_used_as_is_and_keys_the_features_by_its_file(tmp_path: Path) -> None:
    from dmlbench.models.trunks import build_trunk

    trunk, _ = build_trunk("small_cnn", width=8)
    weights = tmp_path / "trunk.pt"
    torch.save(trunk.state_dict(), weights)
    raw = config_module.apply_overrides(base_raw(), [f"model.pretrained={weights}"])
    spec = BenchmarkSpec.model_validate({"base": raw, "protocol": {**PROTOCOL, "trials": 1}, "methods": [
        {"name": "triplet", "overrides": {"loss.name": "triplet"}, "search": SEARCH}]})
    result = run_search(spec, tmp_path / "out")["triplet"]
    assert result.completed == 1
    assert not (tmp_path / "out" / "trunks").exists()  # nothing trained: the pre-trained trunk as is
    payload = torch.load(tmp_path / "out" / "features" / "fold_1.pt", weights_only=True)
    assert payload["key"]["trunk_sha256"] == feature_cache.file_sha256(weights)
    # The cached features are exactly the pre-trained trunk's output on the fold's validation items.
    config = feature_cache.FeatureCache(raw, tmp_path, "").trunk_config(fold_layout(load_dataset(config_module.from_dict(raw)), k=2).folds[1])
    dataset = load_dataset(config)
    from dmlbench.training.setup import make_splits

    images, labels, _ = dataset.batch(make_splits(config, dataset).validation[:5])
    trunk.load_state_dict(torch.load(weights, weights_only=True))
    with torch.no_grad():
        expected = trunk.eval()(images)
    torch.testing.assert_close(payload["validation"][:5], expected)
    assert payload["validation_labels"][:5].tolist() == labels.tolist()
    run = json.loads((tmp_path / "out" / "triplet" / "trial_0000" / "fold_1" / "run.json").read_text())
    assert run["frozen_trunk"]["trunk_run"] is None


def test_benchmark_with_frozen_trunk_reports_it_and_passes_the_audit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = {"base": base_raw(), "protocol": {"folds": 2, "trials": 1, "reproductions": 2, "epochs": 1, "sampler": "tpe",
                                             "first_seed": 100, "frozen_trunk": True},
            "methods": [{"name": "triplet", "overrides": {"loss.name": "triplet"}, "search": SEARCH}]}
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(spec))
    code, _, err = run_cli(["benchmark", str(tmp_path / "bench.yaml"), "-o", str(tmp_path / "out")], capsys)
    assert code == 0, err
    out = tmp_path / "out"
    assert "| frozen-trunk feature cache | used: the search trained only heads" in (out / "report.md").read_text()
    # The reproductions trained full models (trunk and head), not heads on features.
    reproduction = next(out.glob("triplet/repro*/fold_0/run.json"))
    assert "frozen_trunk" not in json.loads(reproduction.read_text())
    code, _, err = run_cli(["audit", str(out)], capsys)
    assert code == 0, err
    trunk_file = out / "trunks" / "fold_0" / "run.json"
    record = json.loads(trunk_file.read_text())
    record["train_classes"] = record["train_classes"][1:]
    trunk_file.write_text(json.dumps(record))
    code, _, err = run_cli(["audit", str(out)], capsys)
    assert code == 1 and "trunks/fold_0: trunk run's train classes are not exactly fold 0's train classes" in err


def test_frozen_trunk_keys_are_validated(tmp_path: Path) -> None:
    path = tmp_path / "bench.yaml"
    method = {"name": "triplet", "overrides": {"loss.name": "triplet"}, "search": SEARCH}
    path.write_text(yaml.safe_dump({"base": base_raw(), "protocol": {"frozen_trunk": "maybe"}, "methods": [method]}))
    with pytest.raises(UserInputError, match="protocol.frozen_trunk"):
        load_spec(path)
    path.write_text(yaml.safe_dump({"base": base_raw(), "protocol": {"frozen_trunk": 1}, "methods": [method]}))
    with pytest.raises(UserInputError, match="protocol.frozen_trunk"):
        load_spec(path)
    path.write_text(yaml.safe_dump({"base": base_raw(), "methods": [{**method, "name": "trunks"}]}))
    with pytest.raises(UserInputError, match="reserved for the frozen-trunk feature cache"):
        load_spec(path)
    with pytest.raises(UserInputError, match="key 'protocol.frozen_trunk': Input should be a valid boolean"):
        apply_spec_overrides(BenchmarkSpec.model_validate({"base": base_raw(), "methods": [method]}),
                             ["protocol.frozen_trunk=maybe"])
    other_trunk = BenchmarkSpec.model_validate({"base": base_raw(), "protocol": PROTOCOL, "methods": [
        method, {"name": "wide", "overrides": {"loss.name": "contrastive", "model.options": {"width": 16}}, "search": {}}]})
    with pytest.raises(UserInputError, match="method 'wide' uses another trunk than 'triplet'"):
        run_search(other_trunk, tmp_path / "a")
    ensemble = BenchmarkSpec.model_validate({"base": base_raw(), "protocol": PROTOCOL, "methods": [
        {"name": "dreml", "overrides": {"loss.name": "triplet", "model.ensemble": 2}, "search": SEARCH}]})
    with pytest.raises(UserInputError, match="single trunk"):
        run_search(ensemble, tmp_path / "b")
    assert not (tmp_path / "a" / "trunks").exists() and not (tmp_path / "b" / "trunks").exists()
