"""One Optuna study per method over class-disjoint folds (Musgrave et al. 2020 §3.3)."""

import json
import logging
from pathlib import Path

import optuna
import pytest
import torch
from optuna.trial import TrialState
from protocol_fixtures import benchmark_spec, method_search, run_search, study
from training_fixtures import TINY

from dmlbench import config as config_module
from dmlbench.data.splits import train_test_split
from dmlbench.errors import RunInterrupted, UserInputError
from dmlbench.protocol.design.benchmark import ProtocolSpec, apply_spec_overrides
from dmlbench.protocol.design.plan import SearchSettings, method_raw_config
from dmlbench.protocol.design.prepare import prepare
from dmlbench.protocol.design.workers import resolve_storage
from dmlbench.protocol.queue import attempts, work
from dmlbench.protocol.run.schedule import run_benchmark
from dmlbench.protocol.units.search import make_sampler
from dmlbench.training import loop as loop_module
from dmlbench.training.setup import load_dataset

torch.set_num_threads(1)
optuna.logging.set_verbosity(logging.WARNING)

PROTOCOL = {"trials": 2, "folds": 2, "epochs": 1, "patience": 1, "sampler": "tpe", "search_seed": 0}
FAST = [*TINY, "sampler.params={samples_per_class: 4}", "training.max_steps_per_epoch=2"]
SEARCH = {"loss.params.margin": {"low": 0.05, "high": 0.5}}


def base_raw() -> dict:
    return config_module.apply_overrides({}, list(FAST))


def one_method(raw: dict, name: str = "m", **protocol: object):  # type: ignore[no-untyped-def]
    return benchmark_spec(raw, {"name": name, "search": SEARCH}, **protocol)


def test_tiny_study_stores_its_trials_and_its_runs_never_see_a_test_class(tmp_path: Path) -> None:
    benchmark = benchmark_spec(base_raw(), {"name": "triplet", "overrides": {"loss.name": "triplet"}, "search": SEARCH},
                               **PROTOCOL)
    results = run_search(benchmark, tmp_path)
    result = results["triplet"]
    assert result.completed == 2 and result.failed == 0
    assert result.best_params is not None and 0.05 <= result.best_params["loss.params.margin"] <= 0.5

    stored = study(tmp_path, "triplet")
    trials = stored.get_trials()
    assert [trial.state for trial in trials] == [TrialState.COMPLETE] * 2
    assert stored.user_attrs["settings"]["folds"] == 2 and stored.user_attrs["epochs"] == 1
    assert stored.user_attrs["fold_layout_hash"] == result.fold_layout_hash
    for trial in trials:
        assert trial.value == pytest.approx(sum(trial.user_attrs["fold_values"]) / 2)
        assert len(trial.user_attrs["run_dirs"]) == 2

    labels = load_dataset(config_module.from_dict(base_raw())).labels.numpy()
    test_classes = set(labels[train_test_split(labels)[1]].tolist())
    run_files = sorted((tmp_path / "triplet").glob("trial_*/fold_*/run.json"))
    assert len(run_files) == 4
    for path in run_files:
        record = json.loads(path.read_text())
        assert record["status"] == "completed"
        assert (record["method"], record["stage"]) == ("triplet", "search")
        assert path.parent.name == f"fold_{record['fold']}" and path.parent.parent.name == f"trial_{record['trial']:04d}"
        assert record["train_classes"] and record["val_classes"]
        assert not set(record["train_classes"]) & test_classes
        assert not set(record["val_classes"]) & test_classes
        assert not set(record["train_classes"]) & set(record["val_classes"])
        assert record["fold_layout_hash"] == result.fold_layout_hash

    summary = json.loads((tmp_path / "search.json").read_text())
    assert summary["methods"]["triplet"]["best_params"] == result.best_params
    assert summary["settings"]["trials"] == 2 and summary["settings"]["epochs"] == 1

    # Re-running a finished search adds nothing.
    again = run_search(benchmark, tmp_path)["triplet"]
    assert again.completed == 2 and len(study(tmp_path, "triplet").trials) == 2


