"""``dmlbench benchmark`` as a new user meets it (issue 32): too few reproductions refused, the output
folder named at the start and the report's summary (not the whole report) at the end, a stop in the
first seconds printing the command that continues, and the dry run's estimate built from the
scheduler's real amount of work."""

import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from cli_runner import run_cli
from protocol_fixtures import counting_claims
from test_cli_process import console_script, run

from dmlbench.cli.benchmark import SUMMARY_LINES, continue_command, report_summary
from dmlbench.cli.common import process_started
from dmlbench.protocol import layout
from dmlbench.protocol.design.benchmark import DEFAULT_BENCHMARK, load_spec
from dmlbench.protocol.design.prepare import prepare
from dmlbench.protocol.dry_run import cost, timings
from dmlbench.protocol.dry_run.rehearsal import SplitSize, rehearse
from dmlbench.protocol.queue import attempts
from dmlbench.report import write_report

IMPORTED = time.monotonic()  # after this process started, before any test ran
REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "configs" / "smoke.yaml"
TOO_FEW = "'protocol.reproductions': 1 is too few: intervals and paired tests need at least 2 reproductions"


def test_one_reproduction_is_refused_on_the_command_line_and_in_the_yaml(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["benchmark", str(SMOKE), "protocol.reproductions=1", "-o", str(tmp_path / "a")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and TOO_FEW in err, err
    spec = yaml.safe_load(SMOKE.read_text())
    spec["protocol"]["reproductions"] = 1
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(spec))
    code, _, err = run_cli(["benchmark", str(tmp_path / "one.yaml"), "-o", str(tmp_path / "b")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and TOO_FEW in err and "one.yaml" in err, err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    code, _, err = run_cli(["benchmark", str(SMOKE), "protocol.reproductions=2", "-o", str(tmp_path / "c"), "--dry-run"],
                           capsys)
    assert code == 0, err


@pytest.mark.parametrize("path", [DEFAULT_BENCHMARK, *sorted((REPO / "configs").glob("*.yaml")),
                                  *sorted((REPO / "examples").glob("*.yaml"))], ids=lambda path: path.name)
def test_every_committed_benchmark_has_at_least_two_reproductions(path: Path) -> None:
    if "methods" not in (yaml.safe_load(path.read_text()) or {}):
        pytest.skip(f"{path.name} is a run config, not a benchmark")
    assert load_spec(path).protocol.reproductions >= 2


def _torch_loaded(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see the process load torch")
def test_sigterm_in_the_first_seconds_prints_the_command_that_continues(tmp_path: Path) -> None:
    """Stopped while it still imports torch (before any check or file): the same line as later, with
    the exact command."""
    output = tmp_path / "bench"
    process = subprocess.Popen([console_script(), "benchmark", str(SMOKE), "-o", str(output), "-q"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _torch_loaded(process.pid):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "torch was never loaded"
        time.sleep(0.005)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    expected = continue_command("benchmark", SMOKE, [], output, None, quiet=True)
    assert stderr.strip() == f"dmlbench: interrupted (SIGTERM): benchmark {output} stopped; continue it with: {expected}"
    assert not (output / "benchmark.json").exists()


def test_report_summary_is_the_summary_section_or_else_the_leaderboard() -> None:
    table = ["| method | MAP@R (con.) | n |", "| --- | --- | --- |", "| a | 10.00 ± 1.00 | 3 |", "| b | 9.00 ± 1.00 | 3 |"]
    with_summary = ["# report", "", "provenance", "", "## Summary", "", "5 methods, 3 reproductions.", "",
                    *[f"- Against `r{index}`: better: a." for index in range(20)], "", "## Results", "", *table]
    summary = report_summary("\n".join(with_summary)).splitlines()
    assert summary == ["5 methods, 3 reproductions.", *[f"- Against `r{index}`: better: a." for index in range(11)]]
    assert len(summary) == SUMMARY_LINES
    assert report_summary("\n".join(["# report", "", "provenance", "", *table, "", "## Plots", "| not | this |"])) \
        == "\n".join(table)


@pytest.mark.parametrize(("repeats", "baselines"), [(1, ["untrained"]), (2, ["untrained", "raw_pixels"])])
def test_a_benchmark_names_its_folder_first_prints_its_summary_and_the_estimate_counts_its_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, repeats: int, baselines: list[str]
) -> None:
    """One real (small) benchmark: the output folder is the first line on stderr, stdout ends with the
    report's summary and its paths, not the whole report.md; the dry run's counts of units, looks at
    finished studies and studies are exactly the scheduler's claims and studies in that run; and the
    rehearsal it times the report on stores what that run stored. A repeated search costs what a method
    does (the estimate once counted each method's search once, whatever ``protocol.search_repeats``), and
    each baseline its own study and units (the looks once assumed one baseline)."""
    claims = counting_claims(monkeypatch)
    output = tmp_path / "out"
    overrides = ["protocol.trials=1", "protocol.reproductions=2", f"protocol.search_repeats={repeats}",
                 f"protocol.baselines=[{','.join(baselines)}]"]
    code, out, err = run_cli(["benchmark", str(SMOKE), *overrides, "-o", str(output)], capsys)
    assert code == 0, err
    assert err.splitlines()[0] == f"output: {output} (report.md and report.html at the end)"
    summary = report_summary((output / "report.md").read_text(), SMOKE, overrides)
    assert 0 < len(summary.splitlines()) <= SUMMARY_LINES and "## " not in out
    # Two reproductions (or searches) decide nothing: the summary gives the design that would, as this command
    # with its own values of the keys that design sets.
    if repeats == 1:
        needed = re.search(r"To decide the 1 undecided comparison\(s\): (\d+) reproductions per method", summary)
        assert needed is not None and int(needed.group(1)) > 2, summary
        assert (f"`dmlbench benchmark {SMOKE} protocol.trials=1 protocol.search_repeats=1 {shlex.quote(overrides[-1])} "
                f"protocol.reproductions={needed.group(1)} -o NEW_DIR`") in summary
    else:
        design = re.search(r"To decide the 1 undecided comparison\(s\) about the methods, search luck included: (\d+) searches "
                           r"x (\d+) reproductions per method", summary)
        assert design is not None, summary
        assert (f"`dmlbench benchmark {SMOKE} protocol.trials=1 {shlex.quote(overrides[-1])} protocol.search_repeats="
                f"{design.group(1)} protocol.reproductions={design.group(2)} -o NEW_DIR`") in summary
    assert out.endswith(f"{summary}\nreport: {output / 'report.md'} {output / 'report.html'}; "
                        f"results: {output / 'results.csv'}\n")

    prepared = prepare(load_spec(SMOKE), tmp_path / "estimate", overrides)
    zero = {field.name: 0 for field in fields(cost.Measured) if field.name != "method_steps"}
    methods, folds = repeats * len(prepared.plans), prepared.spec.protocol.folds
    assert cost.estimate(prepared, cost.Measured(**{**zero, "unit": 1.0})) == claims["worked"] == methods * 3 + 2 * len(baselines)
    assert cost.estimate(prepared, cost.Measured(**{**zero, "look": 1.0})) == claims["looks"]
    # Every training run costs its overhead once; the untrained baseline builds one model per reproduction
    # and embeds the test split once for all its folds, as the raw pixels do.
    assert cost.estimate(prepared, cost.Measured(**{**zero, "run_overhead": 1.0})) == methods * 3 * folds
    assert cost.estimate(prepared, cost.Measured(**{**zero, "setup": 1.0})) == 2
    test_images = 10
    embedding = cost.Measured(**{**zero, "embed_per_image": 1.0, "test_images": test_images})
    assert cost.estimate(prepared, embedding) == test_images * 2 * (methods * folds + len(baselines))
    assert cost.estimate(prepared, cost.Measured(**{**zero, "startup": 7.0})) == 7.0
    # Each method's runs at its own step: the second method's three times the first's.
    second = list(prepared.plans)[1]
    epochs = next(iter(prepared.configs.values())).training.epochs
    stepped = cost.Measured(**{**zero, "step": 1.0, "steps_per_epoch": 1, "method_steps": {second: 3.0}})
    assert cost.estimate(prepared, stepped) == repeats * 3 * folds * epochs * (1.0 + 3.0)
    # Once each: the storage's creation and the report; per reproduction its per-class sums, per fold run of one
    # its opening and embedding-space analysis.
    assert cost.estimate(prepared, cost.Measured(**{**zero, "storage_setup": 1.0})) == 1.0
    assert cost.estimate(prepared, cost.Measured(**{**zero, "report": 1.0})) == 1.0
    assert cost.estimate(prepared, cost.Measured(**{**zero, "class_sums": 1.0})) == methods * 2
    assert cost.estimate(prepared, cost.Measured(**{**zero, "fold_run": 1.0})) == methods * 2 * folds

    # The rehearsal the dry run times the report on stores what this real run stored: the same studies, trials
    # (slot, state) and attributes, and the report made from it has the same files and sections.
    rehearsed = rehearse(prepared, tmp_path / "rehearsal", SplitSize(images=50, classes=10, width=8))
    assert _stored(rehearsed.storage) == _stored(f"sqlite:///{output / layout.SQLITE_FILE}")
    written = write_report(rehearsed.output_dir, rehearsed.storage)
    assert {"forest.png", "class_bootstrap.csv"} <= set(written) and all((output / name).is_file() for name in written)
    headings = [[line for line in (directory / "report.md").read_text().splitlines() if line.startswith("#")]
                for directory in (rehearsed.output_dir, output)]
    assert headings[0] == headings[1] and len(headings[0]) > 5


def _stored(url: str) -> dict[str, tuple[list[str], list[tuple[int, str, object]]]]:
    """Per study of a storage: its attributes' names (less the worker's and the report's marks) and, per
    trial, its slot, state and the shape of its attributes (``_shape``)."""
    import optuna

    stored = {}
    for summary in optuna.get_all_study_summaries(url):
        study = optuna.load_study(study_name=summary.study_name, storage=url)
        names = sorted(name for name in study.user_attrs if not name.startswith("worker:") and name != "report")
        stored[summary.study_name] = (names, [(attempts.slot_of(trial), trial.state.name, _shape(trial.user_attrs))
                                              for trial in study.get_trials()])
    return stored


def _shape(value: object) -> object:
    """A stored value's keys and types, lists by their first item (their lengths depend on the test split)."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items() if key not in ("worker", "started")}
    if isinstance(value, list):
        return ["list", _shape(value[0]) if value else None]
    return "number" if isinstance(value, (int, float)) else type(value).__name__


def test_the_step_timing_runs_the_training_loops_steps_across_epochs(tmp_path: Path) -> None:
    """The dry run times the loop's own steps under a step budget: an epoch shorter than the budget
    goes on into the next epochs, and the steps train the model exactly as a run's epochs do."""
    import torch
    from training_fixtures import TINY

    from dmlbench import config as config_module
    from dmlbench.training import train
    from dmlbench.training.loop import ImageBatches, time_steps
    from dmlbench.training.setup import set_up_training

    config = config_module.load(None, [*TINY, "training.max_steps_per_epoch=2", "miner.name=random", "training.device=cpu"])
    cpu = torch.device("cpu")
    setup = set_up_training(config, cpu)
    epochs: list[int] = []
    set_epoch = setup.sampler.set_epoch
    setup.sampler.set_epoch = lambda epoch: (epochs.append(epoch), set_epoch(epoch))  # type: ignore[method-assign]
    seconds = time_steps(config, ImageBatches(config, setup), cpu, 4)
    assert len(seconds) == 4 and all(value > 0 for value in seconds) and epochs == [1, 2]
    # Four timed steps = the two epochs of two steps of a real run (validation changes no weight).
    run = train(config, tmp_path / "run", progress=False)
    trained = torch.load(run.run_dir / "checkpoint_last.pt", weights_only=False)["model"]
    for name, tensor in setup.components.model.state_dict().items():
        assert torch.equal(tensor, trained[name]), name


def test_the_dry_run_prints_its_pieces_and_an_estimate(tmp_path: Path) -> None:
    result = run("benchmark", str(SMOKE), "-o", str(tmp_path / "out"), "--dry-run")
    assert result.returncode == 0, result.stderr
    measured = next(line for line in result.stdout.splitlines() if line.startswith("measured here"))
    assert f"median of {timings.TIMED_STEPS} after {timings.WARMUP_STEPS} warm-up steps" in measured and "s to start" in measured
    assert "s for the report (" in measured and "s to create it" in measured and "per-class sums" in measured
    assert "estimate: 0 h " in result.stdout and not (tmp_path / "out").exists()


def test_the_dry_run_times_the_report_writer_it_is_given_once_on_a_stored_benchmark(tmp_path: Path) -> None:
    """The CLI hands the dry run its report writer (``protocol`` never imports ``report``): called once,
    on a benchmark stored in a throw-away folder, the time inside it is the report's piece, and nothing
    is stored where the benchmark would be."""
    prepared = prepare(load_spec(SMOKE), tmp_path / "out", ["protocol.trials=1"])
    calls: list[tuple[Path, float, list[str]]] = []

    def writer(output_dir: Path, storage: str) -> dict[str, Path]:
        started = time.perf_counter()
        written = write_report(output_dir, storage)
        calls.append((output_dir, time.perf_counter() - started, sorted(written)))
        return written

    measured = cost.measure(prepared, 0.0, report=writer)
    assert len(calls) == 1, calls
    output_dir, inside, written = calls[0]
    assert {"report.md", "report.html", "results.csv", "comparisons.csv"} <= set(written)
    assert measured.report >= inside > 0 and output_dir != prepared.output_dir
    assert not output_dir.exists() and not prepared.output_dir.exists()  # the rehearsal was thrown away


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the process's start time is read from /proc")
def test_the_dry_run_counts_from_the_process_start_not_the_command_start() -> None:
    """The estimate's start is the interpreter's (this test process started before this module was
    imported), not the moment the command began."""
    started = process_started()
    assert started <= IMPORTED < time.monotonic()
    # A process started now is younger than this one: its start is later.
    child = subprocess.run([sys.executable, "-c", "import time; from dmlbench.cli.common import process_started; "
                            "print(time.monotonic() - process_started())"], capture_output=True, text=True, check=True)
    assert 0.0 < float(child.stdout) < time.monotonic() - started


def test_only_the_console_script_counts_from_the_process_start(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A call from Python (a notebook, a test) may come hours after its process started: its dry run
    counts from the call; the console script's process runs only this command and counts from its start."""
    import dmlbench.cli as cli

    calls: list[float] = []

    def recorded() -> float:
        calls.append(time.monotonic())
        return calls[-1]

    monkeypatch.setattr(cli, "process_started", recorded)
    assert run_cli(["--version"], capsys)[0] == 0 and calls == []
    monkeypatch.setattr(sys, "argv", ["dmlbench", "--version"])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code in (0, None) and len(calls) == 1
    capsys.readouterr()


def test_a_stopped_dry_run_is_repeated_as_one() -> None:
    assert continue_command("benchmark", SMOKE, ["a=1"], Path("o"), None, dry_run=True).endswith("a=1 -o o --dry-run")


def test_more_jobs_than_cores_warns_once_and_the_report_is_announced_once(tmp_path: Path) -> None:
    """``--jobs 3`` with 2 cores allowed (``taskset``): one warning naming both numbers, and the workers the command
    spawned leave the "another worker wrote the report" line to the process the user started (it was printed by
    every worker)."""
    import shutil

    if shutil.which("taskset") is None:
        pytest.skip("taskset (util-linux) is not installed")
    result = subprocess.run(["taskset", "-c", "0,1", console_script(), "benchmark", str(SMOKE), "-o", str(tmp_path / "out"),
                             "-q", "--jobs", "3"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines.count("dmlbench: warning: --jobs 3 starts 3 workers on the 2 core(s) this process may use; they share "
                       "the cores and the benchmark takes longer than with --jobs 2 (or --jobs auto)") == 1, lines
    assert sum("wrote the report" in line for line in lines) <= 1, lines


def test_the_dry_run_of_many_search_repeats_rehearses_two_and_extrapolates(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A dry run once rehearsed every unit of the design (68 searches x 2: not done after 18 minutes); now the
    report is timed with 2 search repeats and with 1, each further repeat at their difference."""
    prepared = prepare(load_spec(SMOKE), tmp_path / "out", ["protocol.search_repeats=30"])
    rehearsed: list[int] = []
    report_seconds = {2: 5.0, 1: 3.5}  # made-up report times of the two rehearsals

    def counted(prepared_: object, directory: Path, test: object) -> object:
        rehearsed.append(prepared_.spec.protocol.search_repeats)  # type: ignore[attr-defined]
        return prepared_

    clock = iter([0.0, report_seconds[2], 0.0, report_seconds[1]])
    monkeypatch.setattr(cost, "rehearse", counted)
    monkeypatch.setattr(cost.time, "perf_counter", lambda: next(clock))
    seconds = cost._report_seconds(prepared, tmp_path / "rehearsal", SplitSize(10, 2, 4), lambda *_: {})
    assert rehearsed == [2, 1]
    assert seconds == 5.0 + 28 * (5.0 - 3.5)


def test_a_stopped_dry_run_says_it_stored_nothing_and_is_run_again() -> None:
    from dmlbench.cli.benchmark import stops_explained
    from dmlbench.errors import RunInterrupted

    with pytest.raises(RunInterrupted) as stopped:
        with stops_explained("benchmark out", "dmlbench benchmark -o out --dry-run", dry_run=True):
            raise KeyboardInterrupt
    assert str(stopped.value) == ("the dry run of benchmark out stopped; it stored nothing, so there is nothing to "
                                  "continue; run it again with: dmlbench benchmark -o out --dry-run")
