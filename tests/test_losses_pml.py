"""The pytorch-metric-learning bridge: ``pml:<ClassName>`` losses and miners (issue 22 §2)."""

import pytest
import torch

from dmlbench import config as config_module
from dmlbench import losses, mining
from dmlbench.errors import UserInputError
from dmlbench.mining.tuples import Pairs


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(12, 6, generator=generator, dtype=torch.float64), torch.arange(12) % 4


def test_pml_contrastive_equals_ours_up_to_the_documented_reduction() -> None:
    """PML averages the non-zero positive terms and the non-zero negative terms separately and adds
    the two means; ours averages all pairs together (seed 001 eq. 1's 1/b). With every term non-zero
    (a margin above every distance) PML's value is ours on the positive pairs plus ours on the
    negative pairs: checked for value and gradient, both losses on the same L2-normalised rows."""
    raw, labels = batch()
    pairs = mining.build("pml:PairMarginMiner", pos_margin=0.0, neg_margin=10.0)(torch.nn.functional.normalize(raw), labels)
    assert isinstance(pairs, Pairs) and len(pairs.positives) and len(pairs.negatives)
    bridged = losses.build("pml:ContrastiveLoss", pos_margin=0.0, neg_margin=3.0)
    ours = losses.build("contrastive", margin=3.0)
    empty = torch.empty(0, dtype=torch.long)
    positive_only = Pairs(pairs.positive_anchors, pairs.positives, empty, empty)
    negative_only = Pairs(empty, empty, pairs.negative_anchors, pairs.negatives)

    def value_and_gradient(function):  # noqa: ANN001, ANN202
        rows = raw.clone().requires_grad_(True)
        value = function(torch.nn.functional.normalize(rows))
        value.backward()
        return value.detach(), rows.grad

    theirs = value_and_gradient(lambda e: bridged(e, labels, pairs))
    mapped = value_and_gradient(lambda e: ours(e, labels, positive_only) + ours(e, labels, negative_only))
    torch.testing.assert_close(theirs[0], mapped[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(theirs[1], mapped[1], rtol=1e-8, atol=1e-10)


def test_a_classification_loss_gets_the_runs_sizes_and_trains_its_own_weights() -> None:
    loss = losses.build("pml:ArcFaceLoss", num_classes=4, embedding_dim=6, margin=20.0)
    assert loss.uses_tuples is False and [tuple(p.shape) for p in losses.loss_parameters(loss)] == [(6, 4)]
    embeddings, labels = batch(1)
    assert torch.isfinite(loss(embeddings.float(), labels))
    with pytest.raises(UserInputError, match="does not use mined tuples"):
        config_module.from_dict({"loss": {"name": "pml:ArcFaceLoss"}, "miner": {"name": "semihard"}})


def test_a_pml_miner_is_seeded_by_its_own_generator_and_leaves_torchs_untouched() -> None:
    embeddings, labels = batch(2)
    embeddings = torch.nn.functional.normalize(embeddings.float())

    def mined(seed: int) -> tuple[torch.Tensor, ...]:
        miner = mining.build("pml:DistanceWeightedMiner", generator=torch.Generator().manual_seed(seed))
        found = miner(embeddings, labels)
        return found.anchors, found.positives, found.negatives

    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    first, again = mined(0), mined(0)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert any(not torch.equal(a, b) for a, b in zip(first, mined(1)))


def test_bridge_errors_are_one_line() -> None:
    with pytest.raises(UserInputError, match=r"unknown loss 'pml:ContrastivLoss'.*did you mean 'pml:ContrastiveLoss'"):
        losses.build("pml:ContrastivLoss")
    with pytest.raises(UserInputError, match="has no parameter 'margin'; it accepts: .*neg_margin, pos_margin"):
        config_module.from_dict({"loss": {"name": "pml:ContrastiveLoss", "params": {"margin": 1.0}}})
    with pytest.raises(UserInputError, match="unknown miner 'pml:NoSuchMiner'"):
        mining.build("pml:NoSuchMiner")
    config = config_module.from_dict({"loss": {"name": "pml:MultiSimilarityLoss", "params": {"base": 0.4}},
                                      "miner": {"name": "pml:MultiSimilarityMiner", "params": {"epsilon": 0.2}}})
    assert config.loss.name == "pml:MultiSimilarityLoss"


def test_without_the_extra_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    real_import = importlib.import_module

    def without_pml(name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if name.startswith("pytorch_metric_learning"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", without_pml)
    with pytest.raises(UserInputError, match=r"loss 'pml:TripletMarginLoss' needs pytorch-metric-learning: pip install 'dmlbench\[pml\]'"):
        losses.build("pml:TripletMarginLoss")
