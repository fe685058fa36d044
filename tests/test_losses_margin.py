"""Margin loss (Wu et al. 2017, Roth et al. 2020 supp. eq. 10): loop reference, learnable beta, PML cross-check."""

from __future__ import annotations

import pytest
import torch
from losses_testkit import (
    LOOP_REFERENCE_TOLERANCES,
    assert_same_value_and_gradient,
    check_degenerate_inputs,
    check_empty_tuple_sets_keep_graph,
    check_tuple_loss_bf16,
    empty_pairs,
    loss_gradcheck,
    mined_tuples,
    random_batch,
    reference_pairs,
)
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import reducers as pml_reducers
from pytorch_metric_learning.distances import LpDistance

from dmlbench import losses, mining
from dmlbench.errors import UserInputError
from dmlbench.losses.margin import MarginLoss


def reference(
    x: torch.Tensor, labels: list[int], positive: list, negative: list, beta: torch.Tensor, margin: float, nu: float
) -> torch.Tensor:
    """Eq. 10 as a loop over pairs, with beta indexed by the anchor's label and nu * beta per pair; mean over pairs."""
    terms = []
    for sign, pairs in ((1.0, positive), (-1.0, negative)):
        for i, j in pairs:
            b = beta[labels[i]] if len(beta) > 1 else beta[0]
            d = torch.sqrt(((x[i] - x[j]) ** 2).sum())
            terms.append(torch.clamp(margin + sign * (d - b), min=0) + nu * b)
    return sum(terms) / len(terms)


