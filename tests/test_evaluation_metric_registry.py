"""The metric registry (issue 33 §5): built-in values unchanged, titles, plugins' metrics in ``evaluate``
and in a run's validation."""

from pathlib import Path

import numpy as np
import pytest
import torch

import dmlbench
from dmlbench import config as config_module
from dmlbench import plugins
from dmlbench.catalog import components
from dmlbench.errors import UserInputError
from dmlbench.evaluation import clustering, evaluate, retrieval
from dmlbench.evaluation.knn_index import prepare
from dmlbench.evaluation.metrics import METRICS, metric_title

ALL = ["precision_at_1", "recall_at_1", "recall_at_3", "r_precision", "map_at_r", "map_at_c", "map_at_1000", "mrr",
       "nmi", "ami", "f1"]


def random_case(seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(seed)
    labels = np.repeat(np.arange(6), [3, 5, 9, 4, 7, 2])
    centres = generator.normal(size=(6, 5))
    return centres[labels] * 0.8 + generator.normal(size=(len(labels), 5)), labels


def brute_force_hits(embeddings: np.ndarray, labels: np.ndarray, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every row queries all others by float64 Euclidean distance (ties by index): hits [N, k], R, k_c."""
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    hits, relevant, class_sizes = [], [], []
    for query in range(len(labels)):
        others = [row for row in range(len(labels)) if row != query]
        distances = [float(np.sqrt(((unit[query] - unit[row]) ** 2).sum())) for row in others]
        order = sorted(range(len(others)), key=lambda i: (distances[i], others[i]))[:k]
        hits.append([labels[others[i]] == labels[query] for i in order])
        relevant.append(int((labels == labels[query]).sum()) - 1)
        class_sizes.append(int((labels == labels[query]).sum()))
    return torch.tensor(hits), torch.tensor(relevant), torch.tensor(class_sizes)


def direct(embeddings: np.ndarray, labels: np.ndarray, k: int, seed: int = 0) -> dict[str, float]:
    """Each built-in metric from retrieval.py / clustering.py called on its own, without the registry."""
    hits, relevant, class_sizes = brute_force_hits(embeddings, labels, k)
    largest = int(np.bincount(labels).max())
    rows = prepare(torch.from_numpy(embeddings), normalize=True, binarize=False).search_rows
    clusters = clustering.kmeans_assignment(rows, len(np.unique(labels)), seed=seed)
    return {
        "precision_at_1": retrieval.precision_at_1(hits, relevant),
        "recall_at_1": retrieval.recall_at_k(hits, relevant, 1), "recall_at_3": retrieval.recall_at_k(hits, relevant, 3),
        "r_precision": retrieval.r_precision(hits, relevant), "map_at_r": retrieval.map_at_r(hits, relevant),
        "map_at_c": retrieval.map_at_c(hits, class_sizes), "map_at_1000": retrieval.map_at_1000(hits),
        "mrr": retrieval.mean_reciprocal_rank(hits[:, :largest], relevant),
        "nmi": clustering.nmi(labels, clusters), "ami": clustering.ami(labels, clusters),
        "f1": clustering.pairwise_f1(labels, clusters),
    }


def test_every_built_in_metric_is_the_value_of_its_function_called_directly() -> None:
    embeddings, labels = random_case()
    scores = evaluate(embeddings, labels, metrics=ALL)  # default k: every reference, for map_at_1000
    expected = direct(embeddings, labels, len(labels) - 1)
    assert {name: scores[name] for name in ALL} == expected  # exactly: the same functions on the same hits
    # Without map_at_1000 the default k is the largest class, and the values are those of that many columns.
    names = [name for name in ALL if name != "map_at_1000"]
    scores = evaluate(embeddings, labels, metrics=names)
    expected = direct(embeddings, labels, int(np.bincount(labels).max()))
    assert {name: scores[name] for name in names} == {name: expected[name] for name in names}
    assert 0.0 < scores["map_at_r"] < 1.0 and scores["precision_at_1"] != scores["map_at_r"]


def test_the_registry_lists_titles_and_directions() -> None:
    assert dmlbench.evaluation.available_metrics()[:2] == ["precision_at_1", "recall_at_<k>"]
    assert [metric_title(name) for name in ("precision_at_1", "r_precision", "map_at_r", "recall_at_16")] == \
        ["P@1", "R-Precision", "MAP@R", "R@16"]
    assert metric_title("not_registered_here") == "not_registered_here"
    assert all(METRICS.get(name).higher_is_better for name in ALL)
    assert METRICS.get("nmi").is_clustering and not METRICS.get("recall_at_5").is_clustering
    with pytest.raises(UserInputError, match="metric 'map_at_r' is already registered"):
        METRICS.register("map_at_r")(lambda hits, layout: 0.0)
    with pytest.raises(UserInputError, match="metric 'recall_at_3' is already registered"):
        METRICS.register("recall_at_3")(lambda hits, layout: 0.0)
    with pytest.raises(UserInputError, match="unknown metric 'recall_at_0'"):
        evaluate(*random_case(), metrics=["recall_at_0"])


PLUGIN = '''
import dmlbench


@dmlbench.register_metric("{name}", title="Hits@2", neighbours=2)
def hits_at_two(hits, layout):
    """Share of correct answers among the 2 nearest, averaged over queries with R > 0 (a test metric)."""
    return float(hits[layout.relevant > 0, :2].double().mean())
'''


def test_a_plugin_metric_is_computed_by_evaluate_and_listed(tmp_path: Path) -> None:
    path = tmp_path / "plugin_metric_a.py"
    path.write_text(PLUGIN.format(name="plugin_hits_at_2"))
    plugins.load([str(path)])
    embeddings, labels = random_case(3)
    scores = evaluate(embeddings, labels, metrics=["plugin_hits_at_2", "map_at_r"])
    hits, relevant, _ = brute_force_hits(embeddings, labels, 2)
    by_loop = np.mean([float(row.double().mean()) for row, r in zip(hits, relevant) if r > 0])
    assert scores["plugin_hits_at_2"] == pytest.approx(by_loop, abs=1e-12)
    assert scores["map_at_r"] == evaluate(embeddings, labels, metrics=["map_at_r"])["map_at_r"]
    assert metric_title("plugin_hits_at_2") == "Hits@2"
    (entry,) = [entry for entry in components("metrics") if entry["name"] == "plugin_hits_at_2"]
    assert entry["source"] == "plugin_metric_a.py" and entry["summary"].startswith("Share of correct answers")
    with pytest.raises(UserInputError, match="neighbours must be a positive int"):
        dmlbench.register_metric("plugin_bad_neighbours", neighbours=0)(lambda hits, layout: 0.0)


def test_a_plugin_metric_selects_a_runs_checkpoint(tmp_path: Path) -> None:
    from training_fixtures import TINY

    from dmlbench.training import train
    from dmlbench.training.runs import embed_run

    path = tmp_path / "plugin_metric_b.py"
    path.write_text(PLUGIN.format(name="plugin_hits_at_2_run"))
    config_path = tmp_path / "run.yaml"
    config_path.write_text(Path("configs/glyphs.yaml").read_text() + "\nplugins: [plugin_metric_b.py]\n")
    config = config_module.load(config_path, [*TINY, "training.epochs=1", "training.max_steps_per_epoch=2",
                                              "evaluation.metrics=[plugin_hits_at_2_run, map_at_r]",
                                              "evaluation.selection_metric=plugin_hits_at_2_run"])
    result = train(config, tmp_path / "run", progress=False)
    validation, validation_labels = embed_run(tmp_path / "run", "validation")
    expected = evaluate(validation, validation_labels, metrics=["plugin_hits_at_2_run"])["plugin_hits_at_2_run"]
    assert result.best_validation is not None
    assert result.best_validation["plugin_hits_at_2_run"] == pytest.approx(expected, abs=1e-12)


def test_a_lower_is_better_metric_cannot_select(tmp_path: Path) -> None:
    path = tmp_path / "plugin_metric_c.py"
    path.write_text('''
import dmlbench


@dmlbench.register_metric("plugin_miss_rate", title="mean miss", higher_is_better=False)
def miss_rate(hits, layout):
    """Share of wrong answers among the retrieved (a test metric)."""
    return float((~hits[layout.relevant > 0]).double().mean())
''')
    plugins.load([str(path)])
    embeddings, labels = random_case(5)
    score = evaluate(embeddings, labels, metrics=["plugin_miss_rate"])["plugin_miss_rate"]
    # Its default neighbours are the largest class, which evaluate retrieves anyway.
    hits, relevant, _ = brute_force_hits(embeddings, labels, int(np.bincount(labels).max()))
    assert score == pytest.approx(np.mean([1 - float(row.double().mean()) for row, r in zip(hits, relevant) if r > 0]), abs=1e-12)
    with pytest.raises(UserInputError, match="'plugin_miss_rate' is lower-is-better"):
        config_module.from_dict({"evaluation": {"metrics": ["plugin_miss_rate", "map_at_r"],
                                                "selection_metric": "plugin_miss_rate"}})
    config = config_module.from_dict({"evaluation": {"metrics": ["plugin_miss_rate", "map_at_r"]}})
    assert config.evaluation.selection_metric == "map_at_r"
