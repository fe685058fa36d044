"""The scripts under results/ that derive the README's cross-study figures from committed CSV files."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from protocol_fixtures import benchmark_record
from scipy import stats

from dmlbench.protocol.design.benchmark_file import write_benchmark

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _script(name: str) -> ModuleType:
    path = RESULTS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_rankings_writes_tau_and_both_rankings(tmp_path: Path) -> None:
    means = {"first": {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6, "untrained": 0.1},
             "second": {"a": 0.7, "b": 0.9, "c": 0.6, "d": 0.5, "e": 0.95, "untrained": 0.1}}
    for study, methods in means.items():
        (tmp_path / study).mkdir()
        rows = ["method,reproduction,mode,metric,value"]
        rows += [f"{name},{r},concatenated,precision_at_1,{value + 0.01 * r}" for name, value in methods.items() for r in range(3)]
        (tmp_path / study / "runs.csv").write_text("\n".join(rows) + "\n")
    output = tmp_path / "tau.csv"
    main = _script("compare_rankings").main
    assert main([str(tmp_path / "first"), str(tmp_path / "second"), "-o", str(output), "--resamples", "200"]) == 0
    (row,) = list(csv.DictReader(output.open()))
    assert row["methods"] == "4"
    assert float(row["kendall_tau"]) == pytest.approx(stats.kendalltau([4, 3, 2, 1], [3, 4, 2, 1]).statistic, abs=1e-4)
    assert row["first_ranking"] == "a > b > c > d" and row["second_ranking"] == "b > a > c > d"


def test_convergence_counts_early_stops_best_evaluations_and_late_gains(tmp_path: Path) -> None:
    # Two runs of 6 epochs validated every 2: evaluations 0..3. Run 0 stops early after evaluation 2
    # with its best at 1; run 1 runs to the end and gains 0.1 after evaluation 1 (best at 3).
    (tmp_path / "benchmark.json").write_text(json.dumps(
        {"protocol": {"epochs": 6}, "spec": {"base": {"training": {"epochs": 99, "eval_every": 2}}}}))
    curves = {0: [0.1, 0.5, 0.4], 1: [0.1, 0.3, 0.35, 0.4]}
    rows = ["method,stage,unit,fold,evaluation,metric,value"]
    rows += [f"m,reproduction,{unit},0,{e},map_at_r,{v}" for unit, curve in curves.items() for e, v in enumerate(curve)]
    rows += ["m,reproduction,0,0,0,precision_at_1,0.9"]  # another metric, not counted
    (tmp_path / "validation_curves.csv").write_text("\n".join(rows) + "\n")
    output = tmp_path / "convergence.csv"
    assert _script("convergence").main([str(tmp_path), "--after", "1", "-o", str(output)]) == 0
    (row,) = list(csv.DictReader(output.open()))
    assert (row["runs"], row["stopped_early"], row["evaluations_mean"], row["best_evaluation_mean"]) == ("2", "1", "2.5", "2.0")
    assert (row["gain_after_mean"], row["gain_after_max"]) == ("5.00", "10.00")


def _holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment, written out: the i-th smallest p times (m - i), made monotone."""
    order = sorted(range(len(pvalues)), key=lambda index: pvalues[index])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for step, index in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - step) * pvalues[index]))
        adjusted[index] = running
    return adjusted


def _study(folder: Path, analysis: dict, scores: dict[str, list[float]]) -> None:
    folder.mkdir()
    write_benchmark(folder, benchmark_record(methods=list(scores), analysis=analysis))
    rows = ["method,reproduction,mode,metric,value"]
    rows += [f"{name},{r},concatenated,map_at_r,{value}" for name, values in scores.items() for r, value in enumerate(values)]
    (folder / "runs.csv").write_text("\n".join(rows) + "\n")


