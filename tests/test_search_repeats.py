"""``protocol.search_repeats``: the whole search repeated with other search seeds, reported beside the first."""

import csv
import json
import shutil
from pathlib import Path

import optuna
import pytest
import torch

from cli_runner import run_cli
from dmlbench.analysis import search_luck
from dmlbench.protocol.queue.storage import default_url

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parent.parent
# The smoke config at its smallest: one trial per search, both methods listed, one repeated.
TINY = ["protocol.trials=1", "protocol.reproductions=2", "training.max_steps_per_epoch=2"]


def test_two_searches_with_other_seeds_and_their_report_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code, _, err = run_cli(["benchmark", str(REPO / "configs" / "smoke.yaml"), "-o", str(out), "-q", *TINY,
                            "protocol.search_repeats=2", "protocol.search_repeat_methods=[normalized_softmax]"], capsys)
    assert code == 0, err
    storage = default_url(out, 1)
    names = set(optuna.get_all_study_names(storage))
    assert {"normalized_softmax@search1", "reproductions:normalized_softmax@search1"} <= names
    assert "triplet_semihard@search1" not in names  # only the listed method is repeated
    first = optuna.load_study(study_name="normalized_softmax", storage=storage)
    again = optuna.load_study(study_name="normalized_softmax@search1", storage=storage)
    assert first.user_attrs["settings"]["seed"] == 0 and again.user_attrs["settings"]["seed"] == 1
    assert first.trials[0].params != again.trials[0].params  # another seed, another suggestion
    assert (out / "normalized_softmax@search1" / "reproduction_01" / "fold_1" / "run.json").is_file()
    # The leaderboard holds the methods only; the repeats are in their own section and CSV.
    methods = {row["method"] for row in csv.DictReader((out / "results.csv").open())}
    assert methods == {"triplet_semihard", "normalized_softmax", "untrained"}
    assert "normalized_softmax@search1" in json.loads((out / "search.json").read_text())["search_repeats"]
    rows = list(csv.DictReader((out / "search_repeats.csv").open()))
    assert [(row["method"], row["search"], row["search_seed"]) for row in rows] == [
        ("normalized_softmax", "0", "0"), ("normalized_softmax", "1", "1")]
    assert [float(row["best_validation"]) for row in rows] == [first.best_value, again.best_value]
    report = (out / "report.md").read_text()
    assert "## Search repeats" in report and "## Uncertainty over the test classes" in report
    assert "normalized_softmax@search1" in report  # its cost row
    code, _, err = run_cli(["audit", str(out)], capsys)  # the repeats' test openings are reproductions' too
    assert code == 0, err
    # The committed files alone (no storage) give class_bootstrap.csv again, from class_sums.csv.
    committed = tmp_path / "committed"
    committed.mkdir()
    for name in ("runs.csv", "benchmark.json", "class_sums.csv", "comparisons.csv", "search_variance.csv"):
        shutil.copy(out / name, committed / name)
    code, output, _ = run_cli(["rejudge", str(committed), "--write"], capsys)
    assert code == 0 and "class_bootstrap.csv: rewritten" in output
    assert (committed / "class_bootstrap.csv").read_text() == (out / "class_bootstrap.csv").read_text()
    assert run_cli(["rejudge", str(committed), "--check"], capsys)[0] == 0


def test_an_unknown_repeated_method_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["benchmark", str(REPO / "configs" / "smoke.yaml"), "-o", str(tmp_path / "out"), "-q",
                            "protocol.search_repeats=2", "protocol.search_repeat_methods=[nope]"], capsys)
    assert code == 2 and "search_repeat_methods names 'nope'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_best_values_in_the_outer_five_percent_are_flagged_on_the_scale_searched() -> None:
    from protocol_fixtures import benchmark_record

    from dmlbench.report.data import ReportData
    from dmlbench.analysis.search_ranges import edge_position
    from dmlbench.report.uncertainty import range_edge_text

    log_range, linear_range = {"low": 0.02, "high": 0.2, "log": True}, {"low": 0.02, "high": 0.2}
    # 0.19 is 97.8% of the way on the log scale but 94.4% on the linear one; 0.025 is 9.7% against 2.8%.
    assert edge_position(log_range, 0.19) == pytest.approx(0.977723, abs=1e-6)
    assert edge_position(linear_range, 0.19) == pytest.approx(0.17 / 0.18)
    assert edge_position({"choices": ["a", "b"]}, "a") is None and edge_position(log_range, True) is None
    spec = {"methods": [{"name": "m", "search": {"t": log_range, "u": linear_range, "c": {"choices": [1, 2]}}}]}
    trials = {"m": [{"number": 0, "state": "COMPLETE", "value": 0.5, "params": {"t": 0.19, "u": 0.19, "c": 1}},
                    {"number": 1, "state": "COMPLETE", "value": 0.4, "params": {"t": 0.025, "u": 0.025, "c": 2}}]}
    text = range_edge_text(ReportData(Path("."), benchmark_record(spec=spec), ["m"], trials))
    assert "`m` t=0.19 (high end, 98% of the range)" in text and "u=" not in text and "c=" not in text
    trials["m"][1]["value"] = 0.6  # now the best trial is the other one: u at 2.8% of its linear range
    text = range_edge_text(ReportData(Path("."), benchmark_record(spec=spec), ["m"], trials))
    assert "`m` u=0.025 (low end, 3% of the range)" in text and "t=" not in text
    trials["m"] = [{"number": 0, "state": "COMPLETE", "value": 0.5, "params": {"t": 0.06, "u": 0.1}}]
    assert range_edge_text(ReportData(Path("."), benchmark_record(spec=spec), ["m"], trials)).startswith("No best value")


