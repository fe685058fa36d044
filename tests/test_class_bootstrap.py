"""The paired bootstrap over test classes (``analysis.class_bootstrap``) against explicit resampled copies."""

import math

import numpy as np
import pytest
import torch

from dmlbench.analysis.class_bootstrap import class_bootstrap, class_sums, draw_classes, draw_seeds, queries_of
from dmlbench.evaluation import evaluate_many

METRICS = ["precision_at_1", "r_precision", "map_at_r"]


def brute_query_values(embeddings: np.ndarray, labels: np.ndarray, query: int, gallery: list[int],
                       self_retrieval: bool) -> dict[str, float]:
    """P@1, R-Precision and AP@R of one query by a float64 loop: L2-normalised rows, every reference
    ranked by (squared distance, index), the query itself left out when queries are the references."""
    rows = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    references = [r for r in gallery if not (self_retrieval and r == query)]
    order = sorted(references, key=lambda r: (float(np.sum((rows[query] - rows[r]) ** 2)), r))
    hits = [labels[r] == labels[query] for r in order]
    relevant = sum(hits)
    if relevant == 0:
        return {name: math.nan for name in METRICS}
    found, precision_sum = 0, 0.0
    for position, hit in enumerate(hits[:relevant], start=1):
        if hit:
            found += 1
            precision_sum += found / position
    return {"precision_at_1": float(hits[0]), "r_precision": found / relevant, "map_at_r": precision_sum / relevant}


def brute_replicate(embeddings: np.ndarray, labels: np.ndarray, drawn_classes: list[int], query_mask: np.ndarray | None,
                    metric: str, domains: np.ndarray | None = None) -> float:
    """One replicate as explicit copies: the queries of every drawn class, once per draw, against the
    fixed gallery (with ``domains``, its images of the other domains); the mean over the copies that
    have a correct reference."""
    queries = np.arange(len(labels)) if query_mask is None else np.flatnonzero(query_mask)
    gallery = list(range(len(labels))) if query_mask is None else list(np.flatnonzero(~query_mask))
    values = []
    for label in drawn_classes:
        for query in queries[labels[queries] == label]:
            seen = gallery if domains is None else [r for r in gallery if domains[r] != domains[query]]
            value = brute_query_values(embeddings, labels, int(query), seen, query_mask is None and domains is None)[metric]
            if not math.isnan(value):
                values.append(value)
    return float(np.mean(values))


def brute_mode(folds: list[np.ndarray], labels: np.ndarray, drawn: list[int], mask: np.ndarray | None, mode: str,
               metric: str) -> float:
    """``evaluate_many``'s modes, each fold model's replicate computed on its own for ``separated``; a
    ``*_cross_domain`` mode with ``DOMAINS``."""
    domains = DOMAINS if mode.endswith("_cross_domain") else None
    if mode.startswith("concatenated"):
        joined = np.concatenate([f / np.linalg.norm(f, axis=1, keepdims=True) for f in folds], axis=1)
        return brute_replicate(joined, labels, drawn, mask, metric, domains)
    return float(np.mean([brute_replicate(f, labels, drawn, mask, metric, domains) for f in folds]))


# The domain of each image of ``small_case``: class 2 (rows 8-10) lies in one domain, so its queries
# have a match all-versus-all but none cross-domain.
DOMAINS = np.array(list("abab" "aabb" "aaa" "babab" "a"))


def small_case(seed: int, with_mask: bool) -> tuple[list[np.ndarray], np.ndarray, np.ndarray | None]:
    rng = np.random.default_rng(seed)
    labels = np.array([0] * 4 + [1] * 4 + [2] * 3 + [3] * 5 + [4] * 1)  # class 4: a query without a match
    folds = [rng.normal(size=(len(labels), 3)) + 0.8 * labels[:, None] * rng.normal(size=3) for _ in range(2)]
    mask = (np.arange(len(labels)) % 2 == 0) if with_mask else None
    return folds, labels, mask


@pytest.mark.parametrize("with_mask", [False, True])
def test_class_sums_add_up_to_evaluate_many(with_mask: bool) -> None:
    folds, labels, mask = small_case(0, with_mask)
    record = class_sums({f"fold_{i}": torch.from_numpy(f) for i, f in enumerate(folds)}, torch.from_numpy(labels), METRICS,
                        None if mask is None else torch.from_numpy(mask))
    assert record is not None
    for mode in ("concatenated", "separated"):
        expected = evaluate_many({f"fold_{i}": f for i, f in enumerate(folds)}, labels, mode=mode, metrics=METRICS,
                                 query_mask=mask)
        for metric in METRICS:
            assert sum(record["sums"][mode][metric]) / sum(record["queries"]) == pytest.approx(expected[metric], abs=1e-12)
    assert class_sums({"fold_0": torch.from_numpy(folds[0])}, torch.from_numpy(labels), ["nmi"]) is None


