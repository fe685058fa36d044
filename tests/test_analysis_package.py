"""The judging half (``dmlbench.analysis``): its import direction, and a committed study re-judged from its
committed files alone (``dmlbench rejudge``) giving the comparisons the report writes today."""

import shutil
from pathlib import Path

import pytest
from cli_runner import run_cli
from test_architecture import MODULES, imported_modules

RESULTS = Path(__file__).resolve().parent.parent / "results"
# Every committed study that can be re-judged from its committed files.
STUDIES = sorted(path.name for path in RESULTS.iterdir() if (path / "runs.csv").is_file() and (path / "benchmark.json").is_file())


def test_the_judging_half_imports_nothing_that_runs_a_study() -> None:
    """analysis may use the components' evaluation and the shared modules; protocol, report, the CLI and
    the apps call it, never the reverse (docs/architecture.md, "Two halves")."""
    forbidden = ("protocol", "training", "report", "cli", "deploy", "toy", "data", "sampling", "models", "mining", "losses", "api")
    found = {name: sorted(target for target in imported_modules(path) if target.split(".")[1] in forbidden)
             for name, path in MODULES.items() if name.startswith("dmlbench.analysis")}
    assert set(found) >= {"dmlbench.analysis.statistics", "dmlbench.analysis.verdicts", "dmlbench.analysis.planning"}
    assert {name: targets for name, targets in found.items() if targets} == {}


def test_no_module_of_either_half_is_longer_than_350_lines() -> None:
    long = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()
            if name.startswith(("dmlbench.analysis.", "dmlbench.protocol."))}
    assert {name: lines for name, lines in long.items() if lines > 350} == {}


def test_the_analysis_in_force_is_typed_with_the_defaults_of_the_keys_a_stored_file_lacks() -> None:
    """A committed ``benchmark.json`` written before a key existed (or by a version with a key this one does
    not know) reads as an ``AnalysisSpec``: the missing key at its default, the unknown one left out."""
    from dmlbench.analysis.spec import AnalysisSpec

    spec = AnalysisSpec.in_force({"references": ["contrastive"], "pairs": [["a", "b"]], "written_by_a_later_version": 1})
    assert spec == AnalysisSpec(references=["contrastive"], pairs=[("a", "b")])
    assert (spec.equivalence_margin, spec.search_sd, spec.primary.metric) == (0.01, None, "map_at_r")
    with pytest.raises(ValueError, match="equivalence_margin"):
        AnalysisSpec.in_force({"equivalence_margin": -1})


@pytest.mark.parametrize("study", STUDIES)
def test_every_committed_study_holds_the_verdicts_todays_rules_give(study: str, capsys: pytest.CaptureFixture[str]) -> None:
    """No stale verdict: comparisons.csv, claim_comparisons.csv and method_comparisons.csv of every committed
    study are what `dmlbench rejudge` computes from its runs.csv and benchmark.json alone."""
    code, out, _ = run_cli(["rejudge", str(RESULTS / study), "--check"], capsys)
    assert code == 0, out


@pytest.mark.parametrize("study", STUDIES)
def test_the_judging_package_alone_gives_the_reports_comparisons(study: str) -> None:
    """``analysis.verdicts.judge`` (plain scores in, families out) and the report's own analysis, run by
    ``dmlbench rejudge``, agree on every committed study."""
    from dmlbench.analysis.endpoints import read_score_table
    from dmlbench.analysis.verdicts import rejudged_comparison_csv
    from dmlbench.protocol.design.benchmark_file import read_benchmark
    from dmlbench.protocol.layout import BASELINES

    folder = RESULTS / study
    text = rejudged_comparison_csv(read_score_table(folder / "runs.csv"), read_benchmark(folder).analysis_spec(), BASELINES)
    assert text == (folder / "comparisons.csv").read_text()


def test_rejudge_rewrites_a_stale_comparisons_file_and_check_reports_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "study"
    study.mkdir()
    for name in ("runs.csv", "benchmark.json", "comparisons.csv", "claim_comparisons.csv"):
        shutil.copy(RESULTS / "default_strong_glyphs" / name, study / name)
    committed = (study / "comparisons.csv").read_text()
    lines = committed.splitlines(keepends=True)
    (study / "comparisons.csv").write_text("".join([lines[0], *lines[2:]]))  # one comparison lost
    code, out, _ = run_cli(["rejudge", str(study), "--check"], capsys)
    assert code == 1 and "comparisons.csv: differs" in out
    assert (study / "comparisons.csv").read_text() != committed  # --check writes nothing
    code, out, _ = run_cli(["rejudge", str(study)], capsys)  # the default compares too: committed files are kept
    assert code == 1 and (study / "comparisons.csv").read_text() != committed
    assert run_cli(["rejudge", str(study), "--write"], capsys)[0] == 0
    assert (study / "comparisons.csv").read_text() == committed
    code, _, err = run_cli(["rejudge", str(study), "--write", "--check"], capsys)
    assert code == 2 and "exclude each other" in err


def test_rejudge_without_a_study_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["rejudge", str(tmp_path)], capsys)
    assert code == 2 and err.strip().count("\n") == 0 and "holds no benchmark study" in err


