import itertools

import torch

from dmlbench.mining.tuples import Pairs, Triplets, all_pairs, all_triplets, to_pairs, to_triplets


def brute_force_triplets(labels: list[int]) -> set[tuple[int, int, int]]:
    indices = range(len(labels))
    return {
        (a, p, n)
        for a, p, n in itertools.product(indices, indices, indices)
        if a != p and labels[a] == labels[p] and labels[a] != labels[n]
    }


def test_all_triplets_enumerates_every_valid_triplet() -> None:
    labels = [0, 0, 1, 1, 1, 2]
    triplets = all_triplets(torch.tensor(labels))
    found = set(zip(triplets.anchors.tolist(), triplets.positives.tolist(), triplets.negatives.tolist()))
    assert found == brute_force_triplets(labels)
    assert len(triplets) == len(found)


def test_all_pairs_split_by_label() -> None:
    labels = torch.tensor([0, 0, 1])
    pairs = all_pairs(labels)
    assert set(zip(pairs.positive_anchors.tolist(), pairs.positives.tolist())) == {(0, 1), (1, 0)}
    assert set(zip(pairs.negative_anchors.tolist(), pairs.negatives.tolist())) == {(0, 2), (1, 2), (2, 0), (2, 1)}


def test_no_positive_pairs_gives_empty_triplets() -> None:
    assert len(all_triplets(torch.arange(4))) == 0


def test_pairs_to_triplets_round_trip() -> None:
    labels = torch.tensor([0, 0, 1, 1, 2])
    triplets = all_triplets(labels)
    rebuilt = to_triplets(to_pairs(triplets))
    original = set(zip(triplets.anchors.tolist(), triplets.positives.tolist(), triplets.negatives.tolist()))
    assert set(zip(rebuilt.anchors.tolist(), rebuilt.positives.tolist(), rebuilt.negatives.tolist())) >= original
    converted = to_triplets(all_pairs(labels))
    assert set(zip(converted.anchors.tolist(), converted.positives.tolist(), converted.negatives.tolist())) == original
    assert isinstance(to_pairs(triplets), Pairs) and isinstance(converted, Triplets)