def test_a_diverging_trial_is_failed_and_its_method_never_reproduced_with_defaults(tmp_path: Path) -> None:
    benchmark = benchmark_spec(base_raw(), {"name": "sgd", "overrides": {"optimizer.name": "sgd", "optimizer.lr": 1e30},
                                            "search": SEARCH}, {"name": "ok", "search": SEARCH},
                               trials=1, folds=2, epochs=1, sampler="tpe", reproductions=2)
    outcome = run_benchmark(prepare(benchmark, tmp_path), progress=False)
    assert outcome is not None
    (trial,) = study(tmp_path, "sgd").trials
    assert outcome.failed == {"sgd": f"no search trial completed (1 failed; the first: {trial.user_attrs['fail_reason']})"}
    assert trial.state == TrialState.FAIL and trial.value is None
    assert "NaN" in trial.user_attrs["fail_reason"]
    # Only the method with a completed trial is reproduced; the baseline takes it as its reference.
    assert set(outcome.results) == {"ok", "untrained"} and not (tmp_path / "sgd" / "reproduction_00").exists()


def test_an_interrupted_trial_is_rerun_once_with_the_same_parameters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    benchmark = one_method(base_raw(), trials=1, folds=2, epochs=1, sampler="gp", search_seed=3)
    real_train = loop_module.train
    calls = {"count": 0}

    def killed_in_second_fold(*args, **kwargs):
        calls["count"] += 1
        if calls["count"] == 2:
            raise KeyboardInterrupt  # the process dies: the trial stays RUNNING in the storage
        return real_train(*args, **kwargs)

    monkeypatch.setattr(loop_module, "train", killed_in_second_fold)
    with pytest.raises(RunInterrupted, match="re-run the same command to continue"):
        run_search(benchmark, tmp_path)
    (killed,) = study(tmp_path, "m").trials
    assert killed.state == TrialState.FAIL and killed.user_attrs["interrupted"] is True

    result = run_search(benchmark, tmp_path)["m"]
    trials = study(tmp_path, "m").trials
    assert [trial.state for trial in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[0].value is None and "fail_reason" not in trials[0].user_attrs
    assert trials[1].params == killed.params and trials[1].user_attrs["retry_of"] == 0
    assert trials[1].user_attrs["slot"] == trials[0].user_attrs["slot"] == 0
    # The retry kept the interrupted attempt's finished fold (train returned it as it was) and trained the other.
    assert calls["count"] == 4
    fold_0 = json.loads((tmp_path / "m" / "trial_0000" / "fold_0" / "run.json").read_text())
    assert fold_0["status"] == "completed" and fold_0["resumed"] == [] and fold_0["samples_seen"] > 0
    assert result.completed == 1 and result.failed == 0
    # Resuming again neither re-runs nor re-enqueues anything.
    run_search(benchmark, tmp_path)
    assert len(study(tmp_path, "m").trials) == 2
    # A benchmark made with another budget is not continued.
    with pytest.raises(UserInputError, match=r"holds a benchmark with other settings \(spec\.protocol\.epochs: 1 -> 2"):
        run_search(one_method(base_raw(), trials=1, folds=2, epochs=2, sampler="gp", search_seed=3), tmp_path)


def test_a_trial_left_running_by_a_dead_process_is_retried_with_its_parameters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed with kill -9 on this machine: its trial stays RUNNING with the dead process's id."""
    import subprocess

    from dmlbench.protocol.queue.storage import host_id
    from dmlbench.training.step import TrainResult

    def scripted_train(config, run_dir, **kwargs):
        return TrainResult(Path(run_dir), 1, {"map_at_r": config.loss.params["margin"]}, 1)

    monkeypatch.setattr(loop_module, "train", scripted_train)
    benchmark = one_method(base_raw(), trials=2, folds=2, epochs=1, sampler="tpe")
    search = method_search(prepare(benchmark, tmp_path), "m")
    gone = subprocess.Popen(["true"])
    gone.wait()
    searched = search.study
    searched.enqueue_trial({"loss.params.margin": 0.25}, user_attrs={"slot": 0})
    orphan = searched.ask()
    orphan.suggest_float("loss.params.margin", 0.05, 0.5)
    orphan.set_user_attr("worker", {"host": host_id(), "pid": gone.pid})
    result = run_search(benchmark, tmp_path)["m"]
    trials = study(tmp_path, "m").trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert trials[0].user_attrs["interrupted"] is True
    assert trials[1].params == {"loss.params.margin": 0.25} and trials[1].user_attrs["retry_of"] == 0
    assert [t.user_attrs["slot"] for t in trials] == [0, 0, 1]
    assert result.completed == 2 and len(attempts.counted(searched)) == 2


def test_parallel_trials_lets_a_batch_start_before_the_earlier_slots_finish(tmp_path: Path) -> None:
    for parallel, expected in ((1, [True, False, False]), (2, [True, True, False])):
        benchmark = one_method(base_raw(), f"m{parallel}", trials=3, folds=2, epochs=1, sampler="tpe",
                               parallel_trials=parallel)
        search = method_search(prepare(benchmark, tmp_path / str(parallel)), f"m{parallel}")
        assert [search._ready(slot, {}) for slot in range(3)] == expected
        assert search._ready(2, {0: None, 1: None})  # type: ignore[dict-item]


def test_protocol_keys_and_bad_settings_are_refused(tmp_path: Path) -> None:
    epochs_searched = benchmark_spec(base_raw(), {"name": "m", "search": {"training.epochs": {"low": 1, "high": 3, "type": "int"}}},
                                     **PROTOCOL)
    with pytest.raises(UserInputError, match="method 'm': search key 'training.epochs' is set by the protocol"):
        run_search(epochs_searched, tmp_path)
    benchmark = one_method(base_raw(), **PROTOCOL)
    for override, message in (("protocol.sampler=grid", "key 'protocol.sampler': Input should be 'gp' or 'tpe'"),
                              ("protocol.pruner=hyperband", "key 'protocol.pruner'"),
                              ("protocol.fold_mode=random", "key 'protocol.fold_mode'"),
                              ("protocol.trials=0", "key 'protocol.trials'")):
        with pytest.raises(UserInputError, match=message):
            apply_spec_overrides(benchmark, [override])
    with pytest.raises(UserInputError, match="method 'x': search key 'loss.params.nope'"):
        run_search(benchmark_spec(base_raw(), {"name": "x", "search": {"loss.params.nope": {"low": 0.1, "high": 0.2}}},
                                  **PROTOCOL), tmp_path)
    with pytest.raises(UserInputError, match="different numbers of epochs"):
        run_search(benchmark_spec(base_raw(), {"name": "a"}, {"name": "b", "overrides": {"training.epochs": 3}},
                                  trials=1, folds=2), tmp_path)
    assert not (tmp_path / "study.db").exists()


def test_method_raw_config_layers_base_method_and_overrides() -> None:
    benchmark = benchmark_spec(base_raw(), {"name": "a", "overrides": {"loss.name": "margin", "optimizer.lr": 1e-5}})
    raw = method_raw_config(benchmark, "a", ["training.epochs=3"])
    config = config_module.from_dict(raw)
    assert (config.loss.name, config.optimizer.lr, config.training.epochs) == ("margin", 1e-5, 3)
    with pytest.raises(UserInputError, match="method 'a'"):
        method_raw_config(benchmark, "a", ["loss.name=nope"])


@pytest.mark.parametrize("sampler", ["gp", "tpe"])
def test_samplers_are_seeded(sampler: str) -> None:
    def params_of(seed: int) -> list[dict]:
        settings = SearchSettings.of(ProtocolSpec(sampler=sampler, search_seed=seed), "sqlite://")
        searched = optuna.create_study(direction="maximize", sampler=make_sampler(settings))
        searched.optimize(lambda trial: -(trial.suggest_float("x", -1.0, 1.0) - 0.3) ** 2, n_trials=12)
        return [trial.params for trial in searched.trials]

    assert params_of(1) == params_of(1)
    assert params_of(1) != params_of(2)
    assert isinstance(make_sampler(SearchSettings.of(ProtocolSpec(), "sqlite://")), optuna.samplers.GPSampler)


_GP_PROPOSALS = """
import importlib.util, sys
if sys.argv[1] == "blocked":
    sys.modules["greenlet"] = None  # as on a machine without the package
import logging, math, optuna
from dmlbench.protocol.design.benchmark import ProtocolSpec
from dmlbench.protocol.design.plan import SearchSettings
from dmlbench.protocol.units.search import make_sampler
print("greenlet", importlib.util.find_spec("greenlet") is not None and sys.modules.get("greenlet", 0) is not None)
settings = SearchSettings.of(ProtocolSpec(sampler="gp", search_seed=0, startup_trials=4), "sqlite://")
make_sampler(settings)  # at Optuna's default verbosity: a warning it logs would reach stderr
optuna.logging.set_verbosity(logging.ERROR)
def score(trial):
    lr = trial.suggest_float("lr", 1e-4, 1e-2, log=True)
    margin = trial.suggest_float("margin", 0.5, 1.5)
    return -(math.log10(lr) + 2.7) ** 2 - (margin - 0.9) ** 2 + 0.01 * math.sin(37e3 * lr + margin)
searched = optuna.create_study(direction="maximize", sampler=make_sampler(settings))
searched.optimize(score, n_trials=6)
for trial in searched.trials:
    print(repr(trial.params["lr"]), repr(trial.params["margin"]))
"""


def test_gp_proposals_are_the_same_with_and_without_greenlet() -> None:
    """Optuna's GP sampler takes a batched optimiser when ``greenlet`` imports (it is a test
    dependency, so it does here), which rounds differently (proposals 5 and 6 differed in the 14th
    digit before ``make_sampler`` chose one path); every proposal must be the same bits either way,
    and without greenlet Optuna's warning of a fallback is not shown."""
    import subprocess
    import sys

    warnings = []

    def proposals(greenlet: str) -> list[str]:
        completed = subprocess.run([sys.executable, "-c", _GP_PROPOSALS, greenlet],
                                   capture_output=True, text=True, timeout=300)
        assert completed.returncode == 0, completed.stderr
        if greenlet == "blocked":
            warnings.append(completed.stderr)
        return completed.stdout.splitlines()

    importable, blocked = proposals("importable"), proposals("blocked")
    # Without greenlet Optuna warns of "slower suggestions"; the one-at-a-time path is chosen, not a
    # fallback, so the warning is held back.
    assert len(warnings) == 1 and "greenlet" not in warnings[0], warnings
    assert importable[0] == "greenlet True", "greenlet (a test dependency) is not installed"
    assert blocked[0] == "greenlet False"
    assert len(importable) == 7 and importable[1:] == blocked[1:]


def test_storage_is_the_given_url_else_sqlite_for_one_worker_and_a_journal_for_several(tmp_path: Path) -> None:
    assert resolve_storage(tmp_path, "postgresql://user@host/db", 1) == "postgresql://user@host/db"
    assert resolve_storage(tmp_path, None, 1) == f"sqlite:///{tmp_path.resolve() / 'study.db'}"
    assert resolve_storage(tmp_path, None, 2) == f"journal:///{tmp_path.resolve() / 'study.journal'}"


def test_median_pruning_stops_a_hopeless_trial_after_its_first_fold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fold scores are scripted; the third trial's first fold is below the median of the first two."""
    from dmlbench.training.step import TrainResult

    scores = iter([0.5, 0.5, 0.6, 0.6, 0.1, 0.7, 0.7])
    calls = []

    def scripted_train(config, run_dir, **kwargs):
        calls.append(run_dir)
        return TrainResult(Path(run_dir), 1, {"map_at_r": next(scores)}, 1)

    monkeypatch.setattr(loop_module, "train", scripted_train)
    result = run_search(one_method(base_raw(), trials=4, folds=2, epochs=1, sampler="tpe", pruner="median"), tmp_path)["m"]
    trials = study(tmp_path, "m").trials
    assert [trial.state for trial in trials] == [TrialState.COMPLETE] * 2 + [TrialState.PRUNED, TrialState.COMPLETE]
    assert "after 1 fold" in trials[2].user_attrs["pruned"]  # Optuna keeps its last running mean as its value
    assert len(calls) == 7  # the pruned trial trained one fold, not two
    assert (result.completed, result.pruned, result.failed) == (3, 1, 0)
    assert result.best_value == pytest.approx(0.7) and len(attempts.counted(study(tmp_path, "m"))) == 4


@pytest.mark.parametrize("sampler", ["gp", "tpe"])
def test_startup_trials_reach_the_sampler(sampler: str) -> None:
    # Optuna's default (10 random start-up trials) would leave a budget of 8 trials unmodelled.
    default = make_sampler(SearchSettings.of(ProtocolSpec(trials=8, sampler=sampler), "sqlite://"))
    chosen = make_sampler(SearchSettings.of(ProtocolSpec(trials=8, sampler=sampler, startup_trials=3), "sqlite://"))
    assert default._n_startup_trials == 10 and chosen._n_startup_trials == 3


def test_a_trial_whose_claim_broke_off_before_its_stamp_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A RUNNING trial without a worker stamp (a lost connection or a kill between ``ask`` and the
    stamp, both under the work lock) would otherwise be waited for forever: no process, no heartbeat."""
    from dmlbench.training.step import TrainResult

    def scripted_train(config, run_dir, **kwargs):
        return TrainResult(Path(run_dir), 1, {"map_at_r": config.loss.params["margin"]}, 1)

    monkeypatch.setattr(loop_module, "train", scripted_train)
    benchmark = one_method(base_raw(), trials=2, folds=2, epochs=1, sampler="tpe")
    searched = method_search(prepare(benchmark, tmp_path), "m").study
    searched.enqueue_trial({"loss.params.margin": 0.25}, user_attrs={"slot": 0})
    searched.ask().suggest_float("loss.params.margin", 0.05, 0.5)
    result = run_search(benchmark, tmp_path)["m"]
    trials = study(tmp_path, "m").trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert trials[0].user_attrs["interrupted_reason"] == "interrupted: the claim broke off"
    assert trials[1].params == {"loss.params.margin": 0.25} and result.completed == 2


def test_a_claim_that_fails_after_its_stamp_leaves_the_trial_to_this_workers_next_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection lost in the middle of a claim: the worker retries, and its next claim releases
    the half-claimed trial (its own, not running) instead of waiting for it."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    worker = work.Worker(url)
    units = optuna.create_study(storage=worker.storage, study_name="units")
    real = optuna.trial.Trial.set_user_attr
    failures = iter([RuntimeError("connection lost")])

    def flaky(self, key, value):
        if key == "started":
            error = next(failures, None)
            if error is not None:
                raise error
        return real(self, key, value)

    monkeypatch.setattr(optuna.trial.Trial, "set_user_attr", flaky)
    arguments = {"budget": 1, "ready": lambda slot, finished: True, "propose": lambda slot, finished: ({}, {})}
    with pytest.raises(RuntimeError, match="connection lost"):
        work.claim(units, worker, **arguments)
    claimed = work.claim(units, worker, **arguments)
    assert isinstance(claimed, work.Claim) and claimed.slot == 0
    first, second = units.get_trials(deepcopy=False)
    assert first.state == TrialState.FAIL and first.user_attrs["interrupted"] is True
    assert second.number == claimed.trial.number and second.user_attrs["retry_of"] == 0


def test_a_claim_broken_off_before_its_unit_suggested_anything_is_retried_with_its_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parameters of a slot are fixed when it is enqueued; an attempt lost before the unit called
    ``suggest`` (a database restart during the claim, seen in CI) has none in ``trial.params``. Its
    retry must carry the enqueued ones: without them the study's placeholder sampler drew another
    temperature for normalized_softmax's slot 0, so the search's best trial changed."""
    worker = work.Worker(f"sqlite:///{tmp_path / 'study.db'}")
    units = optuna.create_study(storage=worker.storage, study_name="units", sampler=optuna.samplers.RandomSampler(seed=0))
    real = optuna.trial.Trial.set_user_attr
    failures = iter([RuntimeError("connection lost")])

    def flaky(self, key, value):
        if key == "started" and (error := next(failures, None)) is not None:
            raise error
        return real(self, key, value)

    monkeypatch.setattr(optuna.trial.Trial, "set_user_attr", flaky)
    arguments = {"budget": 1, "ready": lambda slot, finished: True,
                 "propose": lambda slot, finished: ({"temperature": 0.034}, {"params": {"loss.params.temperature": 0.034}})}
    with pytest.raises(RuntimeError, match="connection lost"):
        work.claim(units, worker, **arguments)
    again = work.claim(units, worker, **arguments)
    assert isinstance(again, work.Claim) and again.trial.user_attrs["retry_of"] == 0
    assert again.trial.user_attrs["params"] == {"loss.params.temperature": 0.034}
    assert again.trial.suggest_float("temperature", 0.02, 0.2, log=True) == 0.034
    # The studies of units draw nothing themselves: a parameter no slot fixed is an error, not a draw.
    loud = optuna.create_study(study_name="units", sampler=attempts.EnqueuedOnly())
    loud.enqueue_trial({"temperature": 0.034})
    assert loud.ask().suggest_float("temperature", 0.02, 0.2, log=True) == 0.034
    with pytest.raises(RuntimeError, match="units trial 1: parameter 'temperature' was not fixed when its slot was enqueued"):
        loud.ask().suggest_float("temperature", 0.02, 0.2, log=True)


def test_a_connection_lost_inside_a_unit_interrupts_it_and_never_fails_the_method(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database server that goes away while a unit runs (seen in CI: a restart during a search trial,
    the server back before the failure was told) is not the method's failure: the unit is marked
    interrupted, so that its slot runs again with the same parameters, and the error goes on to the
    worker's retry loop. Recorded as a failure, it took a trial from the search and changed its best."""
    import sqlalchemy

    from dmlbench.protocol.queue import storage as storage_module

    worker = work.Worker(f"sqlite:///{tmp_path / 'study.db'}")
    # This worker's storage answers like a PostgreSQL one: the error below is a lost connection.
    monkeypatch.setattr(worker.kind, "connection_lost", storage_module.PostgresStorage.connection_lost.__get__(worker.kind))
    units = optuna.create_study(storage=worker.storage, study_name="units")
    arguments = {"budget": 1, "ready": lambda slot, finished: True, "propose": lambda slot, finished: ({}, {})}
    claimed = work.claim(units, worker, **arguments)
    assert isinstance(claimed, work.Claim)
    lost = sqlalchemy.exc.OperationalError("UPDATE trials", {}, RuntimeError("server closed the connection unexpectedly"))

    def body(attributes: dict) -> float:
        raise lost

    with pytest.raises(sqlalchemy.exc.OperationalError):
        work.execute(units, claimed, worker, body, lambda: work.Cost(0.0, 0.0, 0, 0))
    (first,) = units.get_trials(deepcopy=False)
    assert first.state == TrialState.FAIL and first.user_attrs["interrupted"] is True
    assert "fail_reason" not in first.user_attrs
    again = work.claim(units, worker, **arguments)
    assert isinstance(again, work.Claim) and again.slot == 0 and again.trial.user_attrs["retry_of"] == 0


def test_a_record_cut_off_part_way_is_completed_not_refused() -> None:
    # One attribute is written at a time: a connection lost after the first leaves a partial record,
    # which must not make every later worker refuse the study (seen with a restarting PostgreSQL).
    study = optuna.create_study(study_name="reproductions:m")
    recorded = {"method": "m", "reproductions": 2, "config_hash": "abc"}
    study.set_user_attr("method", "m")
    work.record_or_check(study, recorded)
    assert study.user_attrs == recorded
    work.record_or_check(study, recorded)  # a resumed worker: all there, all equal
    with pytest.raises(UserInputError, match=r"^study 'reproductions:m' was started with reproductions = 2, now 3: "):
        work.record_or_check(study, {**recorded, "reproductions": 3})
