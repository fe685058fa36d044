"""``protocol.fold_units``: every fold run of a search trial is its own unit of work, and the benchmark's
results are byte for byte those of trials that train their folds themselves, whoever runs which fold.

The protocol's logic (failures, Ctrl-C, --retry-failed) is checked on the search stage with the fold
runs' training replaced by a deterministic stand-in (seconds); the results, two workers on the folds
of one trial at once and a worker killed mid-fold on real (tiny) benchmarks, in fresh processes.
"""

import dataclasses
import json
import logging
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from cli_runner import cli_exit_code, run_cli
from optuna.trial import FrozenTrial, TrialState
from protocol_fixtures import benchmark_spec, counting_claims, kill_9_once_written, study
from test_cli_process import console_script

from dmlbench.errors import RunInterrupted
from dmlbench.protocol.design.prepare import prepare
from dmlbench.protocol.layout import fold_study
from dmlbench.protocol.queue import attempts
from dmlbench.protocol.queue.storage import open_storage
from dmlbench.protocol.run.schedule import retry_failed_units, run_search_stage
from dmlbench.protocol.units import search
from dmlbench.protocol.units.fold_units import FoldRun
from dmlbench.protocol.units.search import TrialFailed

optuna.logging.set_verbosity(logging.WARNING)

REPO = Path(__file__).resolve().parent.parent
SMOKE = yaml.safe_load((REPO / "configs" / "smoke.yaml").read_text())
METHOD = "contrastive_barrier"
# A built-in loss whose runs, while FOLD_UNITS_BARRIER names a folder, first wait (up to 120 s) until
# runs of two processes have started: trained one after another, the first run of a trial would wait
# the whole time, so a benchmark that ends within it ran two folds at once.
BARRIER_PLUGIN = '''
import os
import time
from pathlib import Path

import dmlbench
from dmlbench.losses.contrastive import ContrastiveLoss


@dmlbench.register_loss("fold_units_barrier")
class Barrier(ContrastiveLoss):
    """The contrastive loss (Hadsell et al. 2006), its runs starting once two processes run one."""

    def __init__(self, margin: float = 1.0) -> None:
        super().__init__(margin)
        folder = os.environ.get("FOLD_UNITS_BARRIER")
        if folder:
            Path(folder, str(os.getpid())).touch()
            deadline = time.monotonic() + 120
            while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
'''
BENCHMARK = {
    "plugins": ["fold_units_barrier.py"],
    "base": SMOKE["base"],
    "protocol": {"folds": 2, "trials": 2, "epochs": 1, "sampler": "tpe", "reproductions": 2},
    "methods": [{"name": METHOD, "overrides": {"loss.name": "fold_units_barrier", "miner.name": None},
                 "search": {"loss.params.margin": {"low": 0.1, "high": 0.6}}}],
}
FOLD_UNITS = "protocol.fold_units=true"


