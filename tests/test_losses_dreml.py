import pytest
import torch
from losses_testkit import (
    check_class_loss_contract,
    check_class_loss_degenerate_and_bf16,
    loss_gradcheck,
    random_batch,
)
from test_losses_prototypical import reference_half
from test_losses_proxy_nca import reference_proxy_nca

from dmlbench import losses
from dmlbench.errors import UserInputError
from dmlbench.losses.dreml import random_meta_class_partitions

# pytorch-metric-learning has no DREML, so there is no cross-check against it.


def test_partitions_are_balanced_seeded_and_differ_between_learners() -> None:
    partitions = random_meta_class_partitions(num_classes=23, num_learners=6, num_meta_classes=5, seed=3)
    assert partitions.shape == (6, 23)
    for row in partitions:
        sizes = torch.bincount(row, minlength=5)
        assert sizes.min() >= 4 and sizes.max() <= 5 and sizes.sum() == 23
    assert len({tuple(row.tolist()) for row in partitions}) == 6
    assert torch.equal(partitions, random_meta_class_partitions(23, 6, 5, seed=3))
    assert not torch.equal(partitions, random_meta_class_partitions(23, 6, 5, seed=4))


def test_matches_brute_force_with_proxy_nca_learners() -> None:
    # Learner k: proxy NCA (004 eq. 13) on chunk k with meta-class labels; the loss is the mean over learners.
    embeddings, labels = random_batch(10, 12, 6, seed=1, normalize=False)
    loss = losses.build("dreml", num_classes=6, embedding_dim=12, num_learners=3, num_meta_classes=3, seed=2).double()
    per_learner = []
    for k, learner in enumerate(loss.learners):
        chunk = embeddings[:, 4 * k : 4 * (k + 1)]
        meta = torch.tensor([int(loss.partitions[k, y]) for y in labels.tolist()])
        per_learner.append(reference_proxy_nca(chunk, meta, learner.proxies, scale=3.0, squared=True))
    torch.testing.assert_close(loss(embeddings, labels).item(), sum(per_learner) / 3, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("normalize", [True, False])
def test_chunks_normalised_on_request_with_a_classless_base(normalize: bool) -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=3, normalize=False)
    loss = losses.build(
        "dreml",
        num_classes=4,
        embedding_dim=6,
        base="prototypical",
        num_learners=2,
        num_meta_classes=2,
        normalize_chunks=normalize,
    )
    expected = 0.0
    for k in range(2):
        chunk = embeddings[:, 3 * k : 3 * (k + 1)]
        chunk = torch.nn.functional.normalize(chunk, dim=1) if normalize else chunk
        expected += reference_half(chunk, loss.partitions[k][labels]) / 2
    torch.testing.assert_close(loss(embeddings, labels).item(), expected, rtol=1e-10, atol=1e-10)


def test_learners_get_base_hparams_and_their_own_seeds() -> None:
    loss = losses.build(
        "dreml", num_classes=10, embedding_dim=8, base="normalized_softmax", num_learners=4, num_meta_classes=3,
        seed=7, base_hparams={"temperature": 0.1},
    )
    for learner in loss.learners:
        assert (learner.temperature, learner.num_classes, learner.embedding_dim) == (0.1, 3, 2)
    assert len(losses.loss_parameters(loss)) == 4
    single = losses.build("normalized_softmax", num_classes=3, embedding_dim=2, temperature=0.1, seed=7 + 1 + 2)
    assert torch.equal(loss.learners[2].weights, single.weights)


def test_defaults_follow_seed_000() -> None:
    loss = losses.build("dreml", num_classes=100, embedding_dim=144)
    assert len(loss.learners) == 12 and loss.partitions.shape == (12, 100)
    assert int(loss.partitions.max()) == 11
    assert all(type(learner).__name__ == "ProxyNCALoss" and learner.embedding_dim == 12 for learner in loss.learners)


def test_gradcheck() -> None:
    embeddings, labels = random_batch(6, 4, 4, seed=2, normalize=False)
    loss = losses.build("dreml", num_classes=4, embedding_dim=4, num_learners=2, num_meta_classes=2)
    assert loss_gradcheck(loss, embeddings, labels)


def test_degenerate_inputs_and_bf16() -> None:
    check_class_loss_degenerate_and_bf16("dreml", bf16_atol=0.05, num_learners=2, num_meta_classes=2)


def test_contract_and_bad_hyper_parameters() -> None:
    check_class_loss_contract("dreml", num_learners=2, num_meta_classes=2)

    def build(**options: object) -> torch.nn.Module:
        return losses.build("dreml", num_classes=20, embedding_dim=12, **options)

    cases = {
        "embedding_dim": {"num_learners": 5},
        "num_meta_classes": {"num_meta_classes": 21},
        "num_learners": {"num_learners": 0},
        "base": {"base": "dreml"},
        "proxy_ncaa": {"base": "proxy_ncaa"},
        "seed": {"base_hparams": {"seed": 3}},
        "temperature": {"base_hparams": {"temperature": 0.1}},  # proxy_nca has no temperature
    }
    for message, options in cases.items():
        with pytest.raises(UserInputError, match=message):
            build(**options)
    with pytest.raises(UserInputError, match="num_meta_classes"):
        build(num_meta_classes=1)
