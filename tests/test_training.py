import json
from pathlib import Path

import pytest
import torch

from dmlbench import config as config_module
from dmlbench.errors import RunInterrupted, UserInputError
from dmlbench.training import TrainingDiverged, evaluate_run, loop, records, runs, train
from training_fixtures import TINY


def tiny_config(*overrides: str) -> config_module.Config:
    return config_module.load(None, [*TINY, *overrides])


def strip(entries: list[dict]) -> list[dict]:
    """Metrics records without their wall-clock field."""
    return [{key: value for key, value in entry.items() if key != "seconds"} for entry in entries]


def test_run_directory_records_everything(tmp_path: Path) -> None:
    result = train(tiny_config(), tmp_path / "run", progress=False)
    run_dir = result.run_dir
    for name in ("config.yaml", "run.json", "metrics.jsonl", "checkpoint_last.pt", "checkpoint_best.pt"):
        assert (run_dir / name).is_file(), name
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "completed"
    assert record["seed"] == 0
    assert set(record["packages"]) >= {"torch", "numpy", "dmlbench"}
    assert len(record["dataset"]["content_hash"]) == 64
    assert "git_commit" in record
    epochs = records.read_metrics(run_dir)
    assert [entry["epoch"] for entry in epochs] == [0, 1, 2]
    assert all("map_at_r" in entry["validation"] for entry in epochs)
    trained = epochs[1:]
    assert result.best_epoch == max(trained, key=lambda entry: entry["validation"]["map_at_r"])["epoch"]
    assert config_module.load(run_dir / "config.yaml") == tiny_config()


def test_same_config_and_seed_give_identical_results(tmp_path: Path) -> None:
    first = train(tiny_config(), tmp_path / "a", progress=False)
    second = train(tiny_config(), tmp_path / "b", progress=False)
    assert strip(records.read_metrics(first.run_dir)) == strip(records.read_metrics(second.run_dir))
    other_seed = train(tiny_config("seed=1"), tmp_path / "c", progress=False)
    assert strip(records.read_metrics(other_seed.run_dir)) != strip(records.read_metrics(first.run_dir))


def test_resume_after_a_crash_continues_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tiny_config("miner.name=random")
    uninterrupted = train(config, tmp_path / "full", progress=False)

    real_validate = loop._validate
    calls = {"count": 0}

    def crash_in_second_epoch(*args, **kwargs):
        calls["count"] += 1
        if calls["count"] == 3:  # epoch 0 (untrained), epoch 1, then epoch 2 crashes
            raise KeyboardInterrupt
        return real_validate(*args, **kwargs)

    monkeypatch.setattr(loop, "_validate", crash_in_second_epoch)
    with pytest.raises(RunInterrupted, match="--resume"):
        train(config, tmp_path / "crashed", progress=False)
    assert json.loads((tmp_path / "crashed" / "run.json").read_text())["status"] == "interrupted"
    monkeypatch.setattr(loop, "_validate", real_validate)

    resumed = train(config, tmp_path / "crashed", resume=True, progress=False)
    assert strip(records.read_metrics(resumed.run_dir)) == strip(records.read_metrics(uninterrupted.run_dir))
    record = json.loads((resumed.run_dir / "run.json").read_text())
    assert record["status"] == "completed" and len(record["resumed"]) == 1


