import json
import math
import os
from pathlib import Path

import pytest
import torch
from training_fixtures import TINY

from dmlbench import config as config_module
from dmlbench.errors import RunInterrupted, UserInputError
from dmlbench.training import TrainingDiverged, evaluate_run, loop, records, runs, train


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


@pytest.mark.parametrize(("loss_name", "miner_name"), [("contrastive", "distance_weighted"), ("triplet", "semihard"),
                                                     ("multi_similarity", None), ("fastap", None)])
def test_non_finite_embeddings_fail_the_step_whatever_the_loss(loss_name: str, miner_name: str | None) -> None:
    # These losses turn a NaN embedding into a finite loss (a masked or clamped distance), and the
    # distance-weighted miner samples from its distances: the step checks the embeddings first.
    from dmlbench import losses, mining
    from dmlbench.training.step import batch_loss

    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    miner = mining.build(miner_name) if miner_name else None
    for bad in (float("nan"), float("inf")):
        embeddings = torch.nn.functional.normalize(torch.randn(8, 8, generator=torch.Generator().manual_seed(1)), dim=1)
        embeddings[3, 1] = bad
        with pytest.raises(TrainingDiverged, match="embeddings are not finite .* epoch 2, step 5"):
            batch_loss(losses.build(loss_name), miner, embeddings, labels, epoch=2, step=5)


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


