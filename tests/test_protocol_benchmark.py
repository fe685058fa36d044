"""``dmlbench benchmark`` / ``search`` / ``report`` / ``audit``: the whole protocol (seed 001 §3) end to end."""

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from cli_runner import run_cli
from protocol_fixtures import kill_9_once_written
from test_cli_process import console_script

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parent.parent
BASE = {
    "data": {"name": "glyphs", "options": {"max_classes": 40, "augmentations_per_font": 0, "image_size": 16}},
    "model": {"trunk": "small_cnn", "embedding_dim": 16, "options": {"width": 8}},
    "sampler": {"name": "spc", "params": {"samples_per_class": 4}},
    "training": {"epochs": 1, "batch_size": 32, "max_steps_per_epoch": 2, "num_threads": 1},
    "evaluation": {"metrics": ["precision_at_1", "r_precision", "map_at_r"]},
}
PROTOCOL = {"folds": 2, "trials": 2, "reproductions": 2, "sampler": "tpe", "first_seed": 100}
METHODS = [
    {"name": "triplet", "overrides": {"loss.name": "triplet", "miner.name": "semihard"},
     "search": {"loss.params.margin": {"low": 0.05, "high": 0.5}}},
    {"name": "contrastive", "overrides": {"loss.name": "contrastive"},
     "search": {"loss.params.margin": {"low": 0.5, "high": 1.5}}},
]


ANALYSIS = {"references": ["contrastive"], "pairs": [["triplet", "contrastive"]]}