def test_transfer_rejudges_both_studies_by_one_family_and_names_what_holds(tmp_path: Path) -> None:
    """Each study's declared family re-judged from its runs (scipy's paired t-test, Holm by hand), the
    second study's comparison turned to the first's orientation, and each verdict's transfer named."""
    noise = [0.001, -0.002, 0.0015, -0.0005, 0.0, 0.002, -0.001, 0.0005]
    first = {"ref": [0.50 + e for e in noise], "up": [0.56 + 2 * e for e in noise], "down": [0.45 - e for e in noise],
             "same": [0.5005 - e for e in noise], "untrained": [0.1] * 8}
    second = {"ref": [0.40 + e for e in noise], "up": [0.47 - e for e in noise], "down": [0.46 + 3 * e for e in noise],
              "same": [0.41 + 2 * e for e in noise], "untrained": [0.1] * 8}
    _study(tmp_path / "first", {"references": ["ref"], "equivalence_margin": 0.01}, first)
    # The second declares the pair the other way round and one more comparison the first lacks.
    _study(tmp_path / "second", {"references": [], "pairs": [["ref", "up"], ["down", "ref"], ["same", "ref"], ["up", "down"]],
                                 "equivalence_margin": 0.01}, second)
    output = tmp_path / "transfer.csv"
    assert _script("transfer").main([str(tmp_path / "first"), str(tmp_path / "second"), "-o", str(output)]) == 0
    rows = {row["a"]: row for row in csv.DictReader(output.open())}
    assert set(rows) == {"up", "down", "same"} and {row["b"] for row in rows.values()} == {"ref"}
    names = ["up", "down", "same"]
    expected_first = _holm([stats.ttest_rel(first[name], first["ref"]).pvalue for name in names])
    expected_second = _holm([stats.ttest_rel(second[a], second[b]).pvalue for a, b in
                             [("ref", "up"), ("down", "ref"), ("same", "ref"), ("up", "down")]])
    for index, name in enumerate(names):
        row = rows[name]
        assert float(row["first_t_pvalue_holm"]) == pytest.approx(expected_first[index], rel=1e-9)
        assert float(row["second_t_pvalue_holm"]) == pytest.approx(expected_second[index], rel=1e-9)
        assert float(row["second_mean_difference"]) == pytest.approx(sum(second[name]) / 8 - sum(second["ref"]) / 8)
        assert float(row["second_ci_low"]) < float(row["second_mean_difference"]) < float(row["second_ci_high"])
        assert row["family_size_first"] == "3" and row["family_size_second"] == "4"
    assert (rows["up"]["first_outcome"], rows["up"]["second_outcome"], rows["up"]["transfer"]) == ("better", "better", "holds")
    assert (rows["down"]["first_outcome"], rows["down"]["second_outcome"], rows["down"]["transfer"]) == ("worse", "better", "reversed")
    assert (rows["same"]["first_outcome"], rows["same"]["transfer"]) == ("equivalent", "not confirmed")
    assert rows["same"]["second_outcome"] == "better"


def test_transfer_pairs_only_the_reproductions_every_method_scored(tmp_path: Path) -> None:
    """A reproduction that failed for one method drops its number for every comparison, as in the
    report (``results.seed_scores``), instead of stopping the script on unpaired seeds."""
    noise = [0.001, -0.002, 0.0015, -0.0005, 0.0, 0.002]
    study = {"ref": [0.50 + e for e in noise], "up": [0.56 + 2 * e for e in noise], "down": [0.45 - e for e in noise]}
    _study(tmp_path / "first", {"references": ["ref"], "equivalence_margin": 0.01}, study)
    _study(tmp_path / "second", {"references": ["ref"], "equivalence_margin": 0.01}, study)
    runs = tmp_path / "second" / "runs.csv"
    runs.write_text("".join(line for line in runs.open() if not line.startswith("up,5,")))  # up's last one failed
    output = tmp_path / "transfer.csv"
    assert _script("transfer").main([str(tmp_path / "first"), str(tmp_path / "second"), "-o", str(output)]) == 0
    rows = {row["a"]: row for row in csv.DictReader(output.open())}
    assert {row["first_n"] for row in rows.values()} == {"6"} and {row["second_n"] for row in rows.values()} == {"5"}
    expected = _holm([stats.ttest_rel(study[name][:5], study["ref"][:5]).pvalue for name in ("up", "down")])
    assert [float(rows[name]["second_t_pvalue_holm"]) for name in ("up", "down")] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("first", "second", "table"), [
    ("reality_check_glyphs", "converged_glyphs", "converged_glyphs/transfer_from_short_study.csv"),
    ("reality_check_glyphs", "reality_check_emoji", "reality_check_emoji/transfer_from_glyphs.csv"),
    ("converged_glyphs", "reality_check_emoji", "reality_check_emoji/transfer_from_converged_glyphs.csv"),
    ("default_one_thread", "default_strong_glyphs", "default_strong_glyphs/transfer_from_default.csv"),
    ("reality_check_glyphs", "fixed_lr_short_glyphs", "fixed_lr_short_glyphs/transfer_from_short_study.csv"),
    ("reality_check_glyphs", "lr_search_short_glyphs", "lr_search_short_glyphs/transfer_from_short_study.csv"),
    ("converged_glyphs", "converged_glyphs_strong", "converged_glyphs_strong/transfer_from_converged_glyphs.csv"),
    ("converged_glyphs_strong", "reality_check_emoji", "reality_check_emoji/transfer_from_converged_glyphs_strong.csv"),
    # The same tables with triplet + semihard re-measured after the semihard fix in both studies.
    ("reality_check_glyphs_semihard_fix", "converged_glyphs_semihard_fix", "converged_glyphs_semihard_fix/transfer_from_short_study.csv"),
    ("converged_glyphs_semihard_fix", "converged_glyphs_strong_semihard_fix",
     "converged_glyphs_strong_semihard_fix/transfer_from_converged_glyphs.csv"),
    ("reality_check_glyphs_semihard_fix", "reality_check_emoji_semihard_fix", "reality_check_emoji_semihard_fix/transfer_from_glyphs.csv"),
    ("converged_glyphs_semihard_fix", "reality_check_emoji_semihard_fix",
     "reality_check_emoji_semihard_fix/transfer_from_converged_glyphs.csv"),
    ("converged_glyphs_strong_semihard_fix", "reality_check_emoji_semihard_fix",
     "reality_check_emoji_semihard_fix/transfer_from_converged_glyphs_strong.csv"),
])
def test_the_committed_transfer_table_is_what_the_script_writes(first: str, second: str, table: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The READMEs under results/ cite these transfer tables: each must still follow from its two
    committed studies by the committed script; the printed count of newly decided verdicts is the table's."""
    output = tmp_path / "transfer.csv"
    assert _script("transfer").main([str(RESULTS / first), str(RESULTS / second), "-o", str(output)]) == 0
    assert output.read_bytes() == (RESULTS / table).read_bytes()
    rows = list(csv.DictReader(output.open()))
    undecided = [row for row in rows if row["first_outcome"] == "inconclusive"]
    later = [row["second_outcome"] for row in undecided if row["second_outcome"] != "inconclusive"]
    shown = "".join(f", {name} {later.count(name)}" for name in ("better", "worse", "equivalent") if later.count(name))
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"of the first study's {len(undecided)} inconclusive verdicts, the second decides {len(later)}{shown}")