def test_the_new_protocol_keys_enter_the_description_only_when_set(tmp_path: Path) -> None:
    # Benchmarks started before search_repeats and class_bootstrap existed keep their config hash.
    from dmlbench.protocol.design.benchmark import load_spec
    from dmlbench.protocol.design.prepare import prepare

    spec = load_spec(REPO / "configs" / "smoke.yaml")
    plain = prepare(spec, tmp_path / "a")
    assert not {"search_repeats", "search_repeat_methods", "class_bootstrap"} & set(plain.description()["protocol"])
    assert plain.repeats == {} and "triplet_semihard@search1" not in plain.study_names()
    repeated = prepare(spec, tmp_path / "b", ["protocol.search_repeats=3", "protocol.class_bootstrap=0"])
    assert repeated.description()["protocol"]["search_repeats"] == 3 and repeated.config_hash != plain.config_hash
    assert {name: repeat.search.seed for name, repeat in repeated.repeats.items()} == {
        "triplet_semihard@search1": 1, "normalized_softmax@search1": 1,
        "triplet_semihard@search2": 2, "normalized_softmax@search2": 2}
    assert "reproductions:normalized_softmax@search2" in repeated.study_names()
    # Repeats drawn afresh (the default) describe it; searches on search 0's seeds and folds describe themselves as
    # every benchmark before the keys existed did, so such a benchmark keeps its config hash.
    assert {"search_seeds", "resplit_per_search"} <= set(repeated.description()["protocol"])
    shared = prepare(spec, tmp_path / "c", ["protocol.search_repeats=3", "protocol.class_bootstrap=0",
                                             "protocol.search_seeds=shared", "protocol.resplit_per_search=false"])
    assert set(shared.description()["protocol"]) == set(repeated.description()["protocol"]) - {"search_seeds", "resplit_per_search"}
    assert shared.config_hash != repeated.config_hash


def test_every_search_draws_its_own_seeds_and_folds_the_same_for_every_method(tmp_path: Path) -> None:
    """``protocol.search_seeds: fresh`` and ``resplit_per_search`` (both defaults once searches repeat): search ``k``
    trains its trials with seed ``seed + k * 100000`` and reproduction ``r`` with ``first_seed + k * 100000 + r``,
    no seed used twice, every method alike (paired); its folds are another cut of the development classes."""
    from dmlbench.protocol.design.benchmark import SEARCH_SEED_STRIDE, load_spec
    from dmlbench.protocol.design.prepare import prepare

    prepared = prepare(load_spec(REPO / "configs" / "smoke.yaml"), tmp_path / "a", ["protocol.search_repeats=3"])
    base = prepared.layout
    seeds: dict[str, set[int]] = {}
    for name, repeat in prepared.repeats.items():
        method, search = name.split("@search")
        offset = int(search) * SEARCH_SEED_STRIDE
        assert repeat.plan.config.seed == prepared.plans[method].config.seed + offset
        reproductions = {repeat.reproduction.first_seed + r for r in range(repeat.reproduction.reproductions)}
        assert reproductions == {1000 + offset, 1001 + offset}
        seeds.setdefault(method, set()).update({repeat.plan.config.seed, *reproductions})
        assert repeat.layout.test_classes == base.test_classes
        assert repeat.layout.development_classes == base.development_classes
        assert repeat.layout.folds != base.folds
        assert repeat.layout == prepared.repeats[f"normalized_softmax@search{search}"].layout  # methods paired by search
    assert len(seeds["triplet_semihard"]) == 2 * 3 and seeds["triplet_semihard"] == seeds["normalized_softmax"]
    kept = prepare(load_spec(REPO / "configs" / "smoke.yaml"), tmp_path / "b",
                   ["protocol.search_repeats=2", "protocol.search_seeds=shared", "protocol.resplit_per_search=false"])
    (repeat, *_) = kept.repeats.values()
    assert repeat.reproduction.first_seed == 1000 and repeat.layout == kept.layout and repeat.plan.config.seed == 0


