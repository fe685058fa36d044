"""A sequential study run by ``dmlbench benchmark`` (``protocol.sequential``): rounds of searches, the comparisons
judged after each, ``--max-searches`` and ``--budget`` stopping between rounds, the same command continuing to the
same bytes, and the design's keys checked."""

import csv
import shutil
import time
from pathlib import Path

import pytest

from cli_runner import run_cli
from protocol_fixtures import kill_9_once_written
from test_cli_process import console_script

from dmlbench.protocol import layout
from dmlbench.protocol.design.benchmark import load_spec
from dmlbench.protocol.run import rounds
from dmlbench.protocol.run.rounds import union_seconds

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "configs" / "smoke.yaml"
# The smoke benchmark as a sequential study: looks after 2 and 4 searches of each method.
SEQUENTIAL = ["protocol.sequential=true", "protocol.max_searches=4", "protocol.round_searches=2"]
COMPARED = (layout.RUNS_CSV, layout.RESULTS_CSV, layout.SEQUENTIAL_CSV)


def _searches(output: Path) -> dict[str, int]:
    """Searches per method in ``runs.csv``."""
    found: dict[str, set[int]] = {}
    with (output / layout.RUNS_CSV).open() as stream:
        for row in csv.DictReader(stream):
            found.setdefault(row["method"], set()).add(int(row["search"]))
    return {method: len(searches) for method, searches in found.items()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke benchmark run as a sequential study to its end, in one command."""
    output = tmp_path_factory.mktemp("sequential") / "study"
    from dmlbench.cli import main

    try:
        main(["benchmark", str(SMOKE), *SEQUENTIAL, "-o", str(output), "-q"])
    except SystemExit as exit_:
        assert exit_.code in (0, None)
    return output


def test_a_sequential_study_runs_in_rounds_and_reports_its_looks(finished: Path) -> None:
    assert _searches(finished) == {"triplet_semihard": 4, "normalized_softmax": 4, "untrained": 1}
    with (finished / layout.SEQUENTIAL_CSV).open() as stream:
        looks = list(csv.DictReader(stream))
    assert [(row["a"], row["b"], row["look"], row["searches"]) for row in looks] == [
        ("triplet_semihard", "normalized_softmax", "1", "2"), ("triplet_semihard", "normalized_softmax", "2", "4")]
    assert looks[0]["decision"] == "continue" and looks[1]["decision"] in ("better", "worse", "equivalent", "inconclusive")
    report = (finished / layout.REPORT_FILE).read_text()
    assert "## Sequential verdicts" in report and "judged about the methods by a sequential study" in report
    assert (finished / layout.SEQUENTIAL_FIGURE).is_file()
    # Fixed-design verdicts over searches that stopped when decided would not keep their error rate: none written.
    assert not (finished / layout.METHOD_COMPARISONS_CSV).exists()


def test_max_searches_stops_between_rounds_and_the_same_command_continues_to_the_same_bytes(
        finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "study"
    code, _, err = run_cli(["benchmark", str(SMOKE), *SEQUENTIAL, "-o", str(output), "-q", "--max-searches", "3"], capsys)
    assert code == 0, err
    assert "sequential study: 0 of 1 primary comparisons decided after 1 look(s), 4 searches in all" in err
    assert "the next look needs more than --max-searches 3" in err and "open after 2 searches" in err
    assert _searches(output) == {"triplet_semihard": 2, "normalized_softmax": 2, "untrained": 1}
    code, _, err = run_cli(["benchmark", str(SMOKE), *SEQUENTIAL, "-o", str(output), "-q"], capsys)
    assert code == 0, err
    for name in COMPARED:
        assert (output / name).read_bytes() == (finished / name).read_bytes(), name


def test_a_budget_stops_before_a_round_it_cannot_pay_for(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The first round fits in 10 minutes; after it the study's clock reads an hour later, so the round at the cost
    per search it measured cannot end within the budget: the study stops and reports what is open."""
    class LaterClock:
        @staticmethod
        def time() -> float:
            return time.time() + 3600

    monkeypatch.setattr(rounds, "time", LaterClock)
    output = tmp_path / "study"
    code, _, err = run_cli(["benchmark", str(SMOKE), *SEQUENTIAL, "-o", str(output), "-q", "--budget", "10m"], capsys)
    assert code == 0, err
    assert "the next round does not fit in the budget of 10.0 min" in err
    assert _searches(output)["triplet_semihard"] == 2


def test_a_budget_below_the_first_rounds_cost_runs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "study"
    code, out, err = run_cli(["benchmark", str(SMOKE), *SEQUENTIAL, "-o", str(output), "-q", "--budget", "1s"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("dmlbench: error: --budget of 1 s is less than the first round needs here (2 searches of "
                          "each method, about "), err
    assert err.rstrip().endswith("nothing was run; a larger --budget runs it"), err
    assert len(err.strip().splitlines()) == 1 and not list(layout.fold_run_dirs(output))


@pytest.mark.parametrize(("arguments", "message"), [
    (["--budget", "soon"], "--budget must be a duration such as 30m, 2h, 1h30m or 90s, got 'soon'"),
    (["--budget", "0m"], "--budget must be longer than 0 s"),
    (["--max-searches", "1"], "--max-searches must be at least 2"),
])
def test_bad_budgets_are_refused(arguments: list[str], message: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["benchmark", str(SMOKE), *SEQUENTIAL, "-o", str(tmp_path / "x"), *arguments], capsys)
    assert code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize(("arguments", "named"), [
    (["--budget", "30m"], "--budget spends"),
    (["--max-searches", "4"], "--max-searches spends"),
    (["--budget", "30m", "--max-searches", "4"], "--budget and --max-searches spend"),
])
def test_a_budget_needs_a_sequential_study(arguments: list[str], named: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The refusal names the options given, and nothing is written."""
    code, _, err = run_cli(["benchmark", str(SMOKE), "-o", str(tmp_path / "x"), *arguments], capsys)
    assert code == 2 and f"{named} a sequential study's rounds: the config needs protocol.sequential: true" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(("overrides", "message"), [
    (["protocol.sequential=true"], "sequential: true needs max_searches"),
    (["protocol.max_searches=6"], "max_searches is the most searches of a sequential study"),
    ([*SEQUENTIAL, "protocol.search_repeats=3"], "leave out search_repeats"),
    ([*SEQUENTIAL, "protocol.search_seeds=shared"], "a sequential study needs independent searches"),
    (["protocol.sequential=true", "protocol.max_searches=2", "protocol.round_searches=3"],
     "max_searches (2) must be at least round_searches (3)"),
])
def test_the_design_keys_are_checked(overrides: list[str], message: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["benchmark", str(SMOKE), *overrides, "-o", str(tmp_path / "x")], capsys)
    assert code == 2 and message in err, err


def test_a_sequential_spec_runs_up_to_max_searches() -> None:
    from dmlbench.protocol.design.benchmark import apply_spec_overrides

    spec, _ = apply_spec_overrides(load_spec(SMOKE), SEQUENTIAL)
    assert spec.protocol.search_repeats == 4 and spec.protocol.resplits and spec.protocol.fresh_draws


def test_an_override_of_a_sequential_configs_design_moves_its_searches() -> None:
    """The built-in benchmark is sequential: its most searches, or the fixed design instead, are overrides like
    any other (the searches it derives from max_searches are not the user's search_repeats)."""
    from dmlbench.protocol.design.benchmark import apply_spec_overrides

    built_in = load_spec(None)
    assert built_in.protocol.sequential and built_in.protocol.search_repeats == built_in.protocol.max_searches == 12
    fewer, _ = apply_spec_overrides(built_in, ["protocol.max_searches=6"])
    assert fewer.protocol.search_repeats == fewer.protocol.max_searches == 6
    fixed, _ = apply_spec_overrides(built_in, ["protocol.sequential=false", "protocol.max_searches=null"])
    assert not fixed.protocol.sequential and fixed.protocol.search_repeats == 1
    with pytest.raises(Exception, match="leave out search_repeats"):
        apply_spec_overrides(built_in, ["protocol.search_repeats=3"])


def test_the_study_time_is_the_union_of_the_commands_spans() -> None:
    assert union_seconds([[0.0, 10.0], [5.0, 12.0], [20.0, 25.0]]) == 17.0
    assert union_seconds([[3.0, 4.0], [0.0, 10.0]]) == 10.0
    assert union_seconds([]) == 0.0


@pytest.mark.slow
def test_two_workers_and_a_kill_mid_round_give_the_same_bytes(finished: Path, tmp_path: Path) -> None:
    """``--jobs 2``, SIGKILLed once the second round's first search run exists, then the same command: the bytes of
    the study run in one go (``pytest -m slow tests/test_sequential_study.py``)."""
    output = tmp_path / "study"
    command = [console_script(), "benchmark", str(SMOKE), *SEQUENTIAL, "-o", str(output), "-q", "--jobs", "2"]
    kill_9_once_written(command, output / f"triplet_semihard{layout.SEARCH_REPEAT_MARK}2", REPO)
    import subprocess

    finished_run = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=900)
    assert finished_run.returncode == 0, finished_run.stderr
    for name in COMPARED:
        assert (output / name).read_bytes() == (finished / name).read_bytes(), name
    shutil.rmtree(output)


def test_status_shows_the_round_and_each_comparison(finished: Path) -> None:
    from dmlbench.protocol.inspection.status import status_lines

    lines = status_lines(finished, None)
    assert "sequential study: round 2 of at most 2 started (looks at 2, 4 searches); 2 look(s) judged" in lines
    assert any(line.startswith("  triplet_semihard vs normalized_softmax: ") and line.endswith(" at 4 searches")
               for line in lines), lines


def test_plan_simulates_the_stopping_time_at_a_pilots_means(finished: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["plan", str(SMOKE), *SEQUENTIAL, "--pilot", str(finished)], capsys)
    assert code == 0, err
    assert "sequential design: looks at 2, 4 searches per method (pocock-type spending, alpha 0.05, Holm over 1" in out
    assert "triplet_semihard vs normalized_softmax (difference " in out and "stops after " in out
    assert "against 8 for the fixed design" in out
    code, out, _ = run_cli(["plan", str(SMOKE), *SEQUENTIAL, "--sd", "0.01"], capsys)
    assert code == 0 and "give --pilot DIR" in out


def test_a_committed_sequential_study_is_rejudged_from_its_files(finished: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The report folder alone (runs.csv, benchmark.json) gives the same sequential.csv, and no fixed-design
    method_comparisons.csv; a changed look is rewritten by --write."""
    folder = tmp_path / "committed"
    code, _, err = run_cli(["report", str(finished), "-o", str(folder)], capsys)
    assert code == 0, err
    code, out, err = run_cli(["rejudge", str(folder)], capsys)
    assert code == 0 and layout.SEQUENTIAL_CSV in out and "the same as today's rules give" in out, (out, err)
    assert layout.METHOD_COMPARISONS_CSV not in out
    (folder / layout.SEQUENTIAL_CSV).write_text("damaged\n")
    code, out, _ = run_cli(["rejudge", str(folder), "--write"], capsys)
    assert code == 0 and (folder / layout.SEQUENTIAL_CSV).read_bytes() == (finished / layout.SEQUENTIAL_CSV).read_bytes()
