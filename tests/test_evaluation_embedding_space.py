"""Spectral decay rho and the pi distance ratios against plain-loop references (Roth et al. 2020 section 5)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dmlbench.errors import UserInputError
from dmlbench.evaluation import embedding_space


def _reference_rho(embeddings: np.ndarray, drop: int, center: bool) -> float:
    data = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    if center:
        data = data - data.mean(axis=0)
    values = sorted(np.linalg.svd(data, compute_uv=False).tolist(), reverse=True)[drop:]
    total = sum(values)
    uniform = 1.0 / len(values)
    return sum(uniform * math.log(uniform / (value / total)) for value in values)


def _reference_pi(embeddings: np.ndarray, labels: list[int]) -> tuple[float, float]:
    rows = (embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)).tolist()
    classes = sorted(set(labels))
    intra = []
    for c in classes:
        members = [rows[i] for i in range(len(rows)) if labels[i] == c]
        if len(members) < 2:
            continue
        total = sum(math.dist(a, b) for i, a in enumerate(members) for j, b in enumerate(members) if i != j)
        intra.append(total / (len(members) * (len(members) - 1)))
    means = []
    for c in classes:
        members = [rows[i] for i in range(len(rows)) if labels[i] == c]
        means.append([sum(column) / len(members) for column in zip(*members)])
    inter = sum(math.dist(a, b) for i, a in enumerate(means) for j, b in enumerate(means) if i != j)
    return sum(intra) / len(intra), inter / (len(means) * (len(means) - 1))


@pytest.mark.parametrize(("drop", "center"), [(1, False), (0, False), (2, True)])
def test_rho_equals_kl_of_uniform_to_the_normalised_spectrum(drop, center):
    embeddings = np.random.default_rng(drop).standard_normal((120, 10)) * np.linspace(3.0, 0.2, 10)
    assert embedding_space.spectral_decay(embeddings, drop=drop, center=center) == pytest.approx(
        _reference_rho(embeddings, drop, center), abs=1e-12
    )


def test_rho_is_zero_for_a_flat_spectrum_and_grows_with_compression():
    flat = np.eye(8)  # all singular values equal
    assert embedding_space.spectral_decay(flat, drop=0) == pytest.approx(0.0, abs=1e-12)
    rng = np.random.default_rng(0)
    spread = rng.standard_normal((200, 8))
    compressed = spread * np.array([1.0, 1.0, 0.1, 0.1, 0.01, 0.01, 0.01, 0.01])
    assert embedding_space.spectral_decay(compressed) > embedding_space.spectral_decay(spread)


def test_pi_intra_inter_ratio_with_singleton_classes():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 6, 50).tolist()
    labels[0], labels[1] = 40, 41  # two singleton classes
    embeddings = rng.standard_normal((50, 5))
    result = embedding_space.class_distances(embeddings, np.array(labels))
    intra, inter = _reference_pi(embeddings, labels)
    assert result["pi_intra"] == pytest.approx(intra, abs=1e-12)
    assert result["pi_inter"] == pytest.approx(inter, abs=1e-12)
    assert result["pi_ratio"] == pytest.approx(intra / inter, abs=1e-12)
    assert result["num_singleton_classes"] == 2


def test_intra_class_distances_cover_large_and_small_classes_in_groups(monkeypatch):
    monkeypatch.setattr(embedding_space, "_BLOCK_ENTRIES", 64)  # forces many padded groups
    rng = np.random.default_rng(2)
    labels = np.concatenate([np.zeros(20, int), np.repeat(np.arange(1, 12), 3), [50]])
    embeddings = rng.standard_normal((len(labels), 4))
    result = embedding_space.class_distances(embeddings, labels)
    intra, inter = _reference_pi(embeddings, labels.tolist())
    assert result["pi_intra"] == pytest.approx(intra, abs=1e-12)
    assert result["pi_inter"] == pytest.approx(inter, abs=1e-12)


def test_analyze_and_plot(tmp_path):
    rng = np.random.default_rng(3)
    embeddings = torch.from_numpy(rng.standard_normal((40, 6)))
    labels = torch.from_numpy(rng.integers(0, 4, 40))
    result = embedding_space.analyze(embeddings, labels)
    assert set(result) >= {"rho", "pi_intra", "pi_inter", "pi_ratio", "singular_values"}
    assert result["singular_values"] == sorted(result["singular_values"], reverse=True)
    path = embedding_space.plot_spectrum(result["singular_values"], tmp_path / "spectrum.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_analysis_input_is_a_user_error():
    with pytest.raises(UserInputError, match="drop"):
        embedding_space.spectral_decay(np.eye(3), drop=3)
    with pytest.raises(UserInputError, match="NaN"):
        embedding_space.spectral_decay(np.array([[1.0, np.nan], [0.0, 1.0]]))
    with pytest.raises(UserInputError, match="single class"):
        embedding_space.class_distances(np.eye(3), np.zeros(3, int))