@pytest.mark.parametrize("with_mask", [False, True])
def test_cross_domain_class_sums_add_up_to_evaluate_many(with_mask: bool) -> None:
    """With domains the record gains the cross-domain modes, whose queries with a match are fewer (class
    2 has none in another domain); each mode's sums over its queries give ``evaluate_many``'s score."""
    folds, labels, mask = small_case(3, with_mask)
    embeddings = {f"fold_{i}": torch.from_numpy(f) for i, f in enumerate(folds)}
    record = class_sums(embeddings, torch.from_numpy(labels), METRICS, None if mask is None else torch.from_numpy(mask),
                        DOMAINS)
    assert record is not None and set(record["sums"]) == {"concatenated", "separated", "concatenated_cross_domain",
                                                          "separated_cross_domain"}
    assert record["queries"] == class_sums(embeddings, torch.from_numpy(labels), METRICS,
                                           None if mask is None else torch.from_numpy(mask))["queries"]
    crossed = queries_of(record, "concatenated_cross_domain")
    assert crossed == queries_of(record, "separated_cross_domain") and crossed[2] == 0 < record["queries"][2]
    for mode in ("concatenated", "separated"):
        expected = evaluate_many({f"fold_{i}": f for i, f in enumerate(folds)}, labels, mode=mode, metrics=METRICS,
                                 query_mask=mask, domains=DOMAINS)
        for metric in METRICS:
            total = sum(record["sums"][f"{mode}_cross_domain"][metric]) / sum(crossed)
            assert total == pytest.approx(expected[metric], abs=1e-12)