def check_against_reference(loss: losses.MetricLoss, embeddings: torch.Tensor, labels: torch.Tensor, tuples) -> None:
    positive, negative = reference_pairs(labels, tuples)
    beta_ref = loss.beta.detach().clone().requires_grad_(True)

    def expected(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return reference(x, y.tolist(), positive, negative, beta_ref, loss.margin, loss.nu)

    assert_same_value_and_gradient(
        lambda e, y: loss(e, y, tuples), expected, embeddings, labels, **LOOP_REFERENCE_TOLERANCES
    )
    torch.testing.assert_close(loss.beta.grad, beta_ref.grad, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("kind", ["all", "pairs", "distance_weighted", "multi_similarity"])
@pytest.mark.parametrize("per_class", [False, True])
def test_matches_loop_reference_values_and_gradients(kind: str, per_class: bool) -> None:
    embeddings, labels = random_batch(14, 6, 4, seed=1)
    tuples = mined_tuples(kind, embeddings, labels, keep=0.5, pair_seed=2, miner_seed=3)
    loss = losses.build("margin", num_classes=4, beta_per_class=per_class, nu=0.1).double()
    with torch.no_grad():  # distinct betas per class, so indexing by the wrong thing would show
        loss.beta.copy_(torch.linspace(0.6, 1.3, len(loss.beta)))
    check_against_reference(loss, embeddings, labels, tuples)


def test_per_class_beta_is_indexed_by_the_anchor_label_not_its_position() -> None:
    embeddings, labels = random_batch(8, 4, 3, seed=4)
    loss = losses.build("margin", num_classes=6, beta_per_class=True).double()
    labels = labels + 3  # labels 3..5 differ from batch positions
    value = loss(embeddings, labels)
    (beta_gradient,) = torch.autograd.grad(value, loss.beta)
    assert (beta_gradient[:3] == 0).all() and (beta_gradient[3:] != 0).any()


def test_beta_is_a_parameter_unless_fixed() -> None:
    learnable = losses.build("margin", num_classes=10)
    assert [p.shape for p in losses.loss_parameters(learnable)] == [torch.Size([1])]
    assert float(learnable.beta.detach()) == pytest.approx(1.2)
    per_class = losses.build("margin", num_classes=10, beta_per_class=True, beta=0.6)
    assert per_class.beta.shape == (10,) and torch.allclose(per_class.beta, torch.tensor(0.6))
    fixed = losses.build("margin", num_classes=10, learn_beta=False)
    assert losses.loss_parameters(fixed) == [] and "beta" in dict(fixed.named_buffers())


def test_gradcheck_embeddings_and_beta() -> None:
    embeddings, labels = random_batch(8, 4, 3, seed=5)
    assert loss_gradcheck(losses.build("margin", num_classes=3, nu=0.05), embeddings, labels)
    triplets = mining.build("random")(embeddings, labels)
    per_class = losses.build("margin", num_classes=3, beta_per_class=True, beta=0.9, nu=0.05)
    assert loss_gradcheck(per_class, embeddings, labels, triplets)


def test_degenerate_inputs_and_bf16_stay_finite() -> None:
    loss = losses.build("margin", num_classes=4, beta_per_class=True, nu=0.01).double()
    check_degenerate_inputs(lambda e, y: loss(e, y))
    check_tuple_loss_bf16(loss.float(), seed=6, rtol=3e-2, atol=3e-2)


def test_empty_tuple_sets_give_a_zero_that_keeps_the_graph() -> None:
    embeddings, labels = random_batch(6, 4, 2, seed=7)
    loss = losses.build("margin", num_classes=2).double()
    check_empty_tuple_sets_keep_graph(loss, embeddings, labels)
    value = loss(embeddings, labels, empty_pairs())
    (beta_gradient,) = torch.autograd.grad(value, loss.beta)
    assert beta_gradient.item() == 0.0


@pytest.mark.parametrize("per_class", [False, True])
def test_cross_check_with_pytorch_metric_learning(per_class: bool) -> None:
    # PML MarginLoss works per triplet: margin_loss_t = [d_ap - beta + m]_+ + [beta - d_an + m]_+,
    # beta_reg_loss = nu * beta (global: added once; per class: nu * beta_{y_a} per triplet).
    # Ours averages over pairs, each triplet giving two pairs with nu * beta each. With
    # DoNothingReducer: ours = mean_t(margin_loss) / 2 + (nu * beta if global else mean_t(beta_reg_loss)).
    # PML's default DivisorReducer divides by the non-zero pair count instead (Wu et al.'s choice).
    embeddings, labels = random_batch(16, 8, 4, seed=8)
    triplets = mining.build("distance_weighted", generator=torch.Generator().manual_seed(9))(embeddings, labels)
    indices = (triplets.anchors, triplets.positives, triplets.negatives)
    nu = 0.1
    pml = pml_losses.MarginLoss(
        margin=0.2, nu=nu, beta=1.2, learn_beta=True, num_classes=4 if per_class else None,
        distance=LpDistance(normalize_embeddings=False), reducer=pml_reducers.DoNothingReducer(),
    ).double()
    ours = losses.build("margin", num_classes=4, beta_per_class=per_class, nu=nu).double()
    with torch.no_grad():
        values = torch.linspace(0.7, 1.3, len(ours.beta), dtype=torch.float64)
        ours.beta.copy_(values)
        pml.beta.copy_(values)

    x = embeddings.clone().requires_grad_(True)
    value = ours(x, labels, triplets)
    gradient, beta_gradient = torch.autograd.grad(value, [x, ours.beta])

    x_pml = embeddings.clone().requires_grad_(True)
    terms = pml(x_pml, labels, indices)
    regularizer = terms["beta_reg_loss"]["losses"]
    expected = terms["margin_loss"]["losses"].mean() / 2 + (regularizer.mean() if per_class else regularizer.sum())
    expected_gradient, expected_beta_gradient = torch.autograd.grad(expected, [x_pml, pml.beta])
    torch.testing.assert_close(value, expected, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(gradient, expected_gradient, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(beta_gradient, expected_beta_gradient, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize(
    ("hparams", "parameter"),
    [
        ({"margin": -0.1}, "margin"),
        ({"nu": -1.0}, "nu"),
        ({"beta": -0.5}, "beta"),
        ({"alpha": 0.2}, "alpha"),
    ],
)
def test_bad_hyper_parameters_name_the_parameter(hparams: dict, parameter: str) -> None:
    with pytest.raises(UserInputError, match=parameter):
        losses.build("margin", num_classes=3, **hparams)


def test_per_class_beta_needs_num_classes_and_valid_labels() -> None:
    with pytest.raises(UserInputError, match="num_classes"):
        MarginLoss(beta_per_class=True)
    with pytest.raises(UserInputError, match="num_classes"):
        losses.build("margin", beta_per_class=True)
    embeddings, _ = random_batch(4, 4, 2, seed=10)
    loss = losses.build("margin", num_classes=3, beta_per_class=True)
    with pytest.raises(UserInputError, match="num_classes"):
        loss(embeddings, torch.tensor([0, 1, 2, 3]))