def test_a_damaged_runs_csv_is_one_line_and_exit_2_and_nothing_is_rewritten(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A copy cut short, or with a row that is not a score, is refused naming the file: a verdict from part of
    a study would be a wrong verdict."""
    study = tmp_path / "study"
    study.mkdir()
    for name in ("benchmark.json", "comparisons.csv"):
        shutil.copy(RESULTS / "default" / name, study / name)
    committed = (study / "comparisons.csv").read_text()
    text = (RESULTS / "default" / "runs.csv").read_text()
    for damaged, reason in ((text[:300], "is truncated"), (text.replace(",0.", ",zero.", 1), "line 2 is not a score row")):
        (study / "runs.csv").write_text(damaged)
        code, _, err = run_cli(["rejudge", str(study), "--write"], capsys)
        assert code == 2 and reason in err and err.strip().count("\n") == 0, err
        assert (study / "comparisons.csv").read_text() == committed


@pytest.mark.parametrize("study", ["default", "search_luck_emoji"])
def test_a_partial_runs_csv_is_refused_in_one_line_and_nothing_is_rewritten(study: str, tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """runs.csv cut to its header, to whole rows of part of the study, or by one reproduction's last score: a
    smaller study would re-judge to other verdicts (it once rewrote comparisons.csv to its header, exit 0)."""
    folder = tmp_path / study
    shutil.copytree(RESULTS / study, folder)
    verdicts = {path.name: path.read_text() for path in folder.glob("*comparisons.csv")}
    lines = (RESULTS / study / "runs.csv").read_text().splitlines(keepends=True)
    first_reproduction = lines[1].split(",")[0] + ",0,"
    for partial, reason in ((lines[:1], "holds 0 of the"), (lines[:len(lines) // 2], "reproductions results.csv counts for"),
                            ([line for line in lines if not line.startswith(first_reproduction)],
                             "reproductions results.csv counts for"),
                            (lines[:-1], "reproductions results.csv counts for"),
                            (lines[:-1], "though its others do"),  # from here on: a copy without results.csv
                            (lines[:1], "holds no scores of method")):
        if reason == "though its others do":
            (folder / "results.csv").unlink()
        (folder / "runs.csv").write_text("".join(partial))
        code, _, err = run_cli(["rejudge", str(folder), "--write"], capsys)
        assert code == 2 and reason in err and "git checkout" in err and err.strip().count("\n") == 0, err
        assert {path.name: path.read_text() for path in folder.glob("*comparisons.csv")} == verdicts


def test_a_damaged_search_repeats_csv_is_one_line_and_exit_2_and_nothing_is_rewritten(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A study whose runs.csv predates its search column is judged over the searches from search_repeats.csv:
    a copy of that file cut short, or with a row that has no search mean, is refused naming it (it once gave
    a traceback)."""
    study = tmp_path / "study"
    shutil.copytree(RESULTS / "search_luck_glyphs", study)
    committed = {name: (study / name).read_text() for name in ("comparisons.csv", "method_comparisons.csv")}
    text = (RESULTS / "search_luck_glyphs" / "search_repeats.csv").read_text()
    second_row_end = text.index("\n", text.index("\n", text.index("\n") + 1) + 1)
    broken_row = text[:second_row_end].rsplit(",", 1)[0] + ",zero" + text[second_row_end:]
    for damaged, reason in ((text[:700], "is truncated"), (broken_row, "line 3 is not a row of method, search and")):
        (study / "search_repeats.csv").write_text(damaged)
        code, _, err = run_cli(["rejudge", str(study), "--write"], capsys)
        assert code == 2 and reason in err and err.strip().count("\n") == 0, err
        assert {name: (study / name).read_text() for name in committed} == committed


def test_the_built_in_benchmark_judges_the_methods_sequentially_on_fresh_searches() -> None:
    """The main job's verdicts are about the methods, each search drawing fresh seeds and folds (issue 62): it
    declares no assumed search SD (``analysis.search_sd`` served verdicts resting on one search per method), and
    the search SDs that planned it are those measured with fresh draws (results/search_luck_fresh_method_glyphs)."""
    from dmlbench.protocol.design.benchmark import DEFAULT_BENCHMARK, FRESH_SEEDS, load_spec
    from dmlbench.report.committed import search_variances

    spec = load_spec(DEFAULT_BENCHMARK)
    assert spec.protocol.sequential and spec.protocol.search_seeds == FRESH_SEEDS and spec.analysis.search_sd is None
    found = search_variances(RESULTS / "search_luck_fresh_method_glyphs", ("concatenated", "map_at_r"))
    assert {method.name for method in spec.methods} <= set(found)


def test_a_method_that_scored_nothing_is_no_partial_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A method whose every reproduction failed has no rows in runs.csv nor in results.csv: the study is judged
    without it, not refused as cut short."""
    folder = tmp_path / "default"
    shutil.copytree(RESULTS / "default", folder)
    for name in ("runs.csv", "results.csv"):
        lines = (folder / name).read_text().splitlines(keepends=True)
        (folder / name).write_text("".join(line for line in lines if not line.startswith("triplet_semihard,")))
    code, _, err = run_cli(["rejudge", str(folder)], capsys)
    assert code in (0, 1) and "cut short" not in err, err


def test_a_damaged_results_csv_is_one_line_and_nothing_is_rewritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """results.csv, which the partial-file check counts against, cut short or with a row that is no result: one line,
    exit 2 (it ended in a traceback)."""
    folder = tmp_path / "default"
    shutil.copytree(RESULTS / "default", folder)
    verdicts = (folder / "comparisons.csv").read_text()
    text = (RESULTS / "default" / "results.csv").read_text()
    for damaged, reason in ((text[:300], "is truncated"), ("method,mode\nx,y\n", "line 2 is not a row of method, mode")):
        (folder / "results.csv").write_text(damaged)
        code, _, err = run_cli(["rejudge", str(folder), "--write"], capsys)
        assert code == 2 and reason in err and err.strip().count("\n") == 0, err
        assert (folder / "comparisons.csv").read_text() == verdicts