def test_nan_loss_stops_the_run_and_marks_it_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dmlbench.training import setup

    real_build = setup.losses.build

    def nan_loss(*args, **kwargs):
        loss = real_build(*args, **kwargs)
        original_forward = loss.forward
        loss.forward = lambda *a, **k: original_forward(*a, **k) * float("nan")
        return loss

    monkeypatch.setattr(setup.losses, "build", nan_loss)
    with pytest.raises(TrainingDiverged, match="nan"):
        train(tiny_config(), tmp_path / "run", progress=False)
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "failed" and "diverged" in record["reason"]
    assert not (tmp_path / "run" / "checkpoint_best.pt").exists()
    with pytest.raises(UserInputError, match="not completed"):
        evaluate_run(tmp_path / "run")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["training.batch_size=30", "sampler.params={samples_per_class: 4}"], "divisible"),
        (["training.batch_size=64", "sampler.params={samples_per_class: 2}"], "classes"),
        (["loss.name=no_such_loss"], "unknown loss"),
    ],
)
def test_bad_setups_fail_before_creating_the_run_directory(tmp_path: Path, overrides: list[str], message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        train(tiny_config(*overrides), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_existing_run_directory_is_never_overwritten(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "precious.txt").write_text("keep me")
    with pytest.raises(UserInputError, match="already exists"):
        train(tiny_config(), run_dir, progress=False)
    assert (run_dir / "precious.txt").read_text() == "keep me"


def test_evaluate_run_reports_untrained_and_touches_test_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = train(tiny_config(), tmp_path / "run", progress=False).run_dir
    results = evaluate_run(run_dir)
    assert {"map_at_r", "precision_at_1", "nmi"} <= set(results)
    assert {"map_at_r", "precision_at_1"} <= set(results["untrained"])
    assert results["map_at_r"] != results["untrained"]["map_at_r"]
    stored = json.loads((run_dir / "test_metrics.json").read_text())
    assert stored["results"] == results

    def no_more_embedding(*args, **kwargs):
        raise AssertionError("the test split was embedded a second time")

    monkeypatch.setattr(runs, "embed", no_more_embedding)
    assert evaluate_run(run_dir) == results


def test_evaluate_run_needs_a_run_directory(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="does not exist"):
        evaluate_run(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match="not a dmlbench run directory"):
        evaluate_run(tmp_path / "empty")


def test_trunk_head_and_loss_parameters_get_their_own_learning_rates(tmp_path: Path) -> None:
    from dmlbench.training.setup import build_components

    config = tiny_config(
        "loss.name=normalized_softmax", "loss.params={}", "optimizer.loss_lr=0.01", "optimizer.trunk_lr=0.0001"
    )
    components = build_components(config, num_classes=5, device=torch.device("cpu"))
    groups = components.optimizer.param_groups
    assert [(group["name"], group["lr"]) for group in groups] == [("trunk", 0.0001), ("head", config.optimizer.lr), ("loss", 0.01)]
    model = components.model
    for group, module in zip(groups, (model.trunk, model.head, components.loss)):
        assert {id(p) for p in group["params"]} == {id(p) for p in module.parameters()}


@pytest.mark.parametrize("sampler", ["greedy_coreset", "ddm", "frd"])
def test_embedded_samplers_train_with_a_memory_bank(tmp_path: Path, sampler: str) -> None:
    config = tiny_config(
        "training.epochs=1", f"sampler.name={sampler}", "sampler.params={samples_per_class: 2, big_batch_size: 128}"
    )
    result = train(config, tmp_path / sampler, progress=False)
    assert json.loads((result.run_dir / "run.json").read_text())["status"] == "completed"
    assert records.read_metrics(result.run_dir)[-1]["steps"] > 0


def test_rho_regularisation_runs_through_the_loop(tmp_path: Path) -> None:
    config = tiny_config("training.epochs=1", "miner.name=distance_weighted", "miner.p_switch=0.5")
    assert train(config, tmp_path / "rho", progress=False).best_epoch == 1


def test_early_stopping_on_validation_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scores = iter([0.1, 0.5, 0.4, 0.3, 0.9])  # epoch 0 (untrained), then epochs 1..4

    def scripted_validation(*args, **kwargs):
        return {"precision_at_1": 0.0, "map_at_r": next(scores)}

    monkeypatch.setattr(loop, "_validate", scripted_validation)
    result = train(tiny_config("training.epochs=4", "training.early_stopping_patience=2"), tmp_path / "run", progress=False)
    assert result.epochs_run == 3 and result.best_epoch == 1
    assert [entry["epoch"] for entry in records.read_metrics(result.run_dir)] == [0, 1, 2, 3]


def test_resume_restores_the_embedded_samplers_memory_bank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tiny_config(
        "training.epochs=2", "sampler.name=ddm", "sampler.params={samples_per_class: 2, big_batch_size: 128}"
    )
    uninterrupted = train(config, tmp_path / "full", progress=False)

    real_train_epoch = loop._train_epoch

    def interrupt_second_epoch(epoch, *args, **kwargs):
        if epoch == 2:
            raise KeyboardInterrupt
        return real_train_epoch(epoch, *args, **kwargs)

    monkeypatch.setattr(loop, "_train_epoch", interrupt_second_epoch)
    with pytest.raises(RunInterrupted):
        train(config, tmp_path / "resumed", progress=False)
    monkeypatch.setattr(loop, "_train_epoch", real_train_epoch)
    resumed = train(config, tmp_path / "resumed", resume=True, progress=False)

    assert strip(records.read_metrics(resumed.run_dir)) == strip(records.read_metrics(uninterrupted.run_dir))
    weights = [torch.load(run / "checkpoint_last.pt", weights_only=False) for run in (uninterrupted.run_dir, resumed.run_dir)]
    assert torch.equal(weights[0]["sampler_memory"], weights[1]["sampler_memory"])
    for name, tensor in weights[0]["model"].items():
        assert torch.equal(tensor, weights[1]["model"][name]), name


def test_resume_of_a_completed_run_changes_nothing(tmp_path: Path) -> None:
    result = train(tiny_config("training.epochs=1"), tmp_path / "run", progress=False)
    before = {path.name: path.read_bytes() for path in result.run_dir.iterdir()}
    again = train(tiny_config("training.epochs=1"), result.run_dir, resume=True, progress=False)
    assert again.already_complete and again.best_epoch == result.best_epoch
    assert {path.name: path.read_bytes() for path in result.run_dir.iterdir()} == before


def test_num_threads_is_applied_and_recorded(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    try:
        result = train(tiny_config("training.epochs=1", "training.num_threads=2"), tmp_path / "run", progress=False)
        assert json.loads((result.run_dir / "run.json").read_text())["num_threads"] == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("device", "message"),
    [("cuda", "no CUDA device"), ("cuda:7", "CUDA device"), ("tpu", "not a device"), ("meta", "not supported")],
)
def test_unavailable_devices_are_user_errors(tmp_path: Path, device: str, message: str) -> None:
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if (device == "cuda" and available) or (device == "cuda:7" and available > 7):
        pytest.skip("this machine has the CUDA device asked for")
    with pytest.raises(UserInputError, match=message):
        train(tiny_config(f"training.device={device}"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_an_output_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("keep me")
    with pytest.raises(UserInputError, match="is a file"):
        train(tiny_config(), target, progress=False)
    assert target.read_text() == "keep me"