def test_a_frozen_trunk_with_folds_cut_per_search_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["benchmark", str(REPO / "configs" / "smoke.yaml"), "-o", str(tmp_path / "out"), "--dry-run",
                            "protocol.search_repeats=2", "protocol.frozen_trunk=true"], capsys)
    assert code == 2 and "set resplit_per_search: false" in err and len(err.strip().splitlines()) == 1


def test_every_search_is_in_runs_csv_and_the_methods_are_judged_over_their_searches(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both methods searched twice: runs.csv holds every reproduction of every search (column ``search``), the
    report judges the methods on their search means (method_comparisons.csv, n = searches, not conditional
    on a search; recomputed by hand here), and `dmlbench rejudge` gives the same files from runs.csv alone."""
    from dmlbench.analysis.statistics import compare_pairs

    out = tmp_path / "out"
    code, _, err = run_cli(["benchmark", str(REPO / "configs" / "smoke.yaml"), "-o", str(out), "-q", *TINY,
                            "protocol.search_repeats=2"], capsys)
    assert code == 0, err
    runs = list(csv.DictReader((out / "runs.csv").open()))
    assert {(row["method"], row["search"]) for row in runs} == {
        (method, search) for method in ("triplet_semihard", "normalized_softmax") for search in "01"} | {("untrained", "0")}
    assert {(row["search"], row["reproduction"], row["seed"]) for row in runs} == {
        ("0", "0", "1000"), ("0", "1", "1001"), ("1", "0", "101000"), ("1", "1", "101001")}
    endpoint = [row for row in runs if (row["mode"], row["metric"]) == ("concatenated", "map_at_r")]
    means = {method: {search: sum(float(r["value"]) for r in endpoint if (r["method"], r["search"]) == (method, str(search))) / 2
                      for search in (0, 1)} for method in ("triplet_semihard", "normalized_softmax")}
    (expected,) = compare_pairs(means, [("triplet_semihard", "normalized_softmax")])
    rows = [row for row in csv.DictReader((out / "method_comparisons.csv").open())
            if (row["mode"], row["metric"]) == ("concatenated", "map_at_r")]
    assert len(rows) == 1 and rows[0]["n"] == "2" and rows[0]["conditional_on_search"] == "false"
    assert float(rows[0]["mean_difference"]) == pytest.approx(expected.mean_difference, abs=1e-12)
    assert rows[0]["outcome"] == expected.outcome()
    assert "## Verdicts about the methods (search luck included)" in (out / "report.md").read_text()
    assert {row["conditional_on_search"] for row in csv.DictReader((out / "comparisons.csv").open())} == {"true"}
    # The summary, what the command prints, leads with these verdicts (it once gave search 0's and asked for
    # more reproductions of it), and prices the design that would decide them at the search SD measured here.
    summary = (out / "report.md").read_text().split("## Summary\n")[1].split("\n## ")[0]
    counts = {outcome: int(rows[0]["outcome"] == outcome) for outcome in ("better", "worse", "equivalent", "inconclusive")}
    assert (f"judged about the methods over 2 searches per method (each search's mean over its reproductions, paired by "
            f"search index) — decided: {counts['better']} better, {counts['worse']} worse, {counts['equivalent']} equivalent; "
            f"undecided: {counts['inconclusive']} inconclusive") in summary
    assert "These verdicts are about the methods" in summary and "Each verdict rests on one search" not in summary
    assert counts["inconclusive"] == 1
    measured = {row["method"]: float(row["search_sd"]) for row in csv.DictReader((out / "search_variance.csv").open())
                if row["method"] != "pooled"}
    seed_sd = next(float(row["sd_of_differences"]) for row in csv.DictReader((out / "power.csv").open())
                   if (row["mode"], row["metric"]) == ("concatenated", "map_at_r"))
    # Planned at this comparison's own search luck, each method's as these searches measured it.
    from dmlbench.analysis.search_sd import pair_search_sd

    luck = pair_search_sd(measured, "triplet_semihard", "normalized_softmax")
    design = search_luck.cheapest_family_design([(luck, seed_sd)], 0.01, 1, 1, 2)
    assert design is not None and (f"{design.searches} searches x {design.reproductions} reproductions per method (the planner "
                                   "at each comparison's observed spread and the search luck these searches measured, each "
                                   "method its own)") in summary
    code, out_text, _ = run_cli(["rejudge", str(out), "--check"], capsys)
    assert code == 0, out_text


def test_plan_over_searches_and_seeds_from_a_pilot_with_repeated_searches(capsys: pytest.CaptureFixture[str]) -> None:
    """The committed search-luck study as pilot: each method's search SD (search_repeats.csv's search means less
    the seed variance of search 0, recomputed here) and the cheapest design over searches and seeds (its
    minimality is tested in test_analysis_search_luck.py); a stated --search-sd plans the same way."""
    import math

    pilot = REPO / "results" / "search_luck_glyphs"
    runs = [row for row in csv.DictReader((pilot / "runs.csv").open()) if (row["mode"], row["metric"]) == ("concatenated", "map_at_r")]
    variances = {}
    for row_method in ("contrastive", "triplet_semihard", "multi_similarity", "normalized_softmax"):  # the built-in's
        means = [float(r["test_concatenated_map_at_r"]) for r in csv.DictReader((pilot / "search_repeats.csv").open())
                 if r["method"] == row_method]
        seeds = [float(r["value"]) for r in runs if r["method"] == row_method]
        mean_of_means, mean_of_seeds = sum(means) / len(means), sum(seeds) / len(seeds)
        between = sum((m - mean_of_means) ** 2 for m in means) / (len(means) - 1)
        within = sum((s - mean_of_seeds) ** 2 for s in seeds) / (len(seeds) - 1)
        variances[row_method] = max(between - within / len(seeds), 0.0)
    search_sd = math.sqrt(sum(variances.values()) / len(variances))
    code, out, err = run_cli(["plan", str(REPO / "src" / "dmlbench" / "configs" / "benchmark.yaml"), "--pilot", str(pilot)], capsys)
    assert code == 0, err
    words = ", ".join(f"{method} {100 * math.sqrt(variance):.2f}" for method, variance in variances.items())
    assert f"search SD {words} points (each method its own) (measured in {pilot} per method" in out
    assert "this config (12 searches x 2 reproductions)" in out  # the built-in's most, a sequential study's maximum
    line = next(text for text in out.splitlines() if "cheapest design" in text)
    searches, reproductions = int(line.split("search_repeats=")[1].split()[0]), int(line.split("reproductions=")[1].split()[0])
    # The pilot's 5 searches per method bound each method's search SD too, and the plan at those bounds costs more.
    from dmlbench.analysis.search_luck import search_sd_upper_bound
    from dmlbench.report.committed import search_variances

    found = search_variances(pilot, ("concatenated", "map_at_r"))
    bounds = {method: search_sd_upper_bound({method: components}) for method, components in found.items()
              if method in variances}
    assert all(bounds[method] > math.sqrt(variances[method]) for method in variances)
    bound_line = next(text for text in out.splitlines() if "search SD may be up to" in text)
    assert "search SD may be up to " + ", ".join(f"{m} {100 * b:.2f}" for m, b in bounds.items()) + " points" in bound_line
    import re

    runs = int(re.findall(r"\((\d+) training runs per method", line)[-1])
    assert int(re.findall(r"\((\d+) training runs per method", bound_line)[-1]) >= runs
    code, out_sd, _ = run_cli(["plan", str(REPO / "src" / "dmlbench" / "configs" / "benchmark.yaml"), "--sd", "0.008",
                               "--search-sd", f"{search_sd}"], capsys)
    assert code == 0 and "cheapest design" in out_sd
    assert searches >= 2 and reproductions >= 2
    code, _, err = run_cli(["plan", str(REPO / "src" / "dmlbench" / "configs" / "benchmark.yaml"), "--sd", "0.008",
                            "--search-sd", "-1"], capsys)
    assert code == 2 and "--search-sd" in err



def test_plan_chooses_the_trials_per_search_from_search_sds_measured_at_each(capsys: pytest.CaptureFixture[str]) -> None:
    """--search-sd-at adds searches of other lengths, each at its measured search SD (one-trial searches of
    results/one_trial_searches_glyphs: 3.93 points pooled, search_variance.csv), and names the cheapest."""
    config = str(REPO / "configs" / "search_luck_method_glyphs.yaml")
    pilot = str(REPO / "results" / "search_luck_method_glyphs")
    code, out, err = run_cli(["plan", config, "--pilot", pilot, "--search-sd-at", "1=0.0393", "--search-sd-at", "2=0.0146"], capsys)
    assert code == 0, err
    lines = [line for line in out.splitlines() if not line.startswith("search ranges: ")]  # the pilot's ranges, last
    assert lines[-5].startswith("  trials per search (the search SD measured at each")
    assert lines[-4].startswith("    1 trial(s), search SD 3.93 points: none within 100 searches reaches 80%")
    assert lines[-3].startswith("    2 trial(s), search SD 1.46 points: protocol.search_repeats=")
    assert lines[-2].startswith("    4 trial(s), search SD 1.46 points: protocol.search_repeats=")
    # At the same search SD two trials cost less than four: the cheapest is the two-trial design.
    two = lines[-3].split(": ", 1)[1].split(" (")[0]
    assert lines[-1].startswith(f"  cheapest over trials per search: protocol.trials=2 {two} (")
    for bad, reason in ((["--search-sd-at", "4=0.01"], "the config's own protocol.trials"),
                        (["--search-sd-at", "one=0.01"], "takes TRIALS=X"),
                        (["--search-sd-at", "1=2"], "TRIALS must be a new count")):
        code, out, err = run_cli(["plan", config, "--pilot", pilot, *bad], capsys)
        assert code == 2 and reason in err and err.strip().count("\n") == 0 and out == "", err
    code, out, err = run_cli(["plan", config, "--sd", "0.008", "--search-sd-at", "1=0.01"], capsys)
    assert code == 2 and "--search-sd X or a --pilot" in err and out == ""  # refused before any line of the plan


def test_a_search_sd_per_method_plans_and_tests_each_comparison_at_its_own_luck(capsys: pytest.CaptureFixture[str]) -> None:
    """``analysis.search_sd`` as ``method -> SD``: a comparison carries sigma_a² + sigma_b² (a noisy method's
    comparisons are not planned at a pooled SD); every method needs one, and only methods may be named."""
    import math

    from dmlbench.analysis.search_sd import pair_search_sd
    from dmlbench.analysis.statistics import compare_pairs

    scores = {"a": {0: 0.61, 1: 0.64, 2: 0.60}, "b": {0: 0.58, 1: 0.60, 2: 0.59}}
    (per_method,) = compare_pairs(scores, [("a", "b")], search_sd={"a": 0.03, "b": 0.0})
    (pooled,) = compare_pairs(scores, [("a", "b")], search_sd=math.sqrt(0.03**2 / 2))
    assert per_method == pooled and pair_search_sd({"a": 0.03, "b": 0.04}, "a", "b") == pytest.approx(math.sqrt(0.00125))
    config = str(REPO / "configs" / "smoke.yaml")
    code, out, err = run_cli(["plan", config, "--sd", "0.01",
                              "analysis.search_sd={triplet_semihard: 0.001, normalized_softmax: 0.03}"], capsys)
    assert code == 0, err
    code, _, err = run_cli(["plan", config, "--sd", "0.01", "analysis.search_sd={triplet_semihard: 0.001}"], capsys)
    assert code == 2 and "gives no search SD for method 'normalized_softmax'" in err
    code, _, err = run_cli(["plan", config, "--sd", "0.01", "analysis.search_sd={triplet_semihard: 0.001, normalized_softmax: 0.03, "
                            "arcface: 0.01}"], capsys)
    assert code == 2 and "names 'arcface', which is not a method" in err


def test_a_pilot_plans_each_comparison_at_its_methods_own_search_sd(capsys: pytest.CaptureFixture[str]) -> None:
    """``dmlbench plan --pilot`` with repeated searches: each method's own search SD (search_variance.csv's), the pilot's
    shared seeds named, and the comparisons no design within reach decides named rather than sinking the rest."""
    pilot = REPO / "results" / "search_luck_method_glyphs"
    measured = {row["method"]: float(row["search_sd"]) for row in csv.DictReader((pilot / "search_variance.csv").open())
                if row["method"] != "pooled" and row["metric"] == "map_at_r"}
    code, out, err = run_cli(["plan", str(REPO / "src" / "dmlbench" / "configs" / "benchmark.yaml"), "--pilot", str(pilot)], capsys)
    assert code == 0, err
    assert f"normalized_softmax {100 * measured['normalized_softmax']:.2f} points (each method its own)" in out
    assert f"search SD contrastive {100 * measured['contrastive']:.2f}, " in out
    assert "its searches shared their seeds, so these SDs are biased low" in out
    assert "none within 100 searches for normalized_softmax vs contrastive, normalized_softmax vs triplet_semihard" in out
