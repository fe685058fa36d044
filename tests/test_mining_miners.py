"""Miners: label constraints, brute-force loop references, determinism, pytorch-metric-learning cross-checks."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from losses_testkit import pair_sets, random_batch, rows, triplet_set
from pytorch_metric_learning import miners as pml_miners

import dmlbench.mining as mining
from dmlbench.errors import UserInputError
from dmlbench.mining import Pairs, Triplets

TRIPLET_MINERS = ["random", "semihard", "softhard", "hard", "distance_weighted"]


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Loops of many tiny tensor ops run far slower with two OpenMP threads on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def py_distance(u: list[float], v: list[float]) -> float:
    return math.sqrt(sum((a - b) ** 2 for a, b in zip(u, v)))


def distance_table(embeddings: torch.Tensor) -> list[list[float]]:
    points = rows(embeddings)
    return [[py_distance(u, v) for v in points] for u in points]


def build(name: str, seed: int = 0, **hparams: object) -> mining.Miner:
    return mining.build(name, generator=torch.Generator().manual_seed(seed), **hparams)


def assert_valid_triplets(triplets: Triplets, labels: list[int]) -> None:
    for a, p, n in triplet_set(triplets):
        assert a != p and labels[a] == labels[p] and labels[a] != labels[n], (a, p, n)


@pytest.mark.parametrize("name", TRIPLET_MINERS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_triplets_satisfy_label_constraints(name: str, seed: int) -> None:
    embeddings, labels = random_batch(24, 8, 5, seed=seed)
    triplets = build(name, seed)(embeddings, labels)
    assert isinstance(triplets, Triplets)
    assert triplets.anchors.dtype == torch.long and len(triplets) > 0
    assert_valid_triplets(triplets, labels.tolist())


@pytest.mark.parametrize("name", [*TRIPLET_MINERS, "multi_similarity"])
def test_same_generator_seed_gives_same_tuples(name: str) -> None:
    embeddings, labels = random_batch(24, 8, 5, seed=3)
    first, second = build(name, 7)(embeddings, labels), build(name, 7)(embeddings, labels)
    for field in first.__dataclass_fields__:
        assert torch.equal(getattr(first, field), getattr(second, field))


@pytest.mark.parametrize("name", ["random", "semihard", "softhard", "distance_weighted"])
def test_randomness_comes_from_the_generator(name: str) -> None:
    embeddings, labels = random_batch(48, 8, 4, seed=4)
    torch.manual_seed(0)
    reference = triplet_set(build(name, 1)(embeddings, labels))
    torch.manual_seed(1)  # the global RNG must not matter
    assert triplet_set(build(name, 1)(embeddings, labels)) == reference
    assert any(triplet_set(build(name, seed)(embeddings, labels)) != reference for seed in range(2, 6))


@pytest.mark.parametrize("name", [*TRIPLET_MINERS, "multi_similarity"])
@pytest.mark.parametrize("labels", [[0, 0, 0, 0, 0], [0, 1, 2, 3, 4]], ids=["one_class", "no_positives"])
def test_batches_without_valid_triplets_give_empty_tuples(name: str, labels: list[int]) -> None:
    embeddings, _ = random_batch(5, 8, 2, seed=5)
    tuples = build(name)(embeddings, torch.tensor(labels))
    if isinstance(tuples, Pairs):
        positive, negative = pair_sets(tuples)
        assert not (positive and negative)  # one of the two sets has nothing to be mined against
    else:
        assert len(tuples) == 0


@pytest.mark.usefixtures("one_thread")
def test_random_miner_one_triplet_per_eligible_anchor_and_uniform_choices() -> None:
    labels = torch.tensor([0, 0, 0, 0, 1, 2, 2])  # anchor 4 has no positive
    embeddings, _ = random_batch(7, 4, 3, seed=6)
    triplets = build("random")(embeddings, labels)
    assert triplets.anchors.tolist() == [0, 1, 2, 3, 5, 6]
    # anchor 0: positives {1, 2, 3} and negatives {4, 5, 6}, each 1/3; binomial sd of 1500 draws ~ 18
    counts_p, counts_n = torch.zeros(7), torch.zeros(7)
    miner = build("random", 11)
    draws = 1500
    for _ in range(draws):
        t = miner(embeddings, labels)
        counts_p[t.positives[0]] += 1
        counts_n[t.negatives[0]] += 1
    for counts, chosen in ((counts_p, [1, 2, 3]), (counts_n, [4, 5, 6])):
        assert counts.sum() == counts[chosen].sum()
        assert (counts[chosen] - draws / 3).abs().max() < 5 * math.sqrt(draws * (1 / 3) * (2 / 3))


@pytest.mark.parametrize("distance", ["euclidean", "squared_euclidean"])
def test_semihard_window_and_dropped_anchors(distance: str) -> None:
    embeddings, labels = random_batch(32, 6, 4, seed=8)
    table = distance_table(embeddings)
    if distance == "squared_euclidean":
        table = [[d * d for d in row] for row in table]
    margin = 0.3
    label_list = labels.tolist()
    triplets = build("semihard", margin=margin, distance=distance)(embeddings, labels)
    assert_valid_triplets(triplets, label_list)
    for a, p, n in triplet_set(triplets):
        assert table[a][p] < table[a][n] < table[a][p] + margin
    # an anchor is dropped only if the window of its drawn positive is empty; kept anchors are unique
    assert len(set(triplets.anchors.tolist())) == len(triplets)


def brute_force_semihard(table: list[list[float]], labels: list[int], margin: float) -> set[tuple[int, int, int]]:
    size = len(labels)
    return {
        (a, p, n)
        for a in range(size)
        for p in range(size)
        for n in range(size)
        if a != p and labels[a] == labels[p] and labels[n] != labels[a] and table[a][p] < table[a][n] < table[a][p] + margin
    }


def test_semihard_all_triplets_matches_loops_and_pytorch_metric_learning() -> None:
    embeddings, labels = random_batch(20, 6, 4, seed=9)
    mined = triplet_set(build("semihard", margin=0.2, all_triplets=True)(embeddings, labels))
    assert mined == brute_force_semihard(distance_table(embeddings), labels.tolist(), 0.2)
    # PML's semihard window is 0 < d_an - d_ap <= margin; equality has probability 0 on random data
    pml = pml_miners.TripletMarginMiner(margin=0.2, type_of_triplets="semihard")(embeddings, labels)
    assert mined == set(zip(*(index.tolist() for index in pml)))


def test_softhard_follows_equations_21_22_with_fallback() -> None:
    embeddings, labels = random_batch(24, 4, 3, seed=10)
    table, label_list = distance_table(embeddings), labels.tolist()
    for seed in range(5):
        triplets = build("softhard", seed)(embeddings, labels)
        assert_valid_triplets(triplets, label_list)
        assert triplets.anchors.tolist() == list(range(24))
        for a, p, n in triplet_set(triplets):
            positives = [j for j in range(24) if j != a and label_list[j] == label_list[a]]
            negatives = [k for k in range(24) if label_list[k] != label_list[a]]
            farthest_positive = max(table[a][j] for j in positives)
            closest_negative = min(table[a][k] for k in negatives)
            hard_negatives = [k for k in negatives if table[a][k] < farthest_positive]
            hard_positives = [j for j in positives if table[a][j] > closest_negative]
            assert n in (hard_negatives or negatives)
            assert p in (hard_positives or positives)


def test_hard_miner_matches_loops_and_pytorch_metric_learning() -> None:
    embeddings, labels = random_batch(24, 6, 5, seed=12)
    table, label_list = distance_table(embeddings), labels.tolist()
    triplets = build("hard")(embeddings, labels)
    expected = set()
    for a in range(24):
        positives = [j for j in range(24) if j != a and label_list[j] == label_list[a]]
        negatives = [k for k in range(24) if label_list[k] != label_list[a]]
        if positives and negatives:
            expected.add((a, max(positives, key=lambda j: table[a][j]), min(negatives, key=lambda k: table[a][k])))
    assert triplet_set(triplets) == expected
    pml = pml_miners.BatchHardMiner()(embeddings, labels)
    assert triplet_set(triplets) == set(zip(*(index.tolist() for index in pml)))


def test_hard_miner_breaks_ties_by_index() -> None:
    point = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    other = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    embeddings = torch.cat([point, other, other, point, point])  # 1 and 2 tie as positives of 0; 3, 4 tie as negatives
    labels = torch.tensor([0, 0, 0, 1, 1])
    triplets = build("hard")(embeddings, labels)
    assert (0, 1, 3) in triplet_set(triplets)


def reference_distance_weights(table: list[list[float]], labels: list[int], dim: int, lower: float, upper: float) -> list[list[float]]:
    """P(n|a) of Roth et al. supp. eq. 23-24 (Wu et al. 2017), normalised per anchor; 0 for non-candidates."""
    result = []
    for a, row in enumerate(table):
        weights = []
        for n, d in enumerate(row):
            if labels[n] == labels[a] or d >= upper:
                weights.append(0.0)
                continue
            clamped = min(max(d, lower), 2 - 1e-4)
            log_q = (dim - 2) * math.log(clamped) + (dim - 3) / 2 * math.log(1 - clamped**2 / 4)
            weights.append(math.exp(-log_q))
        total = sum(weights)
        result.append([w / total if total else 0.0 for w in weights])
    return result


def test_distance_weighted_probabilities_match_loops_and_pytorch_metric_learning(monkeypatch: pytest.MonkeyPatch) -> None:
    embeddings, labels = random_batch(20, 8, 4, seed=13)
    miner = build("distance_weighted")
    probabilities = torch.softmax(miner.negative_log_weights(embeddings, labels), dim=1)
    reference = reference_distance_weights(distance_table(embeddings), labels.tolist(), 8, 0.5, 1.4)
    torch.testing.assert_close(probabilities, torch.tensor(reference, dtype=torch.float64), rtol=1e-9, atol=1e-12)

    # PML samples inside the miner; capture the weight matrix it samples from
    captured = {}
    from pytorch_metric_learning.miners import distance_weighted_miner

    def capture(labels: torch.Tensor, ref_labels: torch.Tensor, weights: torch.Tensor) -> tuple:
        captured["weights"] = weights
        empty = torch.empty(0, dtype=torch.long)
        return empty, empty, empty

    monkeypatch.setattr(distance_weighted_miner.lmu, "get_random_triplet_indices", capture)
    pml_miners.DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4)(embeddings, labels)
    torch.testing.assert_close(probabilities, captured["weights"], rtol=1e-6, atol=1e-12)


@pytest.mark.usefixtures("one_thread")
def test_distance_weighted_respects_cutoffs_and_sampling_frequencies() -> None:
    embeddings, labels = random_batch(16, 3, 4, seed=14)
    distances = torch.tensor(distance_table(embeddings), dtype=torch.float64)
    miner = build("distance_weighted", 3)
    probabilities = torch.softmax(miner.negative_log_weights(embeddings, labels), dim=1)
    counts = torch.zeros(16, 16, dtype=torch.float64)
    draws = 1000
    for _ in range(draws):
        triplets = miner(embeddings, labels)
        assert (labels[triplets.negatives] != labels[triplets.anchors]).all()
        assert (distances[triplets.anchors, triplets.negatives] < 1.4).all()
        counts.index_put_((triplets.anchors, triplets.negatives), torch.ones(len(triplets), dtype=torch.float64), accumulate=True)
    drawn = counts.sum(dim=1) > 0
    assert drawn.sum() >= 10
    expected = probabilities[drawn] * draws
    tolerance = 5 * (expected * (1 - probabilities[drawn])).sqrt() + 1
    assert ((counts[drawn] - expected).abs() <= tolerance).all()


def test_distance_weighted_drops_anchors_without_eligible_negatives() -> None:
    # two antipodal classes in 2-D: every negative is at distance 2 >= 1.4
    embeddings = torch.tensor([[1.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1])
    assert len(build("distance_weighted")(embeddings, labels)) == 0
    # without the upper cutoff, d = 2 is clamped just below 2 and every anchor gets a negative
    unmasked = build("distance_weighted", upper_cutoff=None)(embeddings, labels)
    assert unmasked.anchors.tolist() == [0, 1, 2, 3]
    assert_valid_triplets(unmasked, labels.tolist())


def brute_force_multi_similarity(embeddings: torch.Tensor, labels: list[int], epsilon: float) -> tuple[set, set]:
    points = [[x / math.sqrt(sum(v * v for v in u)) for x in u] for u in rows(embeddings)]
    size = len(labels)
    similarity = [[sum(x * y for x, y in zip(points[i], points[j])) for j in range(size)] for i in range(size)]
    positives, negatives = set(), set()
    for i in range(size):
        pos = [j for j in range(size) if j != i and labels[j] == labels[i]]
        neg = [k for k in range(size) if labels[k] != labels[i]]
        if not pos or not neg:
            continue
        positives |= {(i, j) for j in pos if similarity[i][j] - epsilon < max(similarity[i][k] for k in neg)}
        negatives |= {(i, k) for k in neg if similarity[i][k] + epsilon > min(similarity[i][j] for j in pos)}
    return positives, negatives


@pytest.mark.parametrize("seed", [15, 16])
def test_multi_similarity_matches_loops_and_pytorch_metric_learning(seed: int) -> None:
    embeddings, labels = random_batch(24, 6, 4, seed=seed)
    pairs = build("multi_similarity", epsilon=0.1)(embeddings, labels)
    assert isinstance(pairs, Pairs)
    mined = pair_sets(pairs)
    assert mined == brute_force_multi_similarity(embeddings, labels.tolist(), 0.1)
    a1, p, a2, n = pml_miners.MultiSimilarityMiner(epsilon=0.1)(embeddings, labels)
    assert mined == (set(zip(a1.tolist(), p.tolist())), set(zip(a2.tolist(), n.tolist())))
    label_list = labels.tolist()
    assert all(i != j and label_list[i] == label_list[j] for i, j in mined[0])
    assert all(label_list[i] != label_list[k] for i, k in mined[1])


def test_miners_ignore_autocast_and_half_precision() -> None:
    embeddings, labels = random_batch(24, 8, 4, seed=17, dtype=torch.float32)
    reference = triplet_set(build("hard")(embeddings, labels))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert triplet_set(build("hard")(embeddings, labels)) == reference
    assert_valid_triplets(build("distance_weighted")(embeddings.bfloat16(), labels), labels.tolist())


def test_miners_never_build_graphs() -> None:
    embeddings, labels = random_batch(12, 4, 3, seed=18)
    triplets = build("hard")(embeddings.requires_grad_(True), labels)
    assert not triplets.anchors.requires_grad


@pytest.mark.parametrize(
    ("name", "hparams", "parameter"),
    [
        ("semihard", {"margin": -0.1}, "margin"),
        ("semihard", {"margin": 0.0}, "margin"),
        ("semihard", {"distance": "cosine"}, "distance"),
        ("distance_weighted", {"lower_cutoff": 0.0}, "lower_cutoff"),
        ("distance_weighted", {"lower_cutoff": 0.5, "upper_cutoff": 0.4}, "upper_cutoff"),
        ("multi_similarity", {"epsilon": -1.0}, "epsilon"),
        ("random", {"margin": 0.2}, "margin"),
        ("hard", {"p_switch": 1.5}, "p_switch"),
        ("hard", {"p_switch": -0.1}, "p_switch"),
        ("semihardd", {}, "semihard"),
    ],
)
def test_bad_hyper_parameters_name_the_parameter(name: str, hparams: dict, parameter: str) -> None:
    with pytest.raises(UserInputError, match=parameter):
        mining.build(name, **hparams)


@pytest.mark.parametrize(
    ("embeddings", "labels", "parameter"),
    [
        (torch.zeros(4, 3), torch.zeros(5, dtype=torch.long), "labels"),
        (torch.zeros(4), torch.zeros(4, dtype=torch.long), "embeddings"),
        (torch.zeros(4, 3), torch.zeros(4), "labels"),
        (torch.zeros(4, 3, dtype=torch.long), torch.zeros(4, dtype=torch.long), "embeddings"),
    ],
)
def test_mismatched_inputs_name_the_parameter(embeddings: torch.Tensor, labels: torch.Tensor, parameter: str) -> None:
    with pytest.raises(UserInputError, match=parameter):
        build("hard")(embeddings, labels)


def test_all_triplets_enumerates_in_index_order() -> None:
    labels = [2, 0, 2, 1, 0, 2, 1]
    size = len(labels)
    expected = [
        (a, p, n)
        for a in range(size)
        for p in range(size)
        for n in range(size)
        if a != p and labels[a] == labels[p] and labels[n] != labels[a]
    ]
    every = mining.all_triplets(torch.tensor(labels))
    assert list(zip(every.anchors.tolist(), every.positives.tolist(), every.negatives.tolist())) == expected


def test_every_registered_miner_is_known() -> None:
    assert set(mining.MINERS.names()) >= {*TRIPLET_MINERS, "multi_similarity"}



def test_the_semihard_window_follows_the_loss_margin_unless_the_miner_sets_its_own(tmp_path) -> None:
    """A searched triplet margin moves the semihard window with it (with a fixed 0.2 window every margin above
    0.2 mined the same triplets and trained the same model); a miner margin given explicitly is kept, and
    run.json records the parameters the miner was built with."""
    from dmlbench import config as config_module
    from dmlbench.files import read_json
    from dmlbench.training import train
    from dmlbench.training.setup import build_loss_and_miner, miner_params
    from training_fixtures import TINY

    def config(*overrides: str) -> config_module.Config:
        return config_module.load(None, [*TINY, "loss.name=triplet", "miner.name=semihard", *overrides])

    follows = config("loss.params={margin: 0.4}")
    assert miner_params(follows) == {"margin": 0.4}
    assert build_loss_and_miner(follows, 40, torch.device("cpu"))[1].margin == 0.4
    own = config("loss.params={margin: 0.4}", "miner.params={margin: 0.1}")
    assert build_loss_and_miner(own, 40, torch.device("cpu"))[1].margin == 0.1
    assert miner_params(config()) == {}  # neither set: each keeps its default (0.2 both)
    assert miner_params(config("miner.name=distance_weighted", "loss.name=margin", "loss.params={margin: 0.3}")) == {}
    # Two margins above the old fixed window now mine different triplets.
    embeddings, labels = torch.randn(32, 8, generator=torch.Generator().manual_seed(0)), torch.arange(8).repeat(4)
    mined = [build_loss_and_miner(config(f"loss.params={{margin: {m}}}"), 40, torch.device("cpu"))[1](embeddings, labels)
             for m in (0.3, 1.5)]
    assert mined[0].anchors.numel() != mined[1].anchors.numel() or not torch.equal(mined[0].negatives, mined[1].negatives)
    run = tmp_path / "run"
    train(config_module.load(None, [*TINY, "loss.name=triplet", "miner.name=semihard", "loss.params={margin: 0.35}",
                                    "training.epochs=1", "training.max_steps_per_epoch=1"]), run, progress=False)
    assert read_json(run / "run.json")["miner"] == {"name": "semihard", "params": {"margin": 0.35}}