def test_domain_errors_match_brute_force_loops_and_evaluate() -> None:
    """Nearest neighbours by float64 loops over every pair (ties to the lower index), per query domain."""
    import numpy as np

    script = _script("domain_errors")
    generator = np.random.default_rng(3)
    labels = np.repeat(np.arange(6), 3)  # six classes, each drawn once by each of three domains
    domains = np.array(["a", "b", "c"] * 6)
    embeddings = generator.normal(size=(18, 4))
    # Equal directions, ties after normalisation: query 5 (class 1) has 4 (class 1) and 7 (class 2) at
    # distance 0 and must take 4, the lower index, in both lists.
    embeddings[5], embeddings[7] = embeddings[4] * 2.0, embeddings[4] * 3.0
    rows = script.error_rows("m", embeddings, labels, domains)

    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)

    def first_nearest(i: int, allowed) -> int:
        best, best_distance = -1, np.inf
        for j in range(18):
            if j != i and allowed(j):
                distance = float(np.sqrt(((unit[i] - unit[j]) ** 2).sum()))
                if distance < best_distance:
                    best, best_distance = j, distance
        return best

    any_other = [first_nearest(i, lambda j: True) for i in range(18)]
    assert any_other[5] == 4
    cross = [first_nearest(i, lambda j, i=i: domains[j] != domains[i]) for i in range(18)]
    for row, domain in zip(rows, ["a", "b", "c", "all"]):
        queries = [i for i in range(18) if domain in ("all", domains[i])]
        wrong = [i for i in queries if labels[any_other[i]] != labels[i]]
        assert row[:6] == ["m", domain, len(queries),
                           round(np.mean([labels[any_other[i]] == labels[i] for i in queries]), 6),
                           round(np.mean([labels[cross[i]] == labels[i] for i in queries]), 6), len(wrong)]
        assert row[6] == round(np.mean([domains[any_other[i]] == domains[i] for i in wrong]), 6)
        # by chance: 5 of a query's 15 candidates of other classes are of its own domain
        assert row[7] == round(5 / 15, 6)
        assert row[8] == round(np.mean([labels[cross[i]] == labels[i] for i in wrong]), 6)
    script.check_against_evaluate(rows[-1], embeddings, labels, domains)
    with pytest.raises(SystemExit, match="differs from dmlbench.evaluate"):
        script.check_against_evaluate(["m", "all", 18, rows[-1][3] + 0.01, *rows[-1][4:]], embeddings, labels, domains)