def write_spec(path: Path, **changes: object) -> Path:
    spec = {"base": BASE, "protocol": PROTOCOL, "methods": METHODS, **changes}
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny benchmark, run once for the tests of this module."""
    directory = tmp_path_factory.mktemp("bench")
    spec = write_spec(directory / "bench.yaml", analysis=ANALYSIS)
    result = subprocess.run([console_script(), "benchmark", str(spec), "-o", str(directory / "out")],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "== triplet: search trial 0 fold 0" in result.stderr and "left ~" in result.stderr
    return directory / "out"


def test_benchmark_writes_the_report_and_records_every_run(finished: Path) -> None:
    results = (finished / "results.csv").read_text().splitlines()
    assert results[0] == "method,mode,metric,mean,ci_low,ci_high,n"
    assert {line.split(",")[0] for line in results[1:]} == {"triplet", "contrastive", "untrained"}
    assert (finished / "runs.csv").read_text().startswith("method,reproduction,mode,metric,value,search,seed\n")
    report = (finished / "report.md").read_text()
    for text in ("| untrained |", "| triplet |", "Paired comparisons", "fold layout hash", "git commit", "content hash"):
        assert text in report
    page = (finished / "report.html").read_text()
    assert "data:image/png;base64," in page and "<style>" in page and "<link" not in page
    assert "\\toprule" in (finished / "results.tex").read_text()
    layout = json.loads((finished / "benchmark.json").read_text())["fold_layout"]
    for run_file in finished.glob("*/*/fold_*/run.json"):
        record = json.loads(run_file.read_text())
        assert record["method"] in ("triplet", "contrastive") and record["stage"] in ("search", "reproduction")
        assert ("trial" in record) == (record["stage"] == "search")
        assert ("test_classes" in record) == (record["stage"] == "reproduction")
        assert record["train_classes"] and record["val_classes"] and "fold" in record
        assert not set(record["val_classes"]) & set(layout["test_classes"])
    accesses = (finished / "test_access.jsonl").read_text().splitlines()
    assert len(accesses) == 3 * PROTOCOL["reproductions"]  # two methods and the untrained baseline
    # The data's source beside its hash: glyphs have no domains and state no licence.
    source = json.loads((finished / "benchmark.json").read_text())["data_source"]
    reproduction_run = json.loads(next(finished.glob("triplet/reproduction_*/fold_0/run.json")).read_text())
    assert source == {"test_images": reproduction_run["split_sizes"]["test"]}
    assert f"test classes of `fold_layout.test_classes` ({source['test_images']:,} images)" in report


def test_a_benchmark_started_before_its_data_source_was_recorded_gets_it_when_continued(
    finished: Path, tmp_path: Path
) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(finished, copy)
    benchmark = json.loads((copy / "benchmark.json").read_text())
    recorded = benchmark.pop("data_source")
    (copy / "benchmark.json").write_text(json.dumps(benchmark))
    spec = write_spec(tmp_path / "bench.yaml", analysis=ANALYSIS)
    result = subprocess.run([console_script(), "benchmark", str(spec), "-o", str(copy), "-q"],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    # Rewritten, the record also names the copy's own studies, not the directory it was copied from.
    assert json.loads((copy / "benchmark.json").read_text()) == {
        **benchmark, "data_source": recorded, "storage": f"sqlite:///{copy.resolve() / 'study.db'}"}


def test_report_answers_the_claims_with_files_and_plots(finished: Path) -> None:
    report = (finished / "report.md").read_text()
    for text in ("## Every method against the references", "## Treated against control",
                 "| triplet − contrastive | concatenated | P@1 | 2 |", "## Embedding space against test P@1",
                 "## Concatenated against separated", "this report was written by git commit",
                 "(references in red; the baselines are in the results table)](forest.png)",
                 "![The primary comparisons: paired differences, their intervals and the equivalence band](differences.png)"):
        assert text in report, text
    for name in ("forest.png", "differences.png", "rho_vs_precision_at_1.png", "search.png", "validation_curves.png"):
        assert (finished / name).read_bytes().startswith(b"\x89PNG"), name
    rows = (finished / "embedding_space.csv").read_text().splitlines()
    assert rows[0] == "method,reproduction,seed,fold,rho,pi_intra,pi_inter,pi_ratio"
    # two methods x two reproductions x two fold models; the untrained baseline has none
    assert len(rows) == 1 + 2 * 2 * 2
    for row in rows[1:]:
        method, _, seed, _, rho, _, _, pi_ratio = row.split(",")
        assert method in ("triplet", "contrastive") and int(seed) in (100, 101)
        assert 0.0 < float(rho) < 5.0 and 0.0 < float(pi_ratio) < 5.0
    comparisons = (finished / "claim_comparisons.csv").read_text().splitlines()
    assert comparisons[0].startswith("family,mode,metric,a,b,n,mean_difference,difference_ci_low")
    assert comparisons[0].endswith(",tost_pvalue,tost_pvalue_holm,equivalence_margin,outcome,no_verdict,conditional_on_search,"
                                   "search_sd_allowance,equivalence_ci_low,equivalence_ci_high,assumed_search_sd")
    rows = list(csv.DictReader(io.StringIO("\n".join(comparisons))))
    assert {row["family"] for row in rows} == {"reference:contrastive", "pairs"}
    assert {row["outcome"] for row in rows} <= {"better", "worse", "equivalent", "inconclusive"}
    assert {row["equivalence_margin"] for row in rows} == {"0.01"}
    assert {row["conditional_on_search"] for row in rows} == {"true"}  # one search per method
    # Two reproductions: every row says why it has no verdict.
    assert all(row["no_verdict"].endswith("a verdict needs at least 3 reproductions") or "identical" in row["no_verdict"]
               for row in rows)
    # The plain-language summary comes first, before the leaderboard's details and the claims.
    assert report.index("## Summary") < report.index("## Every method against the references")
    assert "Against `contrastive`: " in report and "Primary endpoint MAP@R (concatenated)" in report
    assert "## Power (MAP@R (concatenated))" in report and "## Sensitivity to the margin" in report
    # The plots right under the leaderboard, then the set-up, then the claims.
    assert report.index("| untrained |") < report.index("## Plots") < report.index("](search.png)") < report.index("## Set-up")
    assert report.index("## Set-up") < report.index("## Every method against the references")
    test_classes = len(json.loads((finished / "benchmark.json").read_text())["fold_layout"]["test_classes"])
    for text in (f"the {test_classes} test classes",
                 "| triplet | `loss.name` = triplet; `miner.name` = semihard | `loss.params.margin`: 0.05 .. 0.5 |",
                 "| trunk width | `model.options.width` | 8 |",
                 "The `untrained` row is the same in both modes",
                 "| search | random: all 2 trials are start-up trials of Optuna's tpe sampler",
                 "| early stopping patience | none: every run trains its fixed number of epochs"):
        assert text in report, text
    page = (finished / "report.html").read_text()
    assert "<td>contrastive</td><td><code>loss.name</code> = contrastive</td>" in page  # table cells too
    assert "<code>loss.params.margin</code>: 0.5 .. 1.5</td>" in page
    assert "<em>equivalent</em>" in page and "*equivalent*" not in page


def test_power_csv_holds_the_power_and_sensitivity_of_the_primary_family(finished: Path) -> None:
    """``power.csv``: one row per comparison of the primary family (concatenated MAP@R), its power at the
    SD of the paired differences in ``runs.csv`` (recomputed here with ``analysis.power``) and its
    verdicts at half, the chosen and twice the margin (recomputed with ``statistics.compare_pairs``)."""
    import csv

    import numpy as np

    from dmlbench.analysis import power
    from dmlbench.analysis.statistics import compare_pairs

    with open(finished / "power.csv", newline="") as stream:
        rows = list(csv.DictReader(stream))
    runs: dict[str, dict[int, float]] = {}
    with open(finished / "runs.csv", newline="") as stream:
        for row in csv.DictReader(stream):
            if (row["mode"], row["metric"]) == ("concatenated", "map_at_r"):
                runs.setdefault(row["method"], {})[int(row["reproduction"])] = float(row["value"])
    declared = [("triplet", "contrastive")]  # ANALYSIS: the reference's one comparison, the same pair declared again
    assert [(row["mode"], row["metric"], row["a"], row["b"]) for row in rows] == [("concatenated", "map_at_r", a, b)
                                                                                for a, b in declared]
    report = (finished / "report.md").read_text()
    for row, (a, b) in zip(rows, declared):
        differences = np.array([runs[a][r] - runs[b][r] for r in sorted(runs[a])])
        expected = power.comparison_power(a, b, len(differences), power.paired_sd(differences), 0.01, len(declared))
        assert int(row["n"]) == expected.n and int(row["comparisons"]) == expected.comparisons
        for column, value in (("sd_of_differences", expected.sd), ("ttest_power_holm", expected.ttest_holm),
                              ("tost_power_holm", expected.tost_holm), ("detectable_difference", expected.detectable)):
            assert float(row[column]) == pytest.approx(value, rel=1e-12), column
        assert row["reproductions_needed"] == ("" if expected.needed is None else str(expected.needed))
        assert f"| {a} vs {b} | {expected.n} | {100 * expected.sd:.2f} |" in report
        scores = {name: runs[name] for name in (a, b)}
        for column, margin in (("outcome_half_margin", 0.005), ("outcome", 0.01), ("outcome_twice_margin", 0.02)):
            assert row[column] == compare_pairs(scores, [(a, b)], margin=margin)[0].outcome(0.05), column


def test_report_commits_every_validation_curve(finished: Path) -> None:
    rows = [line.split(",") for line in (finished / "validation_curves.csv").read_text().splitlines()]
    assert rows[0] == ["method", "stage", "unit", "fold", "evaluation", "metric", "value"]
    runs = {(m, stage, unit, fold) for m, stage, unit, fold, *_ in rows[1:]}
    # Two methods x (two search trials + two reproductions) x two folds, each with evaluations 0 and 1.
    assert len(runs) == 2 * (2 + 2) * 2
    assert {stage for _, stage, *_ in rows[1:]} == {"search", "reproduction"}
    assert {evaluation for *_, evaluation, _, _ in rows[1:]} == {"0", "1"}
    assert {"precision_at_1", "map_at_r"} <= {metric for *_, metric, _ in rows[1:]}
    assert all(0.0 <= float(value) <= 1.0 for *_, value in rows[1:])


def test_a_benchmark_scored_without_per_class_sums_gets_them_when_continued(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A benchmark whose reproductions were scored by a version that stored no per-class test sums
    (planted: the trials' ``class_scores`` deleted from the database) gets them from its checkpoints
    when the same command runs again: the same sums, the same class bootstrap, the scores untouched,
    each opening of the test data logged, the audit still passing; a third run has nothing to do."""
    import shutil
    import sqlite3

    import optuna

    from dmlbench.protocol.layout import reproduction_study
    from dmlbench.protocol.units.results import COMPLETED_CLASS_SUMS

    copy = tmp_path / "copy"
    shutil.copytree(finished, copy)
    url = f"sqlite:///{copy.resolve() / 'study.db'}"
    kept = {name: (copy / name).read_bytes() for name in ("results.csv", "runs.csv", "class_bootstrap.csv")}
    methods = [method["name"] for method in METHODS]

    def trial_sums() -> dict[str, list[object]]:
        return {method: [t.user_attrs.get("class_scores") for t in optuna.load_study(
            study_name=reproduction_study(method), storage=url).get_trials()] for method in methods}

    original = trial_sums()
    assert all(record is not None for records in original.values() for record in records)
    with sqlite3.connect(copy / "study.db") as connection:
        deleted = connection.execute("DELETE FROM trial_user_attributes WHERE key = 'class_scores'").rowcount
    assert deleted == len(methods) * PROTOCOL["reproductions"]
    (copy / "class_bootstrap.csv").unlink()
    code, _, err = run_cli(["report", str(copy)], capsys)
    assert code == 0, err
    assert "has no per-class concatenated test scores" in (copy / "report.md").read_text()
    accesses = (copy / "test_access.jsonl").read_text().splitlines()

    spec = write_spec(tmp_path / "bench.yaml", analysis=ANALYSIS)
    command = [console_script(), "benchmark", str(spec), "-o", str(copy), "-q"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{deleted} reproduction(s) were scored by a version that stored no per-class test sums" in result.stderr
    for method in methods:
        study = optuna.load_study(study_name=reproduction_study(method), storage=url)
        completed = [study.user_attrs[f"{COMPLETED_CLASS_SUMS}{slot}"] for slot in range(PROTOCOL["reproductions"])]
        assert completed == original[method]  # the sums the first scoring stored, to the bit
    assert {name: (copy / name).read_bytes() for name in kept} == kept
    added = [json.loads(line) for line in (copy / "test_access.jsonl").read_text().splitlines()[len(accesses):]]
    assert len(added) == deleted and {entry["purpose"] for entry in added} == {"per-class sums"}
    code, _, err = run_cli(["audit", str(copy)], capsys)
    assert code == 0, err

    again = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert again.returncode == 0 and "stored no per-class test sums" not in again.stderr
    assert len((copy / "test_access.jsonl").read_text().splitlines()) == len(accesses) + deleted


def test_report_rebuilds_the_same_csv_bytes_from_storage(finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = {name: (finished / name).read_bytes() for name in ("results.csv", "runs.csv", "comparisons.csv",
                                                                 "claim_comparisons.csv", "correlations.csv",
                                                                 "embedding_space.csv", "rankings.csv", "validation_curves.csv", "power.csv")}
    for name in before:
        (finished / name).unlink()
    code, _, err = run_cli(["report", str(finished)], capsys)
    assert code == 0, err
    assert {name: (finished / name).read_bytes() for name in before} == before
    published = tmp_path / "published"
    code, _, err = run_cli(["report", str(finished), "-o", str(published)], capsys)
    assert code == 0, err
    assert {name: (published / name).read_bytes() for name in before} == before
    assert not list(published.glob("*.pt")) and not (published / "study.db").exists() and (published / "report.html").is_file()
    for name in ("benchmark.json", "test_access.jsonl"):
        assert (published / name).read_bytes() == (finished / name).read_bytes()


def test_a_changed_analysis_is_refused_then_accepted_on_purpose_and_recorded(
        finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(finished, copy, ignore=shutil.ignore_patterns("*.pt"))
    benchmark = json.loads((copy / "benchmark.json").read_text())
    before = (copy / "benchmark.json").read_bytes()
    assert benchmark["analysis_in_hash"] and benchmark["analysis"]["references"] == ["contrastive"]
    spec = write_spec(tmp_path / "bench.yaml", analysis={"references": ["triplet"]})
    code, _, err = run_cli(["benchmark", str(spec), "-o", str(copy), "-q"], capsys)
    assert code == 2 and err.count("\n") == 1 and "analysis.pairs, analysis.references" in err and "--accept-analysis-change" in err
    assert (copy / "benchmark.json").read_bytes() == before  # nothing stored changed
    import dmlbench
    from dmlbench.errors import UserInputError

    with pytest.raises(UserInputError, match="change it on purpose with `accept_analysis_change`"):
        dmlbench.benchmark(spec, copy)  # the Python caller is told its parameter, the command line its option
    assert (copy / "benchmark.json").read_bytes() == before
    code, _, err = run_cli(["benchmark", str(spec), "-o", str(copy), "-q", "--accept-analysis-change"], capsys)
    assert code == 0, err  # nothing is re-run: the declared analysis keeps the config hash
    stored = json.loads((copy / "benchmark.json").read_text())
    assert stored["config_hash"] == benchmark["config_hash"] and stored["analysis"] == benchmark["analysis"]
    [change] = stored["analysis_changes_accepted"]
    assert change["changed"] == ["pairs", "references"] and change["analysis"]["references"] == ["triplet"]
    code, _, err = run_cli(["benchmark", str(spec), "-o", str(copy), "-q"], capsys)
    assert code == 0, err  # the accepted analysis is now the one in force
    code, _, err = run_cli(["report", str(copy)], capsys)
    assert code == 0, err
    report = (copy / "report.md").read_text()
    assert "Every method against `triplet`" in report and "Treated against control" not in report
    assert "changed after the runs with --accept-analysis-change: `analysis.pairs`, `analysis.references`" in report
    code, _, err = run_cli(["audit", str(copy)], capsys)
    assert code == 1 and "analysis changed after the runs" in err


def test_one_verdict_per_pair_and_endpoint(finished: Path) -> None:
    """The reference view, the pairs view and comparisons.csv read one Holm family per mode and metric:
    the pair declared both ways (triplet against the reference contrastive, and as a pair) has one verdict."""
    import csv

    claims = list(csv.DictReader((finished / "claim_comparisons.csv").open()))
    table = list(csv.DictReader((finished / "comparisons.csv").open()))
    for mode in ("concatenated", "separated"):
        for metric in ("precision_at_1", "map_at_r"):
            views = [row for row in claims if (row["mode"], row["metric"]) == (mode, metric)]
            assert {row["family"] for row in views} == {"reference:contrastive", "pairs"}
            assert len({(row["outcome"], row["t_pvalue_holm"], row["tost_pvalue_holm"]) for row in views}) == 1
            [row] = [row for row in table if (row["mode"], row["metric"]) == (mode, metric)]
            assert (row["outcome"], float(row["t_pvalue_holm"])) == (views[0]["outcome"], float(views[0]["t_pvalue_holm"]))


def test_a_benchmark_started_before_the_analysis_was_fixed_resumes_and_reports(
        finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As the committed studies: benchmark.json without ``analysis_in_hash``, config hash without the analysis."""
    import shutil

    from dmlbench.protocol.design.benchmark import load_spec
    from dmlbench.protocol.design.prepare import prepare

    copy = tmp_path / "old"
    shutil.copytree(finished, copy, ignore=shutil.ignore_patterns("*.pt"))
    benchmark = json.loads((copy / "benchmark.json").read_text())
    del benchmark["analysis_in_hash"]
    spec = write_spec(tmp_path / "bench.yaml", analysis={"references": ["triplet"]})
    benchmark.update(storage=f"sqlite:///{copy.resolve() / 'study.db'}", analysis={"references": ["contrastive"]})
    (copy / "benchmark.json").write_text(json.dumps(benchmark))
    code, _, err = run_cli(["report", str(copy), "-o", str(tmp_path / "published")], capsys)
    assert code == 0, err
    assert "started before the analysis entered the config hash" in (tmp_path / "published" / "report.md").read_text()
    # Resuming it: the description (so the hash its studies carry) has no analysis, whatever the config declares.
    fresh = prepare(load_spec(spec), tmp_path / "fresh")
    fresh.analysis_in_hash = False
    alone = tmp_path / "record_only"
    alone.mkdir()
    (alone / "benchmark.json").write_text(json.dumps({**benchmark, "storage": f"sqlite:///{alone.resolve() / 'study.db'}"}))
    resumed = prepare(load_spec(spec), alone, accept_plugin_changes=False)
    assert "analysis" not in resumed.description() and resumed.config_hash == fresh.config_hash


def test_audit_passes_then_names_a_planted_leak(finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["audit", str(finished)], capsys)
    assert code == 0, err
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(finished, copy, ignore=shutil.ignore_patterns("*.pt"))
    benchmark = json.loads((copy / "benchmark.json").read_text())
    run_file = copy / "triplet" / "trial_0001" / "fold_0" / "run.json"
    record = json.loads(run_file.read_text())
    record["val_classes"].append(benchmark["fold_layout"]["test_classes"][0])
    run_file.write_text(json.dumps(record))
    code, out, err = run_cli(["audit", str(copy)], capsys)
    assert code == 1
    assert "triplet/trial_0001/fold_0: search-stage run saw test classes" in err
    # A record that cannot be read is named, and the audit goes on to the others.
    (copy / "triplet" / "trial_0000" / "fold_0" / "run.json").write_text("{ torn")
    code, out, err = run_cli(["audit", str(copy)], capsys)
    assert code == 1
    assert "triplet/trial_0000/fold_0: run.json cannot be read" in err
    assert "triplet/trial_0001/fold_0: search-stage run saw test classes" in err


def test_a_test_access_record_cut_short_is_named_by_the_audit_and_the_next_opening_starts_a_line(
        finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A worker killed while logging an opening of the test data leaves a line cut short: the audit once
    ended with a JSONDecodeError traceback, and the next opening logged was joined to that line."""
    import shutil

    from dmlbench.protocol.units.scoring import record_test_access

    copy = tmp_path / "copy"
    shutil.copytree(finished, copy, ignore=shutil.ignore_patterns("*.pt"))
    log = copy / "test_access.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:-1]) + lines[-1][:40])
    code, _, err = run_cli(["audit", str(copy)], capsys)
    assert code == 1 and "Traceback" not in err, err
    damaged = f"test_access.jsonl line {len(lines)}: not a record (a write cut short?), so the opening it logged cannot be checked"
    assert damaged in err
    record_test_access(copy, json.loads(lines[-1]))
    after = log.read_text().splitlines()
    assert after[:-1] == [line.rstrip("\n") for line in lines[:-1]] + [lines[-1][:40]]
    assert json.loads(after[-1])["runs"] == json.loads(lines[-1])["runs"]
    code, _, err = run_cli(["audit", str(copy)], capsys)
    assert code == 1 and damaged in err and "line " + str(len(lines) + 1) not in err, err


def test_audit_of_an_unfinished_benchmark_names_what_is_missing(finished: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Fewer reproductions than the protocol declares (a benchmark still running) are named per method,
    not reported as methods with different budgets (what the audit of a half-done study used to say)."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(finished, copy, ignore=shutil.ignore_patterns("*.pt"))
    benchmark = json.loads((copy / "benchmark.json").read_text())
    declared = benchmark["protocol"]["reproductions"]
    benchmark["protocol"]["reproductions"] = declared + 1
    (copy / "benchmark.json").write_text(json.dumps(benchmark))
    code, _, err = run_cli(["audit", str(copy)], capsys)
    assert code == 1
    for method in benchmark["methods"]:
        assert f"method {method}: {declared} reproductions, the protocol says {declared + 1} (not finished yet?)" in err
    assert "different budgets" not in err


def test_audit_reads_the_storage_given_with_storage(finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A copy whose benchmark.json names a storage that is gone: the audit finds no study there, and
    passes on the storage named with --storage (as report and status take it)."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(finished, copy, ignore=shutil.ignore_patterns("*.pt"))
    benchmark = json.loads((copy / "benchmark.json").read_text())
    benchmark["storage"] = f"sqlite:///{tmp_path.resolve() / 'gone.db'}"
    (copy / "benchmark.json").write_text(json.dumps(benchmark))
    code, _, err = run_cli(["audit", str(copy)], capsys)
    assert code == 1 and "method triplet: no study in" in err
    code, out, err = run_cli(["audit", str(copy), "--storage", f"sqlite:///{copy.resolve() / 'study.db'}"], capsys)
    assert code == 0 and "audit passed" in out, err


def test_report_and_audit_of_a_directory_without_a_study_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("report", "audit"):
        code, _, err = run_cli([command, str(tmp_path)], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "no benchmark study" in err


@pytest.mark.parametrize(
    ("changes", "extra", "message"),
    [
        ({"methods": [METHODS[0], METHODS[0]]}, [], "repeated: triplet"),
        ({"methods": [{**METHODS[0], "search": {"loss.params.margin": {"low": 0.5, "high": 0.1}}}]}, [], "loss.params.margin"),
        ({"methods": [{**METHODS[0], "search": {"loss.params.nope": {"low": 0.1, "high": 0.5}}}]}, [], "nope"),
        ({"protocol": {**PROTOCOL, "folds": 30}}, [], "30 folds need at least 30 development classes"),
        ({"protocol": {**PROTOCOL, "first_seed": 0}}, [], "first_seed"),
        ({"analysis": {"references": ["nosuch"]}}, [], "benchmark analysis names 'nosuch', which is not a method"),
        ({"analysis": {"pairs": [["triplet", "triplet"]]}}, [], "compares a method with itself"),
        ({"protocol": {**PROTOCOL, "startup_trials": 0}}, [], "protocol.startup_trials"),
        ({}, ["--storage", "sqlite:////nonexistent-dir/x.db"], "does not exist"),
        ({}, ["--storage", "postgresql://127.0.0.1:1/none"], "cannot be reached"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_is_stored(
    changes: dict, extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path / "bench.yaml", **changes)
    code, _, err = run_cli(["benchmark", str(spec), "-o", str(tmp_path / "out"), "-q", *extra], capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_search_runs_a_run_config_with_a_search_space(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {**BASE, "loss": {"name": "triplet"}, "search": METHODS[0]["search"],
              "protocol": {"folds": 2, "trials": 1, "sampler": "tpe"}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    code, out, err = run_cli(["search", str(path), "-o", str(tmp_path / "out"), "-q"], capsys)
    assert code == 0, err
    assert "triplet: best fold-mean validation MAP@R" in out
    summary = json.loads((tmp_path / "out" / "search.json").read_text())
    assert summary["methods"]["triplet"]["completed"] == 1


def test_kill_9_mid_trial_then_rerun_gives_the_same_results(finished: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "bench.yaml")
    output = tmp_path / "out"
    command = [console_script(), "benchmark", str(spec), "-o", str(output), "-q"]
    kill_9_once_written(command, output / "triplet" / "trial_0001" / "fold_0" / "metrics.jsonl", REPO)
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (output / "results.csv").read_bytes() == (finished / "results.csv").read_bytes()
    assert (output / "runs.csv").read_bytes() == (finished / "runs.csv").read_bytes()
    assert len(list((output / "triplet").glob("reproduction_*"))) == PROTOCOL["reproductions"]
    audit = subprocess.run([console_script(), "audit", str(output)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert audit.returncode == 0, audit.stderr


@pytest.mark.parametrize(
    ("path", "minimum"),
    [
        (None, {"methods": 4, "folds": 2, "trials": 2, "reproductions": 2}),
        (REPO / "configs" / "smoke.yaml", {"methods": 2, "folds": 2, "trials": 2, "reproductions": 2}),
        (REPO / "configs" / "reality_check.yaml", {"methods": 12, "folds": 4, "trials": 50, "reproductions": 10}),
        (REPO / "configs" / "reality_check_glyphs.yaml", {"methods": 17, "folds": 4, "trials": 8, "reproductions": 5}),
        (REPO / "configs" / "cub_shaped_glyphs.yaml", {"methods": 12, "folds": 4, "trials": 50, "reproductions": 10}),
        (REPO / "configs" / "samplers_glyphs.yaml", {"methods": 7, "folds": 4, "trials": 8, "reproductions": 5}),
    ],
)
def test_shipped_benchmark_configs_declare_valid_search_spaces(path: Path | None, minimum: dict) -> None:
    from dmlbench.protocol.design.benchmark import load_spec
    from dmlbench.protocol.design.plan import method_raw_config
    from dmlbench.protocol.design.search_space import parse_search_space

    spec = load_spec(path)
    assert len(spec.methods) >= minimum["methods"]
    for key in ("folds", "trials", "reproductions"):
        assert getattr(spec.protocol, key) >= minimum[key]
    variants = set()
    for method in spec.methods:
        raw = method_raw_config(spec, method.name)
        assert len(parse_search_space(method.search, raw, method=method.name)) >= 1
        miner, sampler = raw.get("miner") or {}, raw.get("sampler") or {}
        variants.add((raw["loss"]["name"], miner.get("name"), "miner.p_switch" in method.search,
                      sampler.get("name"), json.dumps(sampler.get("params"), sort_keys=True)))
    assert len(variants) == len(spec.methods)  # no method is another one under a second name


def test_the_cub_shaped_workload_is_the_reality_check_protocol_on_cub_sized_glyphs() -> None:
    """Issue 49: seed 001's protocol (reality_check.yaml's folds, search, reproductions and methods) on
    200 glyph classes of 16 fonts x 4 images at 224 px (CUB: 200 classes, ~59 images) and a ResNet-50."""
    from dmlbench.protocol.design.benchmark import load_spec

    shaped, reference = load_spec(REPO / "configs" / "cub_shaped_glyphs.yaml"), load_spec(REPO / "configs" / "reality_check.yaml")
    assert shaped.protocol == reference.protocol and shaped.methods == reference.methods
    assert shaped.base["data"]["options"] == {"image_size": 224, "augmentations_per_font": 3, "max_classes": 200}
    assert shaped.base["model"]["trunk"] == "resnet50" and shaped.base["training"]["batch_size"] == 32


def test_the_committed_glyph_studies_cover_what_issue_15_asks_for() -> None:
    from dmlbench.protocol.design.benchmark import load_spec
    from dmlbench.protocol.design.plan import method_raw_config

    spec = load_spec(REPO / "configs" / "reality_check_glyphs.yaml")
    assert spec.protocol.folds >= 4 and spec.protocol.reproductions >= 5
    losses = {method_raw_config(spec, m.name)["loss"]["name"] for m in spec.methods}
    assert losses >= {"contrastive", "triplet", "margin", "generalized_lifted_structure", "npairs", "multi_similarity",
                      "fastap", "proxy_nca", "normalized_softmax", "arcface", "cosface", "softtriple", "snr"}
    regularised = [m.name for m in spec.methods if "miner.p_switch" in m.search]
    assert len(regularised) >= 3 and sorted(a for a, _ in spec.analysis.pairs) == sorted(regularised)
    for treated, control in spec.analysis.pairs:  # the same method but for the switch
        assert {k: v for k, v in spec.methods[[m.name for m in spec.methods].index(treated)].search.items()
                if k != "miner.p_switch"} == next(m.search for m in spec.methods if m.name == control)
    samplers = load_spec(REPO / "configs" / "samplers_glyphs.yaml")
    assert samplers.protocol == spec.protocol and samplers.analysis.references == ["spc4"]
    used = {(raw["sampler"]["name"], raw["sampler"].get("params", {}).get("samples_per_class"))
            for raw in (method_raw_config(samplers, m.name) for m in samplers.methods)}
    assert used >= {("spc", 2), ("spc", 4), ("spc", 8), ("spc_random", None), ("greedy_coreset", 2), ("ddm", 2), ("frd", 2)}
    assert {method_raw_config(samplers, m.name)["loss"]["name"] for m in samplers.methods} == {"margin"}


def test_gp_suggestions_do_not_depend_on_process_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sampler seeded per trial from (seed, trial index): a search stopped in its second trial and
    continued by a new worker suggests what one uninterrupted search suggests (the guarantee behind
    byte-identical resumes)."""
    import logging

    import optuna
    from protocol_fixtures import benchmark_spec, run_search, study

    from dmlbench.errors import RunInterrupted
    from dmlbench.training import loop as loop_module

    optuna.logging.set_verbosity(logging.WARNING)
    spec = benchmark_spec(BASE, METHODS[0], trials=2, folds=2, epochs=1, sampler="gp", search_seed=3)
    once = run_search(spec, tmp_path / "once")["triplet"]
    real_train = loop_module.train

    def stopped_in_second_trial(config, run_dir, **kwargs):  # type: ignore[no-untyped-def]
        if "trial_0001" in str(run_dir):
            raise KeyboardInterrupt
        return real_train(config, run_dir, **kwargs)

    monkeypatch.setattr(loop_module, "train", stopped_in_second_trial)
    with pytest.raises(RunInterrupted):
        run_search(spec, tmp_path / "twice")
    monkeypatch.setattr(loop_module, "train", real_train)
    twice = run_search(spec, tmp_path / "twice")["triplet"]
    assert len(study(tmp_path / "twice", "triplet").trials) == 3  # the stopped attempt, then its retry
    complete = [t for t in twice.trials if t["state"] == "COMPLETE"]
    assert [t["params"] for t in once.trials] == [t["params"] for t in complete]
    assert [t["value"] for t in once.trials] == [t["value"] for t in complete]


def test_keys_added_later_leave_an_older_benchmark_description_unchanged(tmp_path: Path) -> None:
    # A benchmark started before `analysis` and `protocol.startup_trials` existed must still resume:
    # its description (and so its config hash) may not gain either key while they are unset.
    from dmlbench.protocol.design.benchmark import load_spec
    from dmlbench.protocol.design.prepare import prepare

    plain = prepare(load_spec(write_spec(tmp_path / "plain.yaml")), tmp_path / "a").description()
    assert "startup_trials" not in plain["protocol"] and "startup_trials" not in plain["spec"]["protocol"]
    assert "analysis" not in plain["spec"]
    analysed = prepare(load_spec(write_spec(tmp_path / "analysed.yaml", analysis=ANALYSIS)), tmp_path / "b").description()
    # The analysis is fixed before the data: it is part of the description (and hash), outside `spec`.
    assert analysed["analysis"]["references"] == ["contrastive"] and analysed != plain
    assert {key: value for key, value in analysed.items() if key != "analysis"} == {
        key: value for key, value in plain.items() if key != "analysis"}
    started = prepare(load_spec(write_spec(tmp_path / "startup.yaml", protocol={**PROTOCOL, "startup_trials": 1})),
                      tmp_path / "c").description()
    assert started["protocol"]["startup_trials"] == 1 and started["spec"]["protocol"]["startup_trials"] == 1