def console(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([console_script(), *args], capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
                          env=None if env is None else {**os.environ, **env})


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("config")
    (folder / "fold_units_barrier.py").write_text(BARRIER_PLUGIN)
    (folder / "bench.yaml").write_text(yaml.safe_dump(BENCHMARK))
    return folder / "bench.yaml"


@pytest.fixture(scope="module")
def reference(config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The benchmark with each trial training its folds itself, one worker (this process)."""
    output = tmp_path_factory.mktemp("reference") / "out"
    assert cli_exit_code(["benchmark", str(config), "-o", str(output), "-q"]) == 0
    return output


def same_results(output: Path, reference: Path) -> None:
    for name in ("results.csv", "runs.csv"):
        assert (output / name).read_bytes() == (reference / name).read_bytes(), name


def trials(output: Path, storage: str | None = None, name: str = METHOD) -> list[dict[str, Any]]:
    """The counted search trials of method ``name`` as the report and everything after it read them
    (their run directories relative to ``output``; their cost's samples, not its times)."""
    def shown(t: FrozenTrial) -> dict[str, Any]:
        kept = {key: value for key, value in t.user_attrs.items() if key not in ("worker", "started", "cost", "heartbeat")}
        kept["run_dirs"] = [str(Path(path).relative_to(output)) for path in kept.get("run_dirs", [])]
        return {"slot": attempts.slot_of(t), "state": t.state.name, "value": t.value, "params": t.params,
                "distributions": t.distributions, "intermediate": t.intermediate_values,
                "samples": t.user_attrs["cost"]["samples_seen"], **kept}

    found = optuna.load_study(study_name=name, storage=open_storage(storage or f"sqlite:///{output / 'study.db'}"))
    return [shown(t) for t in attempts.counted(found)]


def test_fold_units_with_the_median_pruner_are_refused_in_one_line(config: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    pruned = tmp_path / "pruned.yaml"
    pruned.write_text(yaml.safe_dump({**BENCHMARK, "plugins": [str(config.parent / "fold_units_barrier.py")],
                                      "protocol": {**BENCHMARK["protocol"], "fold_units": True, "pruner": "median"}}))
    code, _, err = run_cli(["benchmark", str(pruned), "-o", str(tmp_path / "out")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "key 'protocol': fold_units: true runs a trial's folds at once, but pruner: median" in err, err
    code, _, err = run_cli(["benchmark", str(config), FOLD_UNITS, "protocol.pruner=median", "-o", str(tmp_path / "out")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "pruner: median" in err, err
    assert not (tmp_path / "out").exists()


def test_one_and_two_workers_on_fold_units_give_the_sequential_results(
    config: Path, reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One worker, this process: the dry run's units and looks are the claims it made.
    claims = counting_claims(monkeypatch)
    one = tmp_path / "one"
    assert cli_exit_code(["benchmark", str(config), FOLD_UNITS, "-o", str(one), "-q"]) == 0
    monkeypatch.undo()
    same_results(one, reference)
    assert trials(one) == trials(reference)
    from dmlbench.protocol.dry_run import cost
    from dmlbench.protocol.design.benchmark import load_spec

    estimated = prepare(load_spec(config), tmp_path / "estimate", [FOLD_UNITS])
    unit_costs = {field.name: 0 for field in dataclasses.fields(cost.Measured) if field.name != "method_steps"}
    assert cost.estimate(estimated, cost.Measured(**{**unit_costs, "unit": 1.0})) == claims["worked"] == 2 * 3 + 2 + 2
    assert cost.estimate(estimated, cost.Measured(**{**unit_costs, "look": 1.0})) == claims["looks"]
    folds = optuna.load_study(study_name=fold_study(METHOD), storage=f"sqlite:///{one / 'study.db'}")
    assert sorted(attempts.slot_of(t) for t in attempts.counted(folds)) == [0, 1, 2, 3]  # trial k's fold i: slot 2k + i

    # Two workers (--jobs 2) whose first runs wait for each other: the folds of trial 0 ran at once.
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    two = tmp_path / "two"
    result = console(["benchmark", str(config), FOLD_UNITS, "-o", str(two), "-q", "--jobs", "2"],
                     env={"FOLD_UNITS_BARRIER": str(barrier)})
    assert result.returncode == 0, result.stderr[-3000:]
    same_results(two, reference)
    storage = json.loads((two / "benchmark.json").read_text())["storage"]
    assert trials(two, storage) == trials(reference)
    first, second = sorted((t for t in optuna.load_study(study_name=fold_study(METHOD), storage=open_storage(storage)).trials
                            if t.state == TrialState.COMPLETE and attempts.slot_of(t) in (0, 1)), key=attempts.slot_of)
    assert first.user_attrs["worker"]["pid"] != second.user_attrs["worker"]["pid"]
    assert max(first.datetime_start, second.datetime_start) < min(first.datetime_complete, second.datetime_complete)
    assert json.loads((two / "benchmark.json").read_text())["protocol"]["fold_units"] is True
    assert "fold units" in (two / "report.md").read_text()
    code, out, err = run_cli(["status", str(two)], capsys)
    assert code == 0 and "time left: none" in out, err
    assert [line.split()[1:] for line in out.splitlines() if line.startswith(METHOD)] == [["2", "0", "0", "0", "2/2"]]


def test_the_dry_run_counts_the_folds_busy_and_rehearses_the_report_on_whole_trials(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dmlbench.protocol.dry_run import cost
    from dmlbench.protocol.design.benchmark import load_spec
    from dmlbench.protocol.dry_run.rehearsal import SplitSize, rehearse

    prepared = prepare(load_spec(config), tmp_path / "out", [FOLD_UNITS, "protocol.parallel_trials=2"])
    rehearsed = rehearse(prepared, tmp_path / "rehearsal", SplitSize(images=50, classes=10, width=8))
    assert [t["state"] for t in trials(rehearsed.output_dir, rehearsed.storage)] == ["COMPLETE", "COMPLETE"]
    made_up = {field.name: 0.5 for field in dataclasses.fields(cost.Measured) if field.name != "method_steps"}
    monkeypatch.setattr(cost, "measure", lambda *args, **kwargs: cost.Measured(**{**made_up, "steps_per_epoch": 5, "test_images": 10}))
    assert ("the search keeps at most 4 workers busy (1 search(es) x 2 parallel trial(s) x 2 folds: each fold is a unit "
            "of work, protocol.fold_units)") in cost.dry_run(prepared).splitlines()
    sequential = prepare(load_spec(config), tmp_path / "out", ["protocol.parallel_trials=2"])
    assert "keeps at most 2 workers busy (1 search(es) x 2 parallel trial(s): a trial runs its folds in one worker; " \
           "protocol.fold_units: true makes each fold a unit of work, up to 4)" in cost.dry_run(sequential)


def test_a_worker_killed_mid_fold_is_continued_by_the_same_command_with_the_same_results(
    config: Path, reference: Path, tmp_path: Path,
) -> None:
    output = tmp_path / "out"
    command = [console_script(), "benchmark", str(config), FOLD_UNITS, "-o", str(output), "-q"]
    kill_9_once_written(command, output / METHOD / "trial_0001" / "fold_0" / "metrics.jsonl", REPO)
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    same_results(output, reference)
    folds = optuna.load_study(study_name=fold_study(METHOD), storage=f"sqlite:///{output / 'study.db'}")
    # The fold unit the worker was running (trial 1's fold 0, or fold 1 had fold 0 just ended) was failed as
    # interrupted and taken again with its parameters, its run continued from its checkpoint.
    (killed,) = [t for t in folds.trials if attempts.interrupted(t)]
    assert attempts.slot_of(killed) in (2, 3)
    assert killed.params == next(t for t in attempts.counted(folds) if attempts.slot_of(t) == attempts.slot_of(killed)).params


# The search stage alone, its fold runs a deterministic stand-in for training (no run is trained).
STAND_IN = benchmark_spec(SMOKE["base"], {"name": "m", "overrides": {"loss.name": "contrastive", "miner.name": None},
                                          "search": {"loss.params.margin": {"low": 0.1, "high": 0.6}}},
                          folds=3, trials=3, epochs=1, sampler="tpe", reproductions=2)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., list[tuple[int, int]]]]:
    """Replaces the training of fold runs: ``stand_in(fail=..., stop=...)`` makes fold ``(trial, fold)``
    ``fail`` (a non-finite score) and ``stop`` (Ctrl-C, once); returns the ``(trial, fold)`` it trained."""
    def install(fail: tuple[int, int] | None = None, stop: tuple[int, int] | None = None) -> list[tuple[int, int]]:
        trained: list[tuple[int, int]] = []

        def train_fold(plan: Any, context: Any, slot: int, fold: Any, assignment: Any, features: Any,
                       samples: list[int]) -> FoldRun:
            if (slot, fold.index) == stop and stop not in trained:
                trained.append(stop)
                raise KeyboardInterrupt
            trained.append((slot, fold.index))
            samples.append(100 + fold.index)
            if (slot, fold.index) == fail:
                raise TrialFailed(f"fold {fold.index}: no finite validation map_at_r (best checkpoint: 0)")
            score = 0.3 + assignment["loss.params.margin"] / 3 + fold.index / 100
            return FoldRun(score, str(context.output_dir / f"{slot}_{fold.index}"), 1 + fold.index, {"map_at_r": [0.1, score]})

        monkeypatch.setattr(search, "train_fold", train_fold)
        return trained

    yield install


def searched(output: Path, *overrides: str) -> list[dict[str, Any]]:
    run_search_stage(prepare(STAND_IN, output, list(overrides)), progress=False)
    return trials(output, name="m")


def test_a_failing_fold_fails_its_trial_with_its_reason_and_the_folds_after_it_are_skipped(
    stand_in: Callable[..., list[tuple[int, int]]], tmp_path: Path,
) -> None:
    stand_in(fail=(1, 1))
    sequential = searched(tmp_path / "sequential")
    trained = stand_in(fail=(1, 1))
    as_units = searched(tmp_path / "units", FOLD_UNITS)
    assert as_units == sequential
    assert [t["state"] for t in as_units] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert as_units[1]["fail_reason"] == "TrialFailed: fold 1: no finite validation map_at_r (best checkpoint: 0)"
    assert (1, 2) not in trained  # one worker: the fold after the failed one is skipped, not trained
    folds = {attempts.slot_of(t): t for t in attempts.counted(study(tmp_path / "units", fold_study("m")))}
    assert folds[5].state == TrialState.FAIL and folds[5].user_attrs["fail_reason"] == "skipped: fold 1 of trial 1 failed"

    # benchmark --retry-failed: the failed trial's failed and skipped folds run again, its done fold is kept.
    for output, overrides in ((tmp_path / "sequential", []), (tmp_path / "units", [FOLD_UNITS])):
        assert retry_failed_units(prepare(STAND_IN, output, overrides)) == (1 if not overrides else 3)
    stand_in()
    sequential = searched(tmp_path / "sequential")
    trained = stand_in()
    assert searched(tmp_path / "units", FOLD_UNITS) == sequential
    assert trained == [(1, 1), (1, 2)] and [t["state"] for t in sequential] == ["COMPLETE"] * 3


def test_ctrl_c_mid_fold_then_the_same_search_again_gives_the_uninterrupted_trials(
    stand_in: Callable[..., list[tuple[int, int]]], tmp_path: Path,
) -> None:
    stand_in()
    uninterrupted = searched(tmp_path / "uninterrupted", FOLD_UNITS)
    trained = stand_in(stop=(1, 1))
    with pytest.raises(RunInterrupted):
        searched(tmp_path / "stopped", FOLD_UNITS)
    assert searched(tmp_path / "stopped", FOLD_UNITS) == uninterrupted
    assert trained.count((1, 1)) == 2 and len(trained) == 3 * 3 + 1  # only the stopped fold ran twice
    stopped = [t for t in study(tmp_path / "stopped", fold_study("m")).trials if attempts.interrupted(t)]
    assert [(attempts.slot_of(t), t.user_attrs["interrupted_reason"]) for t in stopped] == [(4, "interrupted: stopped by the user")]