def test_confound_separates_two_changes_with_welch_intervals(tmp_path: Path) -> None:
    """Cell gaps are paired t intervals; a two-cell effect is Welch's t-test (scipy); the interaction's
    four-term Satterthwaite interval is written out by hand; Holm over the five effects."""
    import numpy as np

    script = _script("confound")
    generator = np.random.default_rng(5)
    shift = {"neither": 0.00, "lr": 0.03, "budget": 0.01, "both": 0.02}
    gaps = {}
    for cell, offset in shift.items():
        n = 20 if cell != "budget" else 12  # unequal sizes: Welch's degrees of freedom matter
        a = 0.5 + offset + generator.normal(0, 0.01 * (1 + len(cell) % 3), n)
        b = 0.5 + generator.normal(0, 0.01, n)
        gaps[cell] = a - b
        rows = ["method,reproduction,mode,metric,value"]
        rows += [f"{name},{r},concatenated,map_at_r,{float(value)!r}" for name, values in (("A", a), ("B", b))
                 for r, value in enumerate(values)]
        (tmp_path / cell).mkdir()
        (tmp_path / cell / "runs.csv").write_text("\n".join(rows) + "\n")
    output = tmp_path / "confound.csv"
    arguments = [item for cell in script.CELLS for item in (f"--{cell}", str(tmp_path / cell))]
    assert script.main([*arguments, "--a", "A", "--b", "B", "-o", str(output)]) == 0
    table = {(row["quantity"], row["name"]): row for row in csv.DictReader(output.open())}

    low, high = stats.t.interval(0.95, 19, loc=gaps["lr"].mean(), scale=stats.sem(gaps["lr"]))
    row = table["gap", "lr"]
    assert float(row["estimate"]) == pytest.approx(gaps["lr"].mean(), abs=1e-12)
    assert (float(row["ci_low"]), float(row["ci_high"])) == pytest.approx((low, high), abs=1e-12)

    welch = stats.ttest_ind(gaps["budget"], gaps["neither"], equal_var=False)
    row = table["effect", "budget at fixed lr"]
    interval = welch.confidence_interval(0.95)
    assert float(row["pvalue"]) == pytest.approx(welch.pvalue, rel=1e-9)
    assert (float(row["ci_low"]), float(row["ci_high"])) == pytest.approx((interval.low, interval.high), abs=1e-12)
    assert float(row["df"]) == pytest.approx(welch.df, rel=1e-9)

    terms = [(1, gaps["both"]), (-1, gaps["budget"]), (-1, gaps["lr"]), (1, gaps["neither"])]
    estimate = sum(c * sum(v) / len(v) for c, v in terms)
    pieces = [sum((x - sum(v) / len(v)) ** 2 for x in v) / (len(v) - 1) / len(v) for _, v in terms]
    freedom = sum(pieces) ** 2 / sum(p ** 2 / (len(v) - 1) for p, (_, v) in zip(pieces, terms))
    half = stats.t.ppf(0.975, freedom) * sum(pieces) ** 0.5
    row = table["effect", "interaction"]
    assert float(row["estimate"]) == pytest.approx(estimate, abs=1e-12)
    assert (float(row["ci_low"]), float(row["ci_high"])) == pytest.approx((estimate - half, estimate + half), abs=1e-12)
    assert row["n"] == "20+12+20+20"

    raw = [float(table["effect", name]["pvalue"]) for name in script.EFFECTS]
    order = sorted(range(5), key=lambda i: raw[i])
    expected, running = [0.0] * 5, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (5 - rank) * raw[i]))
        expected[i] = running
    assert [float(table["effect", name]["pvalue_holm"]) for name in script.EFFECTS] == pytest.approx(expected, rel=1e-12)

    with pytest.raises(SystemExit, match="no C in runs.csv"):
        script.main([*arguments, "--a", "C", "--b", "B", "-o", str(output)])


