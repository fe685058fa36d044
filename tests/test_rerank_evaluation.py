"""Re-ranking wired into the run config, ``evaluate``, the protocol, ``dmlbench evaluate`` and ``dmlbench query``.

The re-ranking algorithms themselves are checked against the equations in test_evaluation_rerank.py;
here every path that applies them is checked against applying ``rerank.reranked_neighbors`` by hand
(or the brute-force loops of that file), with the metrics recomputed by float64 loops.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from cli_runner import run_cli
from dmlbench import config as config_module
from dmlbench.errors import UserInputError
from dmlbench.evaluation import evaluate, evaluate_many
from dmlbench.evaluation.rerank import KReciprocal, QueryExpansion, build, reranked_neighbors
from test_evaluation_rerank import brute_query_expansion

METHODS = [QueryExpansion(neighbours=3, alpha=2.0, database_side=True), QueryExpansion(neighbours=1, alpha=0.0,
           database_side=False), KReciprocal(k1=6, k2=3, original_weight=0.3)]


def small_case(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 6, size=48)
    centres = rng.normal(size=(6, 5))
    return centres[labels] + 0.9 * rng.normal(size=(48, 5)), labels


def metrics_by_hand(ids: np.ndarray, labels: np.ndarray, queries: np.ndarray, references: np.ndarray,
                    self_retrieval: bool) -> dict[str, float]:
    """P@1 and MAP@R of the given neighbour lists, written out as loops (queries without a match left out)."""
    precision, average = [], []
    for row, q in enumerate(queries):
        relevant = sum(1 for r in references if labels[r] == labels[q] and not (self_retrieval and r == q))
        if relevant == 0:
            continue
        hits = [labels[g] == labels[q] for g in ids[row][:relevant]]
        precision.append(float(hits[0]))
        found, total = 0, 0.0
        for position, hit in enumerate(hits, start=1):
            if hit:
                found += 1
                total += found / position
        average.append(total / relevant)
    return {"precision_at_1": float(np.mean(precision)), "map_at_r": float(np.mean(average))}


@pytest.mark.parametrize("method", METHODS, ids=["qe_dba", "qe_plain", "k_reciprocal"])
@pytest.mark.parametrize("with_mask", [False, True])
def test_evaluate_with_rerank_equals_the_reranked_lists_by_hand(method, with_mask: bool) -> None:
    rows, labels = small_case(3)
    mask = np.arange(len(rows)) % 4 == 0 if with_mask else None
    everyone = np.arange(len(rows))
    queries, references = (everyone[mask], everyone[~mask]) if with_mask else (everyone, everyone)
    k = 12
    found = reranked_neighbors(torch.from_numpy(rows), torch.from_numpy(queries), torch.from_numpy(references), k,
                               exclude_self=not with_mask, method=method)
    expected = metrics_by_hand(found.ids.numpy(), labels, queries, references, not with_mask)
    results = evaluate(rows, labels, metrics=["precision_at_1", "map_at_r", "nmi"], query_mask=mask, k=k, rerank=method)
    assert results["precision_at_1"] == pytest.approx(expected["precision_at_1"], abs=1e-12)
    assert results["map_at_r"] == pytest.approx(expected["map_at_r"], abs=1e-12)
    raw = evaluate(rows, labels, metrics=["precision_at_1", "map_at_r", "nmi"], query_mask=mask, k=k)
    assert results["nmi"] == raw["nmi"]  # clustering stays on the embeddings
    assert (results["precision_at_1"], results["map_at_r"]) != (raw["precision_at_1"], raw["map_at_r"])


def test_rerank_given_as_a_mapping_a_kind_or_built_is_the_same() -> None:
    rows, labels = small_case(4)
    built = evaluate(rows, labels, metrics=["map_at_r"], rerank=build("query_expansion", alpha=1.5))
    assert evaluate(rows, labels, metrics=["map_at_r"], rerank={"kind": "query_expansion", "params": {"alpha": 1.5}}) == built
    assert evaluate(rows, labels, metrics=["map_at_r"], rerank="query_expansion") == evaluate(
        rows, labels, metrics=["map_at_r"], rerank=QueryExpansion())
    assert evaluate(rows, labels, metrics=["map_at_r"], rerank="none") == evaluate(rows, labels, metrics=["map_at_r"])


def test_evaluate_many_separated_averages_the_reranked_scores() -> None:
    rows, labels = small_case(5)
    embeddings = {"a": rows, "b": rows[:, ::-1] * np.linspace(1.0, 2.0, rows.shape[1])}
    method = KReciprocal(k1=5, k2=2)
    separated = evaluate_many(embeddings, labels, mode="separated", metrics=["map_at_r"], rerank=method)
    each = [evaluate(matrix, labels, metrics=["map_at_r"], rerank=method)["map_at_r"] for matrix in embeddings.values()]
    assert separated["map_at_r"] == pytest.approx(np.mean(each), abs=1e-15)


@pytest.mark.parametrize("options, message", [
    ({"binarize": True}, "L2-normalised float embeddings"),
    ({"normalize": False}, "L2-normalised float embeddings"),
    ({"domains": np.arange(48) % 2}, "cross-domain"),
    ({"backend": "faiss"}, "drop backend"),
    ({"block_size": 8}, "drop backend"),
])
def test_combinations_rerank_cannot_honour_are_refused(options: dict, message: str) -> None:
    rows, labels = small_case(6)
    with pytest.raises(UserInputError, match=message):
        evaluate(rows, labels, metrics=["map_at_r"], rerank=QueryExpansion(), **options)


@pytest.mark.parametrize("rerank, message", [
    ({"kind": "qe"}, "rerank.kind must be one of none, query_expansion, k_reciprocal"),
    ({"kind": "k_reciprocal", "params": {"k1": 0}}, "rerank.k1 must be an integer > 0"),
    ({"kind": "query_expansion", "params": {"k1": 3}}, "has no parameter k1"),
    ({"kind": "none", "params": {"alpha": 3}}, "none takes no parameters"),
    ({"kind": "query_expansion", "weights": 1}, "rerank must be"),
])
def test_bad_rerank_is_one_line(rerank: dict, message: str) -> None:
    rows, labels = small_case(7)
    with pytest.raises(UserInputError, match=message):
        evaluate(rows, labels, metrics=["map_at_r"], rerank=rerank)


# --- the run config ----------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, message", [
    (["evaluation.rerank.kind=qe"], "config key 'evaluation.rerank': rerank.kind must be one of"),
    (["evaluation.rerank.kind=k_reciprocal", "evaluation.rerank.params={k1: 2.5}"], "rerank.k1 must be an integer"),
    (["evaluation.rerank.params.alpha=2"], "rerank.kind none takes no parameters"),
    (["evaluation.rerank.kind=query_expansion", "evaluation.rerank.params.k2=2"], "has no parameter k2"),
    (["evaluation.rerank.kind=query_expansion", "evaluation.rerank.extra=1"], "unknown config key 'evaluation.rerank.extra'"),
    (["evaluation.rerank.kind=query_expansion", "model.binarize=true"], "evaluation.rerank needs float embeddings"),
])
def test_config_rerank_is_validated_by_build(overrides: list[str], message: str) -> None:
    with pytest.raises(UserInputError, match=message) as raised:
        config_module.from_dict({}, overrides)
    assert "\n" not in str(raised.value)


def test_config_rerank_round_trips_and_none_leaves_the_stored_config_unchanged() -> None:
    default = config_module.from_dict({})
    explicit_none = config_module.from_dict({"evaluation": {"rerank": {"kind": "none", "params": {}}}})
    assert "rerank" not in config_module.to_yaml(default)
    assert config_module.to_yaml(explicit_none) == config_module.to_yaml(default)
    assert default.evaluation.rerank.method() is None
    config = config_module.from_dict({}, ["evaluation.rerank.kind=k_reciprocal", "evaluation.rerank.params={k1: 12, k2: 4}"])
    assert config.evaluation.rerank.method() == KReciprocal(k1=12, k2=4)
    again = config_module.from_dict(yaml.safe_load(config_module.to_yaml(config)))
    assert again == config


def test_a_search_space_reaches_the_rerank_params_and_checks_them() -> None:
    from dmlbench.protocol.design.search_space import parse_search_space

    base = {"evaluation": {"rerank": {"kind": "query_expansion", "params": {"neighbours": 2}}}}
    space = parse_search_space({"evaluation.rerank.params.alpha": {"low": 0.0, "high": 4.0}}, base)
    assert space.keys() == ["evaluation.rerank.params.alpha"]
    assigned = config_module.from_dict(config_module.assign(base, {"evaluation.rerank.params.alpha": 1.25}))
    assert assigned.evaluation.rerank.method() == QueryExpansion(neighbours=2, alpha=1.25)
    with pytest.raises(UserInputError, match="rerank.neighbours must be an integer"):
        parse_search_space({"evaluation.rerank.params.neighbours": {"low": 0.5, "high": 3.0}}, base)


# --- the protocol ------------------------------------------------------------------------------------


def test_score_modes_adds_the_reranked_modes_and_none_adds_nothing(tmp_path: Path) -> None:
    from dmlbench.protocol.units.results import MethodReproductions, ReproductionOutcome, compare_reranking, write_results
    from dmlbench.protocol.units.scoring import score_modes

    rows, labels = small_case(8)
    embeddings = {"fold_0": rows, "fold_1": rows[::-1].copy()}
    plain = score_modes(embeddings, labels, ["map_at_r"], 0, None)
    assert score_modes(embeddings, labels, ["map_at_r"], 0, None, None, None) == plain
    method = QueryExpansion(alpha=2.0)
    reranked = score_modes(embeddings, labels, ["map_at_r"], 0, None, None, method)
    assert list(reranked) == ["concatenated", "separated", "concatenated_reranked", "separated_reranked"]
    assert {mode: reranked[mode] for mode in plain} == plain
    assert reranked["concatenated_reranked"]["map_at_r"] == evaluate_many(
        embeddings, labels, mode="concatenated", metrics=["map_at_r"], rerank=method)["map_at_r"]
    # Two reproductions: the paired comparison is the paired t-test of (re-ranked - raw) by seed.
    second = score_modes({"fold_0": rows * 1.5, "fold_1": rows[:, ::-1].copy()}, labels, ["map_at_r"], 0, None, None, method)
    results = {"m": MethodReproductions("m", {}, "h", [ReproductionOutcome(0, 1000, [], reranked),
                                                       ReproductionOutcome(1, 1001, [], second)])}
    (comparison,) = compare_reranking(results, "concatenated", "map_at_r")
    differences = [scores["concatenated_reranked"]["map_at_r"] - scores["concatenated"]["map_at_r"] for scores in (reranked, second)]
    from scipy import stats

    assert (comparison.a, comparison.b, comparison.n) == ("m re-ranked", "m", 2)
    assert comparison.mean_difference == pytest.approx(np.mean(differences), abs=1e-15)
    assert comparison.t_pvalue == pytest.approx(stats.ttest_1samp(differences, 0.0).pvalue)
    results_csv, runs_csv = write_results(results, tmp_path)
    assert "m,concatenated_reranked,map_at_r," in results_csv.read_text()
    assert "m,1,separated_reranked,map_at_r," in runs_csv.read_text()


def test_the_rerank_kind_is_shared_and_not_searched(tmp_path: Path) -> None:
    from protocol_fixtures import benchmark_spec

    from dmlbench.protocol.design.prepare import prepare

    base = {"data": {"name": "glyphs", "options": {"max_classes": 20, "augmentations_per_font": 0, "image_size": 16}},
            "evaluation": {"metrics": ["precision_at_1", "map_at_r"], "rerank": {"kind": "query_expansion"}}}
    other = {"name": "b", "overrides": {"evaluation.rerank.kind": "k_reciprocal"}}
    with pytest.raises(UserInputError, match="another evaluation.rerank.kind"):
        prepare(benchmark_spec(base, {"name": "a"}, other, folds=2, trials=1, reproductions=2), tmp_path / "one")
    searched = {"name": "a", "search": {"evaluation.rerank.kind": {"choices": ["none", "query_expansion"]}}}
    with pytest.raises(UserInputError, match="evaluation.rerank.kind is fixed"):
        prepare(benchmark_spec(base, searched, folds=2, trials=1, reproductions=2), tmp_path / "two")
    assert not (tmp_path / "one").exists() and not (tmp_path / "two").exists()


SMOKE = {
    "base": {
        "data": {"name": "glyphs", "options": {"max_classes": 40, "augmentations_per_font": 0, "image_size": 16}},
        "model": {"trunk": "small_cnn", "embedding_dim": 16, "options": {"width": 8}},
        "sampler": {"name": "spc", "params": {"samples_per_class": 4}},
        "training": {"epochs": 1, "batch_size": 32, "max_steps_per_epoch": 2, "num_threads": 1},
        "evaluation": {"metrics": ["precision_at_1", "r_precision", "map_at_r"],
                       "rerank": {"kind": "query_expansion", "params": {"neighbours": 2}}},
    },
    "protocol": {"folds": 2, "trials": 2, "reproductions": 2, "sampler": "tpe", "first_seed": 100},
    "methods": [{"name": "triplet", "overrides": {"loss.name": "triplet", "miner.name": "semihard"},
                 "search": {"evaluation.rerank.params.alpha": {"low": 0.5, "high": 4.0}}}],
}


def test_a_benchmark_with_query_expansion_reports_raw_and_reranked_paired(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "bench.yaml"
    spec.write_text(yaml.safe_dump(SMOKE))
    code, _, err = run_cli(["benchmark", str(spec), "-o", str(tmp_path / "out"), "-q"], capsys)
    assert code == 0, err
    out = tmp_path / "out"
    rows = [line.split(",") for line in (out / "results.csv").read_text().splitlines()[1:]]
    assert {row[1] for row in rows} == {"concatenated", "separated", "concatenated_reranked", "separated_reranked"}
    # Each reproduction re-ranked with the alpha its search chose on the validation folds.
    alpha = json.loads((out / "search.json").read_text())["methods"]["triplet"]["best_params"]["evaluation.rerank.params.alpha"]
    assert 0.5 <= alpha <= 4.0
    for fold in sorted((out / "triplet" / "reproduction_00").glob("fold_*")):
        assert config_module.load(fold / "config.yaml").evaluation.rerank.method() == QueryExpansion(neighbours=2, alpha=alpha)
    # Re-ranked against raw, paired by reproduction, in the report and in claim_comparisons.csv.
    runs = {(row[0], row[1], row[2], row[3]): float(row[4]) for row in
            (line.split(",") for line in (out / "runs.csv").read_text().splitlines()[1:])}
    differences = [runs[("triplet", r, "concatenated_reranked", "map_at_r")] - runs[("triplet", r, "concatenated", "map_at_r")]
                   for r in ("0", "1")]
    claims = [line.split(",") for line in (out / "claim_comparisons.csv").read_text().splitlines()
              if line.startswith("rerank,concatenated,map_at_r,")]
    assert len(claims) == 1 and claims[0][3:5] == ["triplet re-ranked", "triplet"]
    assert float(claims[0][6]) == pytest.approx(np.mean(differences), abs=1e-12)
    report = (out / "report.md").read_text()
    assert "## Re-ranking" in report and "MAP@R (con. re-ranked)" in report


# --- dmlbench evaluate and dmlbench query ------------------------------------------------------------


def test_evaluate_command_prints_raw_and_reranked_side_by_side(tmp_path: Path, capsys) -> None:
    rows, labels = small_case(9)
    np.save(tmp_path / "e.npy", rows)
    np.save(tmp_path / "l.npy", labels)
    code, out, err = run_cli(["evaluate", "--embeddings", str(tmp_path / "e.npy"), "--labels", str(tmp_path / "l.npy"),
                              "--metrics", "precision_at_1,map_at_r", "--rerank", "k_reciprocal", "--rerank-param", "k1=8",
                              "--rerank-param", "k2=2", "--json", str(tmp_path / "r.json")], capsys)
    assert code == 0, err
    assert "re-ranked" in out.splitlines()[0]
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["reranked"]["map_at_r"] == evaluate(rows, labels, metrics=["precision_at_1", "map_at_r"],
                                                       rerank=KReciprocal(k1=8, k2=2))["map_at_r"]
    assert written["map_at_r"] == evaluate(rows, labels, metrics=["precision_at_1", "map_at_r"])["map_at_r"]


@pytest.mark.parametrize("argv, message", [
    (["--rerank-param", "k1=3"], "--rerank-param goes with --rerank KIND"),
    (["--rerank", "k_reciprocal", "--rerank-param", "k1"], "not of the form"),
    (["--rerank", "k_reciprocal", "--rerank-param", "k1.x=3"], "must be NAME=VALUE"),
    (["--rerank", "query_expansion", "--rerank-param", "k1=3"], "has no parameter k1"),
    (["--rerank", "query_expansion", "--binarize"], "L2-normalised float embeddings"),
])
def test_evaluate_command_bad_rerank_is_one_line_exit_2(tmp_path: Path, capsys, argv: list[str], message: str) -> None:
    rows, labels = small_case(10)
    np.save(tmp_path / "e.npy", rows)
    np.save(tmp_path / "l.npy", labels)
    code, _, err = run_cli(["evaluate", "--embeddings", str(tmp_path / "e.npy"), "--labels", str(tmp_path / "l.npy"),
                            "--json", str(tmp_path / "r.json"), *argv], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.json").exists()


def _index(tmp_path: Path, capsys) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(11)
    stored = generator.normal(size=(40, 6)).astype(np.float32)
    queries = generator.normal(size=(5, 6)).astype(np.float32)
    np.save(tmp_path / "s.npy", stored)
    np.save(tmp_path / "q.npy", queries)
    assert run_cli(["index", str(tmp_path / "s.npy"), "-o", str(tmp_path / "idx")], capsys)[0] == 0
    return stored, queries


def test_query_with_query_expansion_equals_the_brute_force_expansion(tmp_path: Path, capsys) -> None:
    stored, queries = _index(tmp_path, capsys)
    code, _, err = run_cli(["query", str(tmp_path / "idx"), "--embeddings", str(tmp_path / "q.npy"), "-k", "7",
                            "--rerank", "query_expansion", "--rerank-param", "alpha=2", "--rerank-param", "neighbours=3",
                            "--json", str(tmp_path / "a.json")], capsys)
    assert code == 0, err
    answers = json.loads((tmp_path / "a.json").read_text())
    rows = np.concatenate([stored, queries]).astype(np.float64)
    ids, squared = brute_query_expansion(rows, list(range(40, 45)), list(range(40)), 7, False,
                                         QueryExpansion(neighbours=3, alpha=2.0, database_side=True))
    assert [[hit["index"] for hit in answer["neighbors"]] for answer in answers] == ids.tolist()
    np.testing.assert_allclose([[hit["distance"] for hit in answer["neighbors"]] for answer in answers],
                               np.sqrt(squared), atol=1e-9)
    # A query's answer does not depend on the other queries asked with it.
    np.save(tmp_path / "q3.npy", queries[3:4])
    assert run_cli(["query", str(tmp_path / "idx"), "--embeddings", str(tmp_path / "q3.npy"), "-k", "7", "--rerank",
                    "query_expansion", "--rerank-param", "alpha=2", "--rerank-param", "neighbours=3",
                    "--json", str(tmp_path / "b.json")], capsys)[0] == 0
    assert json.loads((tmp_path / "b.json").read_text())[0]["neighbors"] == answers[3]["neighbors"]
    raw = run_cli(["query", str(tmp_path / "idx"), "--embeddings", str(tmp_path / "q.npy"), "-k", "7", "--rerank", "none",
                   "--json", str(tmp_path / "c.json")], capsys)
    assert raw[0] == 0 and json.loads((tmp_path / "c.json").read_text()) != answers


def test_query_refuses_k_reciprocal_and_a_threshold_with_reranking(tmp_path: Path, capsys) -> None:
    _index(tmp_path, capsys)
    code, _, err = run_cli(["query", str(tmp_path / "idx"), "--embeddings", str(tmp_path / "q.npy"),
                            "--rerank", "k_reciprocal", "--json", str(tmp_path / "a.json")], capsys)
    assert code == 2 and "query_expansion only" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "a.json").exists()
    from dmlbench.deploy.query import query_reranking

    with pytest.raises(UserInputError, match="raw distances"):
        query_reranking("query_expansion", {}, "calibration.json")
    assert query_reranking("none", {}, "calibration.json") is None


def test_a_run_with_rerank_validates_reranked_and_evaluate_shows_both(tmp_path: Path, capsys) -> None:
    from training_fixtures import TINY

    from dmlbench.training import train
    from dmlbench.training.runs import embed_run, embed_test_split

    rerank = ["evaluation.rerank.kind=k_reciprocal", "evaluation.rerank.params={k1: 8, k2: 3}"]
    config = config_module.load(Path("configs/glyphs.yaml"), [*TINY, "training.epochs=1", "training.max_steps_per_epoch=2",
                                                              *rerank])
    result = train(config, tmp_path / "run", progress=False)
    method = KReciprocal(k1=8, k2=3)
    # The validation metrics that select the checkpoint (and score a search trial) are the re-ranked ones.
    validation, validation_labels = embed_run(tmp_path / "run", "validation")
    assert result.best_validation["map_at_r"] == pytest.approx(
        evaluate(validation, validation_labels, metrics=config.evaluation.metrics, rerank=method)["map_at_r"], abs=1e-12)
    code, out, err = run_cli(["evaluate", str(tmp_path / "run"), "--json", str(tmp_path / "r.json")], capsys)
    assert code == 0, err
    assert out.splitlines()[0].split() == ["metric", "trained", "trained,", "re-ranked", "untrained", "untrained,", "re-ranked"]
    written = json.loads((tmp_path / "r.json").read_text())
    test, test_labels = embed_test_split(tmp_path / "run")
    assert written["reranked"]["map_at_r"] == pytest.approx(
        evaluate(test, test_labels, metrics=config.evaluation.metrics, rerank=method)["map_at_r"], abs=1e-12)
    assert written["map_at_r"] == pytest.approx(evaluate(test, test_labels, metrics=config.evaluation.metrics)["map_at_r"], abs=1e-12)
    code, out, err = run_cli(["evaluate", str(tmp_path / "run"), "--rerank", "none", "--json", str(tmp_path / "n.json")], capsys)
    assert code == 0 and "reranked" not in json.loads((tmp_path / "n.json").read_text())
