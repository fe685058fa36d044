"""Cross-domain retrieval (``evaluate(..., domains=...)``): each query's gallery holds only the other
domains. Checked against a brute-force float64 loop that ranks by (distance, index)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dmlbench.errors import UserInputError
from dmlbench.evaluation import evaluate, evaluate_many
from dmlbench.evaluation.knn_index import prepare
from dmlbench.evaluation.neighbors import nearest_neighbors


def brute_force(rows: np.ndarray, labels: np.ndarray, domains: np.ndarray, queries: np.ndarray,
                references: np.ndarray, ks: tuple[int, ...]) -> dict[str, float]:
    per_query: dict[str, list[float]] = {"precision_at_1": [], "r_precision": [], "map_at_r": [],
                                          **{f"recall_at_{k}": [] for k in ks}}
    map_at_c = []
    for q in queries:
        gallery = [r for r in references if domains[r] != domains[q]]
        distance = {r: math.sqrt(sum((float(a) - float(b)) ** 2 for a, b in zip(rows[q], rows[r]))) for r in gallery}
        ranked = sorted(gallery, key=lambda r: (distance[r], r))
        hits = [labels[r] == labels[q] for r in ranked]
        relevant = sum(hits)
        map_at_c.append(sum(hits[:relevant]) / relevant if relevant else 0.0)
        if relevant == 0:
            continue
        per_query["precision_at_1"].append(float(hits[0]))
        per_query["r_precision"].append(sum(hits[:relevant]) / relevant)
        found, precision_sum = 0, 0.0
        for position, hit in enumerate(hits[:relevant], start=1):
            if hit:
                found += 1
                precision_sum += found / position
        per_query["map_at_r"].append(precision_sum / relevant)
        for k in ks:
            per_query[f"recall_at_{k}"].append(float(any(hits[:k])))
    results = {name: float(np.mean(values)) for name, values in per_query.items()}
    results["map_at_c"] = float(np.mean(map_at_c))
    return results


def small_case(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    # Integer coordinates on a coarse grid: many exactly tied distances, so ties by index matter.
    rows = rng.integers(-2, 3, size=(60, 3)).astype(np.float64)
    labels = rng.integers(0, 8, size=60)
    domains = np.array(["apple", "google", "twitter"])[rng.integers(0, 3, size=60)]
    return rows, labels, domains


METRICS = ["precision_at_1", "recall_at_1", "recall_at_2", "recall_at_4", "r_precision", "map_at_r", "map_at_c"]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("block_size", [None, 32])
def test_cross_domain_matches_brute_force(seed: int, block_size: int | None) -> None:
    rows, labels, domains = small_case(seed)
    got = evaluate(rows, labels, metrics=METRICS, normalize=False, domains=domains, block_size=block_size)
    everyone = np.arange(len(rows))
    expected = brute_force(rows, labels, domains, everyone, everyone, (1, 2, 4))
    for name in METRICS:
        assert got[name] == pytest.approx(expected[name], abs=1e-12), name
    # And the all-vs-all numbers differ: the restriction is real.
    assert evaluate(rows, labels, metrics=["map_at_r"], normalize=False)["map_at_r"] != pytest.approx(got["map_at_r"])


def test_cross_domain_with_a_query_mask_matches_brute_force() -> None:
    rows, labels, domains = small_case(3)
    mask = np.zeros(len(rows), dtype=bool)
    mask[::3] = True
    got = evaluate(rows, labels, metrics=METRICS, normalize=False, domains=domains, query_mask=mask)
    expected = brute_force(rows, labels, domains, np.flatnonzero(mask), np.flatnonzero(~mask), (1, 2, 4))
    for name in METRICS:
        assert got[name] == pytest.approx(expected[name], abs=1e-12), name


def test_galleries_of_unequal_size_match_brute_force() -> None:
    """A domain whose gallery is smaller than the largest class another domain's queries see: the
    neighbour lists need that class's size, which the small gallery cannot fill (its queries' lists end
    in misses, -1), and the scores still equal the brute-force loop's (this raised "k=... must lie in"
    before)."""
    rng = np.random.default_rng(8)
    labels = np.array([0] * 4 + [1] * 4 + [2] * 3 + [3] * 5 + [4])
    domains = np.array(list("abab" "aabb" "aaa" "babab" "a"))
    rows = rng.integers(-2, 3, size=(len(labels), 3)).astype(np.float64)
    mask = np.arange(len(labels)) % 2 == 0  # b's queries see 2 references of a, a's queries see 6 of b
    got = evaluate(rows, labels, metrics=METRICS, normalize=False, domains=domains, query_mask=mask)
    expected = brute_force(rows, labels, domains, np.flatnonzero(mask), np.flatnonzero(~mask), (1, 2, 4))
    for name in METRICS:
        assert got[name] == pytest.approx(expected[name], abs=1e-12), name
    codes = torch.from_numpy(np.unique(domains, return_inverse=True)[1].astype(np.int64))
    space = prepare(torch.from_numpy(rows), normalize=False, binarize=False)
    found = nearest_neighbors(space, torch.tensor([6]), torch.from_numpy(np.flatnonzero(~mask)), 3, exclude_self=False,
                              domains=codes)
    assert found.ids[0, 2] == -1 and found.distances[0, 2] == math.inf and bool((found.ids[0, :2] >= 0).all())


def test_neighbours_never_share_the_query_domain_and_are_ordered_by_index_on_ties() -> None:
    rows, labels, domains = small_case(4)
    codes = torch.from_numpy(np.unique(domains, return_inverse=True)[1].astype(np.int64))
    space = prepare(torch.from_numpy(rows), normalize=False, binarize=False)
    everyone = torch.arange(len(rows))
    found = nearest_neighbors(space, everyone, everyone, 10, exclude_self=False, domains=codes, block_size=32)
    assert not bool((codes[found.ids] == codes.unsqueeze(1)).any())
    keys = list(zip(found.distances.flatten().tolist(), found.ids.flatten().tolist()))
    for row in range(len(rows)):
        assert keys[row * 10:(row + 1) * 10] == sorted(keys[row * 10:(row + 1) * 10])


def test_evaluate_many_separated_averages_cross_domain_scores() -> None:
    rows, labels, domains = small_case(5)
    other = rows[::-1].copy()
    together = evaluate_many({"a": rows, "b": other}, labels, mode="separated", metrics=["map_at_r"], domains=domains)
    alone = [evaluate(matrix, labels, metrics=["map_at_r"], domains=domains)["map_at_r"] for matrix in (rows, other)]
    assert together["map_at_r"] == pytest.approx(np.mean(alone), abs=1e-15)


def test_bad_domains_are_one_line_errors() -> None:
    rows, labels, _ = small_case(6)
    with pytest.raises(UserInputError, match="one value per row"):
        evaluate(rows, labels, domains=np.zeros(3, dtype=int))
    with pytest.raises(UserInputError, match="at least 2 domains"):
        evaluate(rows, labels, metrics=["map_at_r"], domains=np.zeros(len(rows), dtype=int))


def test_protocol_scores_cross_domain_modes_beside_the_others(tmp_path) -> None:
    from dmlbench.protocol.units.results import MethodReproductions, ReproductionOutcome, scored_modes, write_results
    from dmlbench.protocol.units.scoring import score_modes

    rows, labels, domains = small_case(7)
    embeddings = {"fold_0": rows, "fold_1": rows[::-1].copy()}
    plain = score_modes(embeddings, labels, ["map_at_r"], 0, None)
    crossed = score_modes(embeddings, labels, ["map_at_r"], 0, None, domains)
    assert list(plain) == ["concatenated", "separated"]
    assert list(crossed) == ["concatenated", "separated", "concatenated_cross_domain", "separated_cross_domain"]
    assert crossed["separated_cross_domain"]["map_at_r"] == pytest.approx(
        evaluate_many(embeddings, labels, mode="separated", metrics=["map_at_r"], domains=domains)["map_at_r"])
    results = {"m": MethodReproductions("m", {}, "h", [ReproductionOutcome(0, 1000, [], crossed)])}
    assert scored_modes(results) == list(crossed)
    results_csv, _ = write_results(results, tmp_path)
    assert "concatenated_cross_domain,map_at_r" in results_csv.read_text()