def test_domain_errors_embeds_a_reproduction_as_the_protocol_scores_it(tmp_path: Path) -> None:
    """A reproduction directory's fold models, concatenated by the script, score what ``score_modes``
    gives the protocol's concatenated mode."""
    import numpy as np
    import torch

    from dmlbench import config as config_module
    from dmlbench import evaluate
    from dmlbench.protocol.units.scoring import score_modes
    from dmlbench.training import train
    from dmlbench.training.runs import embed_test_split
    from training_fixtures import TINY

    script = _script("domain_errors")
    reproduction = tmp_path / "m" / "reproduction_00"
    for fold in (0, 1):
        config = config_module.load(None, [*TINY, "training.epochs=1", f"seed={fold}"])
        train(config, reproduction / f"fold_{fold}", progress=False)
    embeddings, labels, domains = script.test_embeddings(reproduction, untrained=False)
    folds = {name: embed_test_split(reproduction / name)[0] for name in ("fold_0", "fold_1")}
    assert embeddings.shape[1] == sum(matrix.shape[1] for matrix in folds.values())
    assert np.allclose(np.linalg.norm(embeddings[:, :16], axis=1), 1.0)
    assert domains.item() is None  # glyphs carry no domain
    expected = score_modes(folds, torch.as_tensor(labels), ["precision_at_1", "map_at_r"], 0, None)["concatenated"]
    scored = evaluate(embeddings, labels, metrics=["precision_at_1", "map_at_r"])
    assert {name: scored[name] for name in expected} == expected
    with pytest.raises(SystemExit, match="--untrained takes run directories"):
        script.test_embeddings(reproduction, untrained=True)


def test_domain_errors_averages_the_reproductions_of_each_method() -> None:
    script = _script("domain_errors")
    rows = [["runs/b/m/reproduction_00", "all", 10, 0.5, 0.6, 5, 0.8, 0.25, 0.2],
            ["runs/b/m/reproduction_01", "all", 10, 0.7, 0.9, 3, 0.6, 0.25, ""],
            ["runs/b/m/reproduction_00", "apple", 4, 0.25, 0.5, 3, 1.0, 0.3, 0.0],
            ["runs/deploy/emoji", "all", 10, 0.1, 0.2, 9, 0.5, 0.25, 0.1]]  # a run, not a reproduction: no mean
    assert script.method_means(rows) == [
        ["m (mean of 2 reproductions)", "all", 10.0, 0.6, 0.75, 4.0, 0.7, 0.25, 0.2],
        ["m (mean of 1 reproduction)", "apple", 4.0, 0.25, 0.5, 3.0, 1.0, 0.3, 0.0]]


def test_domain_errors_reuses_an_earlier_output_without_embedding_again(tmp_path: Path) -> None:
    """``--reuse``: a model the earlier CSV holds is copied from it (its directory is not even read),
    with the types ``error_rows`` gives, and the method means are recomputed over old and new rows."""
    import numpy as np

    script = _script("domain_errors")
    generator = np.random.default_rng(5)
    labels, domains = np.repeat(np.arange(5), 3), np.array(["a", "b", "c"] * 5)
    rows = [*script.error_rows("gone/m/reproduction_00", generator.normal(size=(15, 4)), labels, domains),
            *script.error_rows("gone/m/reproduction_01", generator.normal(size=(15, 4)), labels, domains)]
    earlier = tmp_path / "earlier.csv"
    with earlier.open("w", newline="") as stream:
        csv.writer(stream, lineterminator="\n").writerows([script.COLUMNS, *rows, *script.method_means(rows[:4])])
    assert script.read_rows(earlier) == {"gone/m/reproduction_00": rows[:4], "gone/m/reproduction_01": rows[4:]}

    output = tmp_path / "out.csv"
    assert script.main(["gone/m/reproduction_00", "gone/m/reproduction_01", "--reuse", str(earlier), "-o", str(output)]) == 0
    with output.open(newline="") as stream:
        written = list(csv.reader(stream))
    expected = [[str(value) for value in row] for row in [*rows, *script.method_means(rows)]]
    assert written == [script.COLUMNS, *expected]
    assert written[-1][0] == "m (mean of 2 reproductions)"
    # The output is rewritten after every model, so an interrupted list resumes from its own output.
    assert script.main(["gone/m/reproduction_00", "gone/m/reproduction_01", "--reuse", str(output), "-o", str(output)]) == 0
    assert output.read_text() == "\n".join(",".join(row) for row in [script.COLUMNS, *expected]) + "\n"
    (tmp_path / "bad.csv").write_text("model,domain\n")
    with pytest.raises(SystemExit, match="not an output of domain_errors.py"):
        script.read_rows(tmp_path / "bad.csv")


def test_the_committed_confound_table_is_what_the_script_writes(tmp_path: Path) -> None:
    """results/converged_glyphs_strong/README.md and results/README.md quote this 2 x 2 table: it must still
    follow from the four committed cells by the committed script."""
    cells = {"neither": "fixed_lr_short_glyphs", "lr": "lr_search_short_glyphs",
             "budget": "fixed_lr_converged_glyphs", "both": "converged_glyphs_strong"}
    output = tmp_path / "confound.csv"
    arguments = [item for cell, folder in cells.items() for item in (f"--{cell}", str(RESULTS / folder))]
    assert _script("confound").main([*arguments, "--a", "normalized_softmax", "--b", "contrastive", "-o", str(output)]) == 0
    assert output.read_bytes() == (RESULTS / "converged_glyphs_strong" / "confound.csv").read_bytes()


