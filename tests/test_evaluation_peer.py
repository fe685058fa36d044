"""Cross-checks against pytorch-metric-learning's AccuracyCalculator on tie-free random data.

Mapping (pml -> dmlbench): precision_at_1 -> precision_at_1, r_precision -> r_precision,
mean_average_precision_at_r -> map_at_r, mean_reciprocal_rank -> mrr, NMI/AMI -> nmi/ami.
Differences handled here: pml searches raw embeddings with faiss IndexFlatL2, so we pass it
L2-normalised embeddings (dmlbench normalises by default); pml drops queries without a match the
same way (its "lone" queries); pml's reciprocal rank looks at its k neighbours, so it is given our
depth (the largest class size among the references, the query counted in self-retrieval) as an
integer k, which also covers the R neighbours of MAP@R; pml computes reciprocal ranks in float32
(tolerance 1e-7, the rest 1e-12); for NMI/AMI pml is handed our k-means assignment, because its own
k-means is seeded differently.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from dmlbench.evaluation import clustering, evaluate
from dmlbench.evaluation.knn_index import prepare

MAPPING = {"precision_at_1": "precision_at_1", "r_precision": "r_precision",
           "mean_average_precision_at_r": "map_at_r", "mean_reciprocal_rank": "mrr"}


def _data(seed: int, n: int = 600, classes: int = 60, dim: int = 16):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=generator)
    centres = torch.randn(classes, dim, generator=generator)
    embeddings = centres[labels] + 1.5 * torch.randn(n, dim, generator=generator)
    return torch.nn.functional.normalize(embeddings, dim=1), labels


@pytest.mark.parametrize("seed", [0, 1])
def test_self_retrieval_matches_accuracy_calculator(seed):
    embeddings, labels = _data(seed)
    labels[0] = 1000  # a lone query, excluded by both
    ours = evaluate(embeddings, labels, metrics=list(MAPPING.values()))
    depth = int(torch.unique(labels, return_counts=True)[1].max())
    calculator = AccuracyCalculator(include=tuple(MAPPING), k=depth, device=torch.device("cpu"))
    peer = calculator.get_accuracy(embeddings, labels)
    for peer_name, name in MAPPING.items():
        assert ours[name] == pytest.approx(peer[peer_name], abs=_tolerance(name)), name


def _tolerance(name: str) -> float:
    # pml accumulates reciprocal ranks in float32.
    return 1e-7 if name == "mrr" else 1e-12


def test_query_gallery_split_matches_accuracy_calculator():
    embeddings, labels = _data(7)
    mask = torch.zeros(len(labels), dtype=torch.bool)
    mask[::4] = True
    ours = evaluate(embeddings, labels, metrics=list(MAPPING.values()), query_mask=mask)
    gallery_counts = torch.unique(labels[~mask], return_counts=True)[1]
    calculator = AccuracyCalculator(include=tuple(MAPPING), k=int(gallery_counts.max()), device=torch.device("cpu"))
    peer = calculator.get_accuracy(embeddings[mask], labels[mask], embeddings[~mask], labels[~mask], False)
    for peer_name, name in MAPPING.items():
        assert ours[name] == pytest.approx(peer[peer_name], abs=_tolerance(name)), name


def test_nmi_and_ami_match_accuracy_calculator_on_the_same_clustering():
    embeddings, labels = _data(3)
    ours = evaluate(embeddings, labels, metrics=["nmi", "ami"], seed=5)
    assignment = clustering.kmeans_assignment(
        prepare(embeddings.double(), normalize=True, binarize=False).search_rows, len(torch.unique(labels)), seed=5
    )
    calculator = AccuracyCalculator(include=("NMI", "AMI"), kmeans_func=lambda x, k: torch.from_numpy(assignment),
                                    device=torch.device("cpu"))
    peer = calculator.get_accuracy(embeddings, labels)
    assert ours["nmi"] == pytest.approx(peer["NMI"], abs=1e-12)
    assert ours["ami"] == pytest.approx(peer["AMI"], abs=1e-12)
    assert len(np.unique(assignment)) > 1
