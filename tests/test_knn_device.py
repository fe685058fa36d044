"""The device kNN (``evaluation.knn_device``, what a GPU runs) against the CPU's blocked search, on the
CPU device: the same neighbour ids and exact distances, ties included, and the same metrics to 1e-6.
On a GPU the same comparison runs in ``results/gpu_h200/gpu_targets.sh`` (``benchmarks/gpu.py --check``)."""

from functools import partial

import numpy as np
import pytest
import torch

from dmlbench.evaluation import evaluate, knn_blocked, knn_device
from dmlbench.evaluation.knn_index import prepare
from dmlbench.evaluation.neighbors import nearest_neighbors

METRICS = ["precision_at_1", "recall_at_4", "r_precision", "map_at_r", "map_at_c", "mrr"]


def tied_embeddings(rows: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian rows with ties built in: a third of the rows repeat an earlier row exactly, and a
    few rows are coarse (values in {-1, 0, 1}) so that many distances are equal."""
    generator = torch.Generator().manual_seed(seed)
    embeddings = torch.randn(rows, dim, generator=generator, dtype=torch.float64)
    copies = torch.randperm(rows, generator=generator)[: rows // 3]
    embeddings[copies] = embeddings[torch.randint(0, rows, (len(copies),), generator=generator)]
    coarse = torch.randperm(rows, generator=generator)[: rows // 10]
    embeddings[coarse] = torch.randint(-1, 2, (len(coarse), dim), generator=generator).to(torch.float64)
    labels = torch.randint(0, max(2, rows // 6), (rows,), generator=generator)
    return embeddings, labels


@pytest.mark.parametrize("block", [32, 256, 1024])
def test_block_top_keeps_the_largest_entries_of_every_row(block: int) -> None:
    generator = torch.Generator().manual_seed(block)
    # Few distinct values: the boundary of the kept set falls inside runs of ties.
    scores = torch.randint(0, 7, (65, block), generator=generator).to(torch.float32)
    scores[3] = -torch.inf
    for width in (1, 5, 12):
        values, positions = knn_device.block_top(scores, width)
        expected = scores.topk(width, dim=1).values
        assert torch.equal(values, expected)
        assert torch.equal(scores.gather(1, positions), values)
        assert all(len(set(row.tolist())) == width for row in positions)  # no entry twice
        columns, rows = knn_device._column_top(scores.T.contiguous(), width)
        assert torch.equal(columns, expected) and torch.equal(scores.gather(1, rows), columns)


@pytest.mark.parametrize(("normalize", "binarize", "masked"), [
    (True, False, False),   # symmetric blocks, rows and columns
    (True, False, True),    # queries against a gallery
    (False, False, False),  # unnormalised: rectangular products with the query's own row masked
    (True, True, False),    # Hamming distances: ties everywhere
])
def test_device_search_gives_the_cpu_neighbours_ties_included(normalize: bool, binarize: bool, masked: bool) -> None:
    embeddings, _ = tied_embeddings(2300, 12, seed=int(normalize) + 2 * int(binarize) + 4 * int(masked))
    space = prepare(embeddings, normalize=normalize, binarize=binarize)
    everyone = torch.arange(len(embeddings))
    queries, references = (everyone[::3], everyone[everyone % 3 != 0]) if masked else (everyone, everyone)
    for k in (1, 4, 30):
        expected = nearest_neighbors(space, queries, references, k, exclude_self=not masked, block_size=512)
        for block in (64, 1024):
            searcher = partial(knn_device.candidate_search, space, reference_ids=references, exclude_self=not masked,
                               block_size=block)
            found = nearest_neighbors(space, queries, references, k, exclude_self=not masked,
                                      searcher=lambda ids, width, search=searcher: search(ids, width=width))
            assert torch.equal(found.ids, expected.ids), (k, block)
            assert torch.equal(found.distances, expected.distances), (k, block)


def test_ties_are_broken_by_index_on_the_device_path() -> None:
    """Eight identical rows: every query's neighbours are the other copies in ascending index order."""
    embeddings = torch.cat([torch.ones(8, 4, dtype=torch.float64), torch.randn(200, 4, dtype=torch.float64,
                                                                                   generator=torch.Generator().manual_seed(1))])
    space = prepare(embeddings, normalize=True, binarize=False)
    everyone = torch.arange(len(embeddings))
    found = nearest_neighbors(space, everyone, everyone, 7, exclude_self=True,
                              searcher=lambda ids, width: knn_device.candidate_search(
                                  space, ids, everyone, width, exclude_self=True, block_size=64))
    for query in range(8):
        assert found.ids[query].tolist() == [other for other in range(8) if other != query]


@pytest.mark.parametrize("options", [{}, {"query_mask": "every fourth"}, {"normalize": False}, {"domains": "three"}])
def test_evaluate_on_the_device_path_equals_the_cpu_path(options: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    embeddings, labels = tied_embeddings(1500, 16, seed=7)
    options = dict(options)
    if "query_mask" in options:
        options["query_mask"] = np.arange(1500) % 4 == 0
    if "domains" in options:
        options["domains"] = np.arange(1500) % 3
    expected = evaluate(embeddings, labels, metrics=METRICS, **options)
    # The CPU's blocked search replaced by the device search: what an index on a GPU runs.
    monkeypatch.setattr(knn_blocked, "candidate_search", partial(knn_device.candidate_search, block_size=256))
    found = evaluate(embeddings, labels, metrics=METRICS, device="cpu", **options)
    assert found.keys() == expected.keys()
    for name in METRICS:
        assert found[name] == pytest.approx(expected[name], abs=1e-6), name
    assert found == expected  # the same neighbours, so the same sums: equal, not only close
    monkeypatch.undo()
    again = evaluate(embeddings, labels, metrics=METRICS, device="cpu", **options)
    assert again == expected


def test_block_size_follows_the_request_and_the_cpu_default() -> None:
    cpu = torch.device("cpu")
    assert knn_device.block_size_for(cpu) == 2048
    assert knn_device.block_size_for(cpu, 100) == 96 and knn_device.block_size_for(cpu, 5) == 32


def test_a_device_that_is_not_one_is_one_line() -> None:
    from dmlbench.errors import UserInputError

    embeddings, labels = tied_embeddings(40, 4, seed=0)
    with pytest.raises(UserInputError, match="device='gpu0' is not a device"):
        evaluate(embeddings, labels, metrics=["precision_at_1"], device="gpu0")