@pytest.mark.parametrize(("first", "second", "table"), [
    ("converged_glyphs", "converged_glyphs_strong", "converged_glyphs_strong/ranking_against_converged_glyphs.csv"),
    ("reality_check_glyphs", "converged_glyphs_strong", "converged_glyphs_strong/ranking_against_short_study.csv"),
    ("converged_glyphs_strong", "reality_check_emoji", "reality_check_emoji/ranking_against_converged_glyphs_strong.csv"),
    ("reality_check_glyphs_semihard_fix", "converged_glyphs_semihard_fix", "converged_glyphs_semihard_fix/ranking_against_short_study.csv"),
    ("converged_glyphs_semihard_fix", "converged_glyphs_strong_semihard_fix",
     "converged_glyphs_strong_semihard_fix/ranking_against_converged_glyphs.csv"),
    ("reality_check_glyphs_semihard_fix", "converged_glyphs_strong_semihard_fix",
     "converged_glyphs_strong_semihard_fix/ranking_against_short_study.csv"),
    ("reality_check_glyphs_semihard_fix", "reality_check_emoji_semihard_fix", "reality_check_emoji_semihard_fix/ranking_against_glyphs.csv"),
    ("converged_glyphs_semihard_fix", "reality_check_emoji_semihard_fix",
     "reality_check_emoji_semihard_fix/ranking_against_converged_glyphs.csv"),
    ("converged_glyphs_strong_semihard_fix", "reality_check_emoji_semihard_fix",
     "reality_check_emoji_semihard_fix/ranking_against_converged_glyphs_strong.csv"),
])
def test_the_committed_ranking_table_is_what_the_script_writes(first: str, second: str, table: str, tmp_path: Path) -> None:
    """The Kendall tau tables the READMEs quote (seeded bootstraps) follow from their two committed studies."""
    output = tmp_path / "ranking.csv"
    assert _script("compare_rankings").main([str(RESULTS / first), str(RESULTS / second), "-o", str(output)]) == 0
    assert output.read_bytes() == (RESULTS / table).read_bytes()


def test_trials_per_search_cuts_random_searches_short_and_prices_them_at_equal_cost(tmp_path: Path) -> None:
    """Three random searches of three trials: per number of trials, the mean and SD of the best so far over
    searches, the share already at their final choice, and the SE at the recorded design's cost, each
    checked by hand; a search whose later trials were modelled is refused."""
    trials_by_search = {0: [0.50, 0.40, 0.55], 1: [0.60, 0.62, 0.61], 2: [0.30, 0.35, 0.70]}
    lines = ["method,search,trials,running_best,expected_best,expected_best_sd"]
    for search, values in trials_by_search.items():
        lines += [f"m,{search},{t},{max(values[:t])},0,0" for t in range(1, 4)]
    (tmp_path / "budget.csv").write_text("\n".join(lines) + "\n")
    protocol = {"trials": 3, "reproductions": 2, "folds": 2, "startup_trials": None}
    (tmp_path / "benchmark.json").write_text(json.dumps({"protocol": protocol}))
    output = tmp_path / "out.csv"
    module = _script("trials_per_search")
    assert module.main([str(tmp_path), "-o", str(output)]) == 0
    got = list(csv.DictReader(output.open()))
    assert [row["trials"] for row in got] == ["1", "2", "3"]
    for t, row in enumerate(got, start=1):
        bests = [max(values[:t]) for values in trials_by_search.values()]
        finals = [max(values) for values in trials_by_search.values()]
        assert float(row["best_validation_mean"]) == pytest.approx(sum(bests) / 3)
        sd = float(row["best_validation_sd"])
        assert sd == pytest.approx(float(stats.tstd(bests)))
        assert float(row["same_choice_share"]) == pytest.approx(sum(b == f for b, f in zip(bests, finals)) / 3)
        assert int(row["runs_per_search"]) == 2 * (t + 2)
        assert float(row["se_at_equal_cost"]) == pytest.approx(sd / (3 * (3 + 2) / (t + 2)) ** 0.5)
    assert [float(row["same_choice_share"]) for row in got] == pytest.approx([0.0, 1 / 3, 1.0])
    (tmp_path / "benchmark.json").write_text(json.dumps({"protocol": {**protocol, "startup_trials": 1}}))
    with pytest.raises(SystemExit, match="suggested by the sampler's model"):
        module.main([str(tmp_path)])