def test_a_cuda_device_is_set_up_for_repeatable_ieee_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen on an H200 without this: a run and its resumption differed in the 8th digit of the loss and
    TF32 convolutions moved embeddings by 1e-4. Checked here on the flags (this machine may lack a GPU);
    the CPU leaves them as torch sets them."""
    from dmlbench.training.placement import resolve_device

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    for flag, value in (("benchmark", True), ("deterministic", False), ("allow_tf32", True)):
        monkeypatch.setattr(torch.backends.cudnn, flag, value)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = True  # (monkeypatch cannot restore this one)
    try:
        assert resolve_device("cpu").type == "cpu"
        assert torch.backends.cudnn.allow_tf32 and not torch.backends.cudnn.deterministic
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ and not torch.are_deterministic_algorithms_enabled()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        assert resolve_device("auto").type == "cuda"
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own choice stays
        assert resolve_device("cuda:0") == torch.device("cuda:0") and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cuda.matmul.allow_tf32 = before[2]


def test_an_output_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("keep me")
    with pytest.raises(UserInputError, match="is a file"):
        train(tiny_config(), target, progress=False)
    assert target.read_text() == "keep me"


def test_learning_rate_schedules_follow_their_formulas(tmp_path: Path) -> None:
    from dmlbench.training.schedule import learning_rate_factor

    step = tiny_config("optimizer.schedule=step", "optimizer.step_epochs=[2, 4]", "optimizer.gamma=0.5").optimizer
    assert [learning_rate_factor(step, epoch, 5) for epoch in range(1, 6)] == [1.0, 0.5, 0.5, 0.25, 0.25]
    cosine = tiny_config("optimizer.schedule=cosine").optimizer
    for epoch in range(1, 6):
        assert learning_rate_factor(cosine, epoch, 5) == pytest.approx((1 + math.cos(math.pi * (epoch - 1) / 5)) / 2)
    result = train(
        tiny_config("optimizer.schedule=cosine", "optimizer.head_lr=0.01", "training.epochs=2"), tmp_path / "run", progress=False
    )
    rates = [entry["learning_rates"] for entry in records.read_metrics(result.run_dir)[1:]]
    assert rates == [{"trunk": 1e-3, "head": 1e-2}, {"trunk": pytest.approx(5e-4), "head": pytest.approx(5e-3)}]
    with pytest.raises(UserInputError, match="needs optimizer.step_epochs"):
        tiny_config("optimizer.schedule=step")


def test_warmup_trains_only_the_new_parameters(tmp_path: Path) -> None:
    """Seed 002 §4.1: the warm-up epoch updates the head only (the trunk's weights and BatchNorm
    statistics stay); the next epoch trains the trunk too."""
    from dmlbench.training.setup import build_model

    initial = build_model(tiny_config()).state_dict()

    def trained_after(epochs: int) -> dict:
        config = tiny_config("training.warmup_epochs=1", f"training.epochs={epochs}")
        result = train(config, tmp_path / str(epochs), progress=False)
        return torch.load(result.run_dir / "checkpoint_last.pt", weights_only=False, map_location="cpu")["model"]

    warm = trained_after(1)
    for name, tensor in initial.items():
        if name.startswith("trunk."):
            assert torch.equal(warm[name], tensor), name
    assert not torch.equal(warm["head.linear.weight"], initial["head.linear.weight"])
    full = trained_after(2)
    assert not torch.equal(full["trunk.0.0.weight"], initial["trunk.0.0.weight"])
    assert not torch.equal(full["trunk.0.1.running_mean"], initial["trunk.0.1.running_mean"])


def test_gradient_accumulation_steps_once_per_window(tmp_path: Path) -> None:
    config = tiny_config("training.epochs=1", "training.accumulation_steps=3", "training.max_steps_per_epoch=7")
    result = train(config, tmp_path / "run", progress=False)
    state = torch.load(result.run_dir / "checkpoint_last.pt", weights_only=False)["optimizer"]["state"]
    # 7 batches: steps after batches 3, 6 and the epoch's last.
    assert {int(entry["step"]) for entry in state.values()} == {3}
    assert records.read_metrics(result.run_dir)[1]["steps"] == 7


def test_gradient_accumulation_sums_the_batches_gradients(tmp_path: Path) -> None:
    """Two accumulated batches give one SGD step along the mean of their two gradients."""
    from dmlbench.training import loop as training_loop
    from dmlbench.training.setup import build_components, set_up_training

    config = tiny_config(
        "training.accumulation_steps=2", "training.max_steps_per_epoch=2", "optimizer.name=sgd",
        "optimizer.momentum=0", "optimizer.weight_decay=0", "optimizer.lr=0.1",
    )
    cpu = torch.device("cpu")
    setup = set_up_training(config, cpu)
    index = setup.to_class_index
    reference = build_components(config, int((index >= 0).sum()), cpu)
    stepper = training_loop.Stepper(config, setup.components, cpu, training_loop.ProcessGroup())
    training_loop._train_epoch(1, training_loop.ImageBatches(config, setup), stepper, False)
    setup.sampler.set_epoch(1)
    reference.model.train()
    gradients = None
    for batch, _ in zip(setup.sampler, range(2)):
        images, batch_labels, _ = setup.train_set.batch(batch)
        loss = reference.loss(reference.model(images), index[batch_labels], None)
        grads = torch.autograd.grad(loss, list(reference.model.parameters()))
        gradients = grads if gradients is None else [a + b for a, b in zip(gradients, grads)]
    with torch.no_grad():
        for parameter, gradient in zip(reference.model.parameters(), gradients):
            parameter -= 0.1 * gradient / 2
    for (name, trained), expected in zip(setup.components.model.named_parameters(), reference.model.parameters()):
        torch.testing.assert_close(trained, expected, msg=name)


def test_bf16_autocast_on_the_cpu_and_fp16_refused(tmp_path: Path) -> None:
    result = train(tiny_config("training.epochs=1", "training.precision=bf16"), tmp_path / "bf16", progress=False)
    record = json.loads((result.run_dir / "run.json").read_text())
    assert record["status"] == "completed" and record["training_choices"]["training"]["precision"] == "bf16"
    assert math.isfinite(records.read_metrics(result.run_dir)[1]["loss"])
    with pytest.raises(UserInputError, match="training.precision=fp16 needs a CUDA or MPS device"):
        train(tiny_config("training.precision=fp16", "training.device=cpu"), tmp_path / "fp16", progress=False)
    assert not (tmp_path / "fp16").exists()


def test_run_json_records_the_training_choices(tmp_path: Path) -> None:
    config = tiny_config("training.epochs=1", "optimizer.name=sgd", "optimizer.trunk_lr=0.0001", "model.freeze_bn=true")
    result = train(config, tmp_path / "run", progress=False)
    choices = json.loads((result.run_dir / "run.json").read_text())["training_choices"]
    assert choices["model"] == config.model.model_dump(mode="json")
    assert choices["optimizer"]["name"] == "sgd" and choices["optimizer"]["trunk_lr"] == 0.0001
    assert choices["training"]["accumulation_steps"] == 1 and choices["world_size"] == 1
    assert choices["batch_per_process"] == config.training.batch_size


def test_resume_with_schedule_warmup_accumulation_and_momentum_continues_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tiny_config(
        "training.epochs=3", "training.warmup_epochs=1", "training.accumulation_steps=2", "optimizer.name=sgd",
        "optimizer.schedule=step", "optimizer.step_epochs=[3]", "optimizer.loss_lr=0.01",
        "loss.name=proxy_anchor", "loss.params={}", "miner.name=null", "model.freeze_bn=true",
    )
    uninterrupted = train(config, tmp_path / "full", progress=False)
    real_train_epoch = loop._train_epoch

    def interrupt_third_epoch(epoch, *args, **kwargs):
        if epoch == 3:
            raise KeyboardInterrupt
        return real_train_epoch(epoch, *args, **kwargs)

    monkeypatch.setattr(loop, "_train_epoch", interrupt_third_epoch)
    with pytest.raises(RunInterrupted):
        train(config, tmp_path / "resumed", progress=False)
    monkeypatch.setattr(loop, "_train_epoch", real_train_epoch)
    resumed = train(config, tmp_path / "resumed", resume=True, progress=False)
    assert strip(records.read_metrics(resumed.run_dir)) == strip(records.read_metrics(uninterrupted.run_dir))
    states = [torch.load(run / "checkpoint_last.pt", weights_only=False) for run in (uninterrupted.run_dir, resumed.run_dir)]
    for part in ("model", "loss"):
        for name, tensor in states[0][part].items():
            assert torch.equal(tensor, states[1][part][name]), name
    for key, entry in states[0]["optimizer"]["state"].items():
        assert torch.equal(entry["momentum_buffer"], states[1]["optimizer"]["state"][key]["momentum_buffer"])


@pytest.mark.slow
def test_torch_compile_trains_like_eager_mode(tmp_path: Path) -> None:
    eager = train(tiny_config("training.epochs=1"), tmp_path / "eager", progress=False)
    compiled = train(tiny_config("training.epochs=1", "training.compile=true"), tmp_path / "compiled", progress=False)
    losses = [records.read_metrics(run.run_dir)[1]["loss"] for run in (eager, compiled)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-3)


def test_run_json_records_the_machine_the_numbers_come_from(tmp_path: Path) -> None:
    """Results agree to the digit only on the same CPU capability, torch build and thread count."""
    import torch.backends.cpu

    result = train(tiny_config("training.device=cpu"), tmp_path / "run", progress=False)
    environment = json.loads((result.run_dir / "run.json").read_text())["environment"]
    assert environment["device"] == "cpu" and environment["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert environment["torch_build"]["version"] == torch.__version__
    assert environment["torch_build"]["git"] == torch.version.git_version
    assert environment["num_threads"] == torch.get_num_threads()
    assert environment["omp_wait_policy"] == os.environ.get("OMP_WAIT_POLICY")
    assert environment["blas"] and environment["blas"] in torch.__config__.show()


def test_a_long_epoch_shows_progress_where_no_bar_can(tmp_path, monkeypatch, capsys) -> None:
    """With stderr no terminal (a log, a pipe) tqdm draws no bar: a plain line within the epoch says how far it is
    (train showed nothing until the epoch ended)."""
    from dmlbench.training import loop

    monkeypatch.setattr(loop, "LOG_EVERY_SECONDS", 0.0)
    train(tiny_config("training.epochs=1", "training.max_steps_per_epoch=3"), tmp_path / "run", progress=True)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("epoch 1/1: step ")]
    assert [line.split(",")[0] for line in lines] == ["epoch 1/1: step 1/3", "epoch 1/1: step 2/3"]
    assert all(line.endswith(" img/s") and ", loss " in line for line in lines)