@pytest.mark.parametrize("crossed", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_replicates_equal_explicit_resampled_copies(with_mask: bool, crossed: bool) -> None:
    # Two methods x three reproduction seeds; every replicate recomputed from copies of the drawn classes.
    replicates, methods, seeds = 12, ("a", "b"), (7, 8, 9)
    cases = {(method, seed): small_case(10 * index + seed, with_mask) for index, method in enumerate(methods) for seed in seeds}
    per_class = {method: {seed: class_sums({f"fold_{i}": torch.from_numpy(f) for i, f in enumerate(cases[method, seed][0])},
                                           torch.from_numpy(cases[method, seed][1]), METRICS,
                                           None if cases[method, seed][2] is None else torch.from_numpy(cases[method, seed][2]),
                                           DOMAINS if crossed else None)
                         for seed in seeds} for method in methods}
    classes = per_class["a"][7]["classes"]
    draws, seed_draws = draw_classes(len(classes), replicates, 0), draw_seeds(len(seeds), replicates, 0)
    suffix = "_cross_domain" if crossed else ""
    for mode, metric in ((f"concatenated{suffix}", "map_at_r"), (f"separated{suffix}", "precision_at_1"),
                         (f"concatenated{suffix}", "r_precision")):
        result = class_bootstrap(per_class, mode, metric, [("a", "b")], replicates=replicates, seed=0)
        brute = {(method, seed): np.array([brute_mode(*cases[method, seed][:2], [classes[p] for p in draws[b]],
                                                      cases[method, seed][2], mode, metric) for b in range(replicates)])
                 for method in methods for seed in seeds}
        full = {key: brute_mode(*case[:2], classes, case[2], mode, metric) for key, case in cases.items()}
        by_class = {m: np.mean([brute[m, s] for s in seeds], axis=0) for m in methods}
        by_both = {m: np.array([np.mean([brute[m, seeds[j]][b] for j in seed_draws[b]]) for b in range(replicates)])
                   for m in methods}
        checks = [(result.methods["a"], by_class["a"], by_both["a"], np.mean([full["a", s] for s in seeds])),
                  (result.differences[("a", "b")], by_class["a"] - by_class["b"], by_both["a"] - by_both["b"],
                   np.mean([full["a", s] - full["b", s] for s in seeds]))]
        for interval, classes_only, both, estimate in checks:
            assert interval.estimate == pytest.approx(estimate, abs=1e-12)
            assert [interval.class_low, interval.class_high] == pytest.approx(np.percentile(classes_only, [2.5, 97.5]), abs=1e-12)
            assert [interval.both_low, interval.both_high] == pytest.approx(np.percentile(both, [2.5, 97.5]), abs=1e-12)
        assert result.seeds == list(seeds) and result.classes == len(classes)


def test_pairing_cancels_a_shared_class_effect() -> None:
    # Method b is method a plus a constant on every query: the class draws are shared, so the
    # difference's interval is that constant alone while each method's own interval is wide.
    queries = [3, 3, 3, 3, 3, 3]
    a = {seed: {"classes": list(range(6)), "queries": queries,
                "sums": {"concatenated": {"map_at_r": [3 * v for v in (0.1, 0.9, 0.3, 0.7, 0.5, 0.2)]}}} for seed in (1, 2)}
    b = {seed: {**record, "sums": {"concatenated": {"map_at_r": [s + 3 * 0.05 for s in record["sums"]["concatenated"]["map_at_r"]]}}}
         for seed, record in a.items()}
    result = class_bootstrap({"a": a, "b": b}, "concatenated", "map_at_r", [("b", "a")], replicates=500)
    difference, alone = result.differences[("b", "a")], result.methods["a"]
    assert difference.class_low == pytest.approx(0.05) and difference.class_high == pytest.approx(0.05)
    assert alone.class_high - alone.class_low > 0.2


def test_other_test_classes_are_refused() -> None:
    from dmlbench.errors import UserInputError

    record = {"classes": [0, 1], "queries": [1, 1], "sums": {"concatenated": {"map_at_r": [0.5, 0.5]}}}
    other = {**record, "classes": [0, 2]}
    with pytest.raises(UserInputError, match="other test classes"):
        class_bootstrap({"a": {1: record}, "b": {1: other}}, "concatenated", "map_at_r", [], replicates=10)


def test_reproductions_lacking_per_class_sums_are_found() -> None:
    """``reproductions._lacking_class_sums``: a finished reproduction lacks sums when it has none though
    a metric is a mean over queries, or none cross-domain though it scored the cross-domain modes;
    sums completed later among the study's attributes count; failed runs and NMI-only scores are left."""
    import optuna
    from optuna.trial import TrialState, create_trial

    from dmlbench.protocol.units.reproductions import _lacking_class_sums
    from dmlbench.protocol.units.results import COMPLETED_CLASS_SUMS

    plain = {"concatenated": {"map_at_r": 0.5}, "separated": {"map_at_r": 0.4}}
    crossed = {**plain, "concatenated_cross_domain": {"map_at_r": 0.3}, "separated_cross_domain": {"map_at_r": 0.2}}
    sums = {"classes": [0], "queries": [2], "sums": {"concatenated": {"map_at_r": [1.0]}}}
    attrs = [
        {"scores": plain, "class_scores": sums},  # 0: complete
        {"scores": plain},  # 1: stored none
        {"scores": crossed, "class_scores": sums},  # 2: none cross-domain
        {"scores": crossed, "class_scores": {**sums, "queries_by_mode": {"concatenated_cross_domain": [1]}}},  # 3
        {"scores": {"concatenated": {"nmi": 0.5}, "separated": {"nmi": 0.4}}},  # 4: no per-query metric
        {"scores": crossed},  # 5: stored none, completed later below
        {"fail_reason": "NaN loss"},  # 6: failed
    ]
    study = optuna.create_study()
    for slot, user_attrs in enumerate(attrs):
        failed = "fail_reason" in user_attrs
        study.add_trial(create_trial(state=TrialState.FAIL if failed else TrialState.COMPLETE,
                                     value=None if failed else 0.5, user_attrs={"slot": slot, **user_attrs}))
    assert [trial.user_attrs["slot"] for trial in _lacking_class_sums(study)] == [1, 2, 5]
    study.set_user_attr(f"{COMPLETED_CLASS_SUMS}5", {**sums, "queries_by_mode": {"concatenated_cross_domain": [1]}})
    study.set_user_attr(f"{COMPLETED_CLASS_SUMS}2", sums)  # completed, but still without the cross-domain modes
    assert [trial.user_attrs["slot"] for trial in _lacking_class_sums(study)] == [1, 2]


def test_class_sums_csv_reads_back_to_the_same_bootstrap(tmp_path) -> None:
    """The committed ``class_sums.csv`` holds every sum exactly: the bootstrap from the file read back equals
    the bootstrap from the records, in both plain and cross-domain modes; a damaged copy is one line."""
    from dmlbench.analysis.class_bootstrap import class_sums_csv, read_class_sums
    from dmlbench.errors import UserInputError

    generator = np.random.default_rng(5)
    labels, domains = torch.arange(40) % 8, (torch.arange(40) // 8) % 3

    def record() -> dict:
        embeddings = {f"fold {k}": torch.from_numpy(generator.normal(size=(40, 4))) for k in range(2)}
        return class_sums(embeddings, labels, METRICS, None, domains)

    records = {method: {seed: record() for seed in (7, 8, 9)} for method in ("contrastive", "margin")}
    path = tmp_path / "class_sums.csv"
    path.write_text(class_sums_csv(records))
    read = read_class_sums(path)
    assert list(read) == ["contrastive", "margin"] and list(read["margin"]) == [7, 8, 9]
    for mode in ("concatenated", "separated", "concatenated_cross_domain"):
        for method in records:
            for seed in (7, 8, 9):
                assert read[method][seed]["classes"] == records[method][seed]["classes"]
                assert queries_of(read[method][seed], mode) == queries_of(records[method][seed], mode)
        assert class_bootstrap(read, mode, "map_at_r", [("margin", "contrastive")], replicates=50) == \
            class_bootstrap(records, mode, "map_at_r", [("margin", "contrastive")], replicates=50)
    text = path.read_text()
    for damaged in (text.replace("queries", "count", 1), text.replace(",concatenated,0,", ",concatenated,0,x", 1), ""):
        path.write_text(damaged)
        with pytest.raises(UserInputError, match="is not a class-sums file") as error:
            read_class_sums(path)
        assert "\n" not in str(error.value)