def test_the_committed_trials_per_search_table_is_what_the_script_writes(tmp_path: Path) -> None:
    """results/search_luck_method_glyphs/README.md quotes this table: it must still come from the committed budget.csv."""
    folder = RESULTS / "search_luck_method_glyphs"
    output = tmp_path / "trials_per_search.csv"
    assert _script("trials_per_search").main([str(folder), "-o", str(output)]) == 0
    assert output.read_text() == (folder / "trials_per_search.csv").read_text()


def test_trials_per_search_test_side_pairs_the_searches_and_checks_identical_choices(tmp_path: Path) -> None:
    """With --short: per method the test search means of both studies over their common searches, the SE at
    the long design's cost, and of the searches that chose the same configuration, how many reproduced
    identically (a changed digit is counted as not identical)."""
    def study(name: str, trials: int, choices: dict[int, tuple[str, list[float]]]) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "benchmark.json").write_text(json.dumps({"protocol": {"trials": trials, "reproductions": 2, "folds": 2}}))
        lines = ["method,search,search_seed,best_validation,best_params,reproductions_scored,test_concatenated_map_at_r"]
        runs = ["method,reproduction,mode,metric,value,search"]
        for search, (params, values) in choices.items():
            lines.append(f"m,{search},{search},0.5,{params},2,{sum(values) / 2!r}")
            runs += [f"m,{k},concatenated,map_at_r,{value!r},{search}" for k, value in enumerate(values)]
        (folder / "search_repeats.csv").write_text("\n".join(lines) + "\n")
        (folder / "runs.csv").write_text("\n".join(runs) + "\n")
        (folder / "budget.csv").write_text("method,search,trials,running_best,expected_best,expected_best_sd\n")
        return folder

    long = study("long", 3, {0: ("a=1", [0.40, 0.42]), 1: ("a=2", [0.44, 0.46]), 2: ("a=3", [0.30, 0.32]), 3: ("a=4", [0.5, 0.5])})
    short = study("short", 1, {0: ("a=1", [0.40, 0.42]), 1: ("a=2", [0.44, 0.4600001]), 2: ("a=9", [0.20, 0.22])})
    output = tmp_path / "test.csv"
    module = _script("trials_per_search")
    assert module.main([str(long), "--short", str(short), "--test-output", str(output), "-o", str(tmp_path / "v.csv")]) == 0
    short_row, long_row = list(csv.DictReader(output.open()))
    assert (short_row["trials"], long_row["trials"], short_row["searches"]) == ("1", "3", "3")
    assert (short_row["same_choice"], short_row["identical"]) == ("2", "1")
    short_means, long_means = [0.41, 0.45000005, 0.21], [0.41, 0.45, 0.31]
    assert float(short_row["test_mean"]) == pytest.approx(sum(short_means) / 3)
    assert float(short_row["test_sd"]) == pytest.approx(float(stats.tstd(short_means)))
    assert float(short_row["se_at_equal_cost"]) == pytest.approx(float(stats.tstd(short_means)) / (3 * 5 / 3) ** 0.5)
    assert float(long_row["se_at_equal_cost"]) == pytest.approx(float(stats.tstd(long_means)) / 3 ** 0.5)
    assert int(short_row["runs_per_search"]) == 6 and int(long_row["runs_per_search"]) == 10


def test_the_committed_one_trial_test_table_is_what_the_script_writes(tmp_path: Path) -> None:
    """results/one_trial_searches_glyphs/README.md quotes this table: it must still come from the two studies' committed files."""
    output = tmp_path / "test.csv"
    assert _script("trials_per_search").main([str(RESULTS / "search_luck_method_glyphs"), "--short", str(RESULTS / "one_trial_searches_glyphs"),
                                              "--test-output", str(output), "-o", str(tmp_path / "selection.csv")]) == 0
    assert output.read_text() == (RESULTS / "one_trial_searches_glyphs" / "trials_per_search_test.csv").read_text()


def test_trials_per_search_refuses_damaged_copies_in_one_line(tmp_path: Path) -> None:
    """A budget.csv cut short, or a damaged benchmark.json, is one line naming the file, never a table
    from part of the study or a traceback."""
    folder = RESULTS / "search_luck_method_glyphs"
    (tmp_path / "benchmark.json").write_text((folder / "benchmark.json").read_text())
    (tmp_path / "budget.csv").write_text((folder / "budget.csv").read_text()[:500])
    module = _script("trials_per_search")
    with pytest.raises(SystemExit, match="budget.csv is truncated"):
        module.main([str(tmp_path)])
    (tmp_path / "benchmark.json").write_text('{"prot')
    with pytest.raises(SystemExit, match="benchmark.json is missing or damaged"):
        module.main([str(tmp_path)])


