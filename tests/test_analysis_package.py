"""The judging half (``dmlbench.analysis``): its import direction, and a committed study re-judged from its
committed files alone (``dmlbench rejudge``) giving the comparisons the report writes today."""

import shutil
from pathlib import Path

import pytest

from cli_runner import run_cli
from test_architecture import MODULES, imported_modules

RESULTS = Path(__file__).resolve().parent.parent / "results"
# Studies whose comparisons.csv the report wrote under today's family rules (the older ones are re-judged
# by `dmlbench rejudge` and regenerated with their READMEs).
CURRENT_STUDIES = ("converged_glyphs_strong", "default_strong_glyphs", "fixed_lr_converged_glyphs", "fixed_lr_short_glyphs",
                   "lr_search_short_glyphs", "reality_check_emoji", "search_luck_glyphs")


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


@pytest.mark.parametrize("study", CURRENT_STUDIES)
def test_a_committed_study_rejudged_from_its_files_gives_its_comparisons(study: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["rejudge", str(RESULTS / study), "--check"], capsys)
    assert code == 0, out


def test_rejudge_rewrites_a_stale_comparisons_file_and_check_reports_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "study"
    study.mkdir()
    for name in ("runs.csv", "benchmark.json", "comparisons.csv"):
        shutil.copy(RESULTS / "default_strong_glyphs" / name, study / name)
    committed = (study / "comparisons.csv").read_text()
    lines = committed.splitlines(keepends=True)
    (study / "comparisons.csv").write_text("".join([lines[0], *lines[2:]]))  # one comparison lost
    code, out, _ = run_cli(["rejudge", str(study), "--check"], capsys)
    assert code == 1 and "1 rows differ" in out
    assert (study / "comparisons.csv").read_text() != committed  # --check writes nothing
    assert run_cli(["rejudge", str(study)], capsys)[0] == 0
    assert (study / "comparisons.csv").read_text() == committed


def test_rejudge_without_a_study_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["rejudge", str(tmp_path)], capsys)
    assert code == 2 and err.strip().count("\n") == 0 and "holds no benchmark study" in err