def _spliceable(folder: Path, rows: list[str], margin_high: float = 0.5, threads: int | None = None) -> None:
    folder.mkdir()
    spec = {"base": {"seed": 0}, "methods": [{"name": "a"}, {"name": "b", "search": {"loss.params.margin": {"low": 0.05, "high": margin_high}}}]}
    write_benchmark(folder, benchmark_record(methods=["a", "b"], spec=spec, fold_layout_hash="f", threads_per_worker=threads))
    columns = "method,reproduction,mode,metric,value" + (",search" if rows[0].count(",") == 5 else "")
    (folder / "runs.csv").write_text("\n".join([columns, *rows]) + "\n")
    methods = dict.fromkeys(row.split(",")[0] for row in rows)
    (folder / "results.csv").write_text("method,mode,metric,mean,ci_low,ci_high,n\n"
                                        + "".join(f"{name},concatenated,map_at_r,{len(name)},0,1,2\n" for name in methods))


def test_splice_method_replaces_one_methods_rows_where_they_stood_and_checks_the_design(tmp_path: Path,
                                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The study's rows with the method's re-measured rows in their place; the re-measure's `search` column
    (one search) dropped to the study's columns; its baselines compared with the study's; a re-measure of
    another design, or with a second search, refused in one line (exit 2) before anything is written."""
    _spliceable(tmp_path / "study", ["a,0,concatenated,map_at_r,0.4", "b,0,concatenated,map_at_r,0.3",
                                     "b,1,concatenated,map_at_r,0.31", "untrained,0,concatenated,map_at_r,0.1"])
    _spliceable(tmp_path / "fix", ["b,0,concatenated,map_at_r,0.35,0", "b,1,concatenated,map_at_r,0.36,0",
                                   "untrained,0,concatenated,map_at_r,0.1,0"])
    main = _script("splice_method").main
    out = tmp_path / "out"
    assert main([str(tmp_path / "study"), str(tmp_path / "fix"), "--method", "b", "-o", str(out)]) == 0
    assert (out / "runs.csv").read_text().splitlines() == [
        "method,reproduction,mode,metric,value", "a,0,concatenated,map_at_r,0.4", "b,0,concatenated,map_at_r,0.35",
        "b,1,concatenated,map_at_r,0.36", "untrained,0,concatenated,map_at_r,0.1"]
    assert [line.split(",")[0] for line in (out / "results.csv").read_text().splitlines()] == ["method", "a", "b", "untrained"]
    assert (out / "benchmark.json").read_text() == (tmp_path / "study" / "benchmark.json").read_text()
    assert "baselines: 1 of 1 values in both identical" in capsys.readouterr().out

    _spliceable(tmp_path / "other", ["b,0,concatenated,map_at_r,0.35"], margin_high=0.6)
    _spliceable(tmp_path / "two", ["b,0,concatenated,map_at_r,0.35,0", "b,0,concatenated,map_at_r,0.2,1"])
    _spliceable(tmp_path / "threads_study", ["b,0,concatenated,map_at_r,0.3"], threads=1)
    _spliceable(tmp_path / "threads", ["b,0,concatenated,map_at_r,0.35"], threads=2)
    # a study that predates its thread record cannot be checked; one that has it can
    assert main([str(tmp_path / "study"), str(tmp_path / "threads"), "--method", "b", "-o", str(tmp_path / "unknown")]) == 0
    _spliceable(tmp_path / "cut", ["b,0,concatenated,map_at_r,0.35", "b,1,concatenated,map_at_r,0.36"])
    (tmp_path / "cut" / "runs.csv").write_text((tmp_path / "cut" / "runs.csv").read_text()[:-12])
    refused = (("study", "other", "spec.methods[b] differ"), ("study", "two", "do not fit the study's"),
               ("threads_study", "threads", "threads_per_worker differ"), ("study", "cut", "runs.csv is truncated or damaged"))
    for study, remeasure, message in refused:
        with pytest.raises(SystemExit) as exit_info:
            main([str(tmp_path / study), str(tmp_path / remeasure), "--method", "b", "-o", str(tmp_path / f"out_{remeasure}")])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
        assert not (tmp_path / f"out_{remeasure}").exists()
