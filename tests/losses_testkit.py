"""Shared helpers for loss and miner tests: random batches, gradcheck, degenerate inputs, and the
checks that a whole family of losses shares (class-weight, batch-wise pair/list and tuple losses).

Append new helpers at the end; do not rewrite helpers others rely on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
import torch
from torch import Tensor

from dmlbench import losses, mining
from dmlbench.errors import UserInputError
from dmlbench.mining.tuples import (
    Pairs,
    Triplets,
    Tuples,
    all_pairs,
    to_pairs,
    to_triplets,
)

LossFn = Callable[[Tensor, Tensor], Tensor]


def random_labels(batch_size: int, num_classes: int, seed: int = 0, samples_per_class: int | None = None) -> Tensor:
    """Labels in ``[0, num_classes)``; with ``samples_per_class`` a shuffled SPC-n style batch."""
    generator = torch.Generator().manual_seed(seed)
    if samples_per_class is None:
        return torch.randint(0, num_classes, (batch_size,), generator=generator)
    classes = torch.randperm(num_classes, generator=generator)[: batch_size // samples_per_class]
    labels = classes.repeat_interleave(samples_per_class)
    return labels[torch.randperm(len(labels), generator=generator)]


def random_embeddings(
    batch_size: int, dim: int, seed: int = 0, dtype: torch.dtype = torch.float64, normalize: bool = True
) -> Tensor:
    """Gaussian embeddings, L2-normalised by default (what the model head returns)."""
    generator = torch.Generator().manual_seed(seed)
    embeddings = torch.randn(batch_size, dim, generator=generator, dtype=dtype)
    if normalize:
        embeddings = torch.nn.functional.normalize(embeddings, dim=1)
    return embeddings


def random_batch(
    batch_size: int = 12,
    dim: int = 8,
    num_classes: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    normalize: bool = True,
    samples_per_class: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``(embeddings, labels)`` for a random batch."""
    labels = random_labels(batch_size, num_classes, seed=seed, samples_per_class=samples_per_class)
    embeddings = random_embeddings(len(labels), dim, seed=seed + 1, dtype=dtype, normalize=normalize)
    return embeddings, labels


def loss_gradcheck(
    loss: torch.nn.Module, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None, **kwargs: float
) -> bool:
    """``torch.autograd.gradcheck`` in float64 w.r.t. the embeddings and the loss's own trainable parameters."""
    loss = loss.double()
    names = [name for name, p in loss.named_parameters() if p.requires_grad]
    parameters = [p.detach().clone().requires_grad_(True) for name, p in loss.named_parameters() if p.requires_grad]

    def evaluate(x: Tensor, *params: Tensor) -> Tensor:
        return torch.func.functional_call(loss, dict(zip(names, params)), (x, labels, tuples))

    embeddings = embeddings.detach().double().requires_grad_(True)
    options = {"eps": 1e-6, "atol": 1e-5, "rtol": 1e-4, **kwargs}
    return torch.autograd.gradcheck(evaluate, (embeddings, *parameters), **options)


def assert_finite_loss_and_grad(loss_fn: LossFn, embeddings: Tensor, labels: Tensor) -> Tensor:
    """Evaluate ``loss_fn(embeddings, labels)``; the value and every gradient must be finite."""
    embeddings = embeddings.detach().clone().requires_grad_(True)
    value = loss_fn(embeddings, labels)
    assert value.dim() == 0, f"loss must be a scalar, got shape {tuple(value.shape)}"
    assert torch.isfinite(value).all(), f"loss is not finite: {value}"
    assert value.requires_grad, "loss lost its autograd graph"
    (gradient,) = torch.autograd.grad(value, embeddings, allow_unused=True)
    if gradient is not None:
        assert torch.isfinite(gradient).all(), "gradient is not finite"
    return value.detach()


def degenerate_batches(dim: int = 8, dtype: torch.dtype = torch.float64) -> dict[str, tuple[Tensor, Tensor]]:
    """Named batches that break naive implementations (sqrt at 0, acos at +-1, empty sets)."""
    constant = torch.nn.functional.normalize(torch.ones(1, dim, dtype=dtype), dim=1)  # zero variance across dims
    unit = random_embeddings(1, dim, seed=11, dtype=dtype)
    four = torch.tensor([0, 0, 1, 1])
    random_unit, random_labels_ = random_batch(8, dim, 3, seed=7, dtype=dtype)
    return {
        "identical_embeddings": (unit.repeat(4, 1), four),
        "identical_constant_embeddings": (constant.repeat(4, 1), four),
        "cos_plus_minus_one": (torch.cat([unit, unit, -unit, -unit]), four),
        "one_class": (random_unit[:6], torch.zeros(6, dtype=torch.long)),
        "no_positive_pairs": (random_unit[:4], torch.arange(4)),
        "mixed_random": (random_unit, random_labels_),
    }


def check_degenerate_inputs(loss_fn: LossFn, dim: int = 8) -> dict[str, Tensor]:
    """Run ``loss_fn`` on every degenerate batch; values and gradients must be finite."""
    return {name: assert_finite_loss_and_grad(loss_fn, e, l) for name, (e, l) in degenerate_batches(dim).items()}


def check_bf16_autocast(loss_fn: LossFn, embeddings: Tensor, labels: Tensor) -> Tensor:
    """The loss under CPU bf16 autocast must be finite with finite gradients."""
    embeddings = embeddings.detach().float().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss_fn(embeddings, labels)
    assert torch.isfinite(value).all(), f"bf16 loss is not finite: {value}"
    (gradient,) = torch.autograd.grad(value.float(), embeddings, allow_unused=True)
    if gradient is not None:
        assert torch.isfinite(gradient).all(), "bf16 gradient is not finite"
    return value.detach().float()


def check_empty_tuples_keep_graph(loss: torch.nn.Module, embeddings: Tensor, labels: Tensor, empty: Tuples) -> None:
    """An empty tuple set gives exactly 0 with an autograd graph (zero gradients)."""
    embeddings = embeddings.detach().clone().requires_grad_(True)
    value = loss(embeddings, labels, empty)
    assert value.dim() == 0 and float(value.detach()) == 0.0
    assert value.requires_grad
    (gradient,) = torch.autograd.grad(value, embeddings, allow_unused=True)
    assert gradient is None or torch.count_nonzero(gradient) == 0


# --- Helpers for the batch-wise pair/list losses (appended) -------------------------------------


def random_pair_subset(labels: Tensor, keep: float = 0.5, seed: int = 0) -> Pairs:
    """A random subset of the batch's ordered positive and negative pairs, as a miner might return."""
    pairs = all_pairs(labels)
    generator = torch.Generator().manual_seed(seed)
    keep_positive = torch.rand(len(pairs.positive_anchors), generator=generator) < keep
    keep_negative = torch.rand(len(pairs.negative_anchors), generator=generator) < keep
    return Pairs(
        pairs.positive_anchors[keep_positive],
        pairs.positives[keep_positive],
        pairs.negative_anchors[keep_negative],
        pairs.negatives[keep_negative],
    )


def empty_pairs() -> Pairs:
    """A mined pair set with nothing in it."""
    empty = torch.empty(0, dtype=torch.long)
    return Pairs(empty, empty, empty, empty)


def pair_lists(pairs: Pairs) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Plain Python ``(positive_pairs, negative_pairs)`` of a ``Pairs`` object, for loop references."""
    positive = list(zip(pairs.positive_anchors.tolist(), pairs.positives.tolist()))
    negative = list(zip(pairs.negative_anchors.tolist(), pairs.negatives.tolist()))
    return positive, negative


def all_pair_lists(labels: list[int]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Every ordered positive pair (i != j) and every ordered negative pair, as Python lists."""
    size = len(labels)
    positive = [(i, j) for i in range(size) for j in range(size) if i != j and labels[i] == labels[j]]
    negative = [(i, j) for i in range(size) for j in range(size) if labels[i] != labels[j]]
    return positive, negative


def given_or_all_pairs(
    labels: list[int],
    positive_pairs: Iterable[tuple[int, int]] | None,
    negative_pairs: Iterable[tuple[int, int]] | None,
) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """The pairs a loop reference uses: the given ones as sets, each ``None`` replaced by every
    ordered positive (``i != j``) or negative pair of the batch."""
    every_positive, every_negative = all_pair_lists(labels)
    positive = every_positive if positive_pairs is None else positive_pairs
    negative = every_negative if negative_pairs is None else negative_pairs
    return set(positive), set(negative)


def rows(embeddings: Tensor) -> list[list[float]]:
    """Embeddings as Python lists of floats (float64), for loop references."""
    return embeddings.detach().double().tolist()


def py_dot(u: list[float], v: list[float]) -> float:
    return sum(a * b for a, b in zip(u, v))


def py_unit(u: list[float]) -> list[float]:
    norm = py_dot(u, u) ** 0.5
    return [a / norm for a in u]


def py_distance(u: list[float], v: list[float]) -> float:
    return sum((a - b) ** 2 for a, b in zip(u, v)) ** 0.5


def tensor_distance(u: Tensor, v: Tensor) -> Tensor:
    """Euclidean distance of two vectors, differentiable for loop references of tuple losses."""
    return torch.sqrt(((u - v) ** 2).sum())


def value_and_gradient(loss_fn: LossFn, embeddings: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """``(loss, d loss / d embeddings)`` of ``loss_fn`` at ``embeddings``."""
    embeddings = embeddings.detach().clone().requires_grad_(True)
    value = loss_fn(embeddings, labels)
    (gradient,) = torch.autograd.grad(value, embeddings)
    return value.detach(), gradient


def numerical_gradient(function: Callable[[Tensor], float], x: Tensor, eps: float = 1e-6) -> Tensor:
    """Central finite differences of a scalar ``function`` of ``x`` (float64)."""
    x = x.detach().double()
    gradient = torch.zeros_like(x)
    flat = gradient.view(-1)
    for index in range(x.numel()):
        step = torch.zeros_like(x).view(-1)
        step[index] = eps
        step = step.view_as(x)
        flat[index] = (function(x + step) - function(x - step)) / (2 * eps)
    return gradient


def check_permutation_invariance(loss_fn: LossFn, embeddings: Tensor, labels: Tensor, seed: int = 0) -> None:
    """Shuffling the batch (embeddings and labels together) must not change the loss."""
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    original = loss_fn(embeddings, labels)
    shuffled = loss_fn(embeddings[order], labels[order])
    torch.testing.assert_close(shuffled, original, rtol=1e-10, atol=1e-12)


def empty_triplets() -> Triplets:
    """A mined set with no triplets (e.g. a semihard window that is empty everywhere)."""
    empty = torch.empty(0, dtype=torch.long)
    return Triplets(empty, empty.clone(), empty.clone())


def triplet_set(triplets: Triplets) -> set[tuple[int, int, int]]:
    """Triplets as a set of ``(anchor, positive, negative)`` index tuples."""
    return set(zip(triplets.anchors.tolist(), triplets.positives.tolist(), triplets.negatives.tolist()))


def pair_sets(pairs: Pairs) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """Pairs as ``(positive pairs, negative pairs)`` sets of index tuples."""
    return (
        set(zip(pairs.positive_anchors.tolist(), pairs.positives.tolist())),
        set(zip(pairs.negative_anchors.tolist(), pairs.negatives.tolist())),
    )


def check_class_loss_contract(name: str, **hparams: object) -> None:
    """What every loss with class weights must do: ``losses.build`` demands ``num_classes`` and
    ``embedding_dim``, the weights are seeded parameters the optimiser can see, and bad labels,
    dimensions, class counts or hyper-parameter names raise a ``UserInputError`` naming them."""
    with pytest.raises(UserInputError, match="num_classes"):
        losses.build(name, embedding_dim=8, **hparams)
    with pytest.raises(UserInputError, match="embedding_dim"):
        losses.build(name, num_classes=4, **hparams)
    with pytest.raises(UserInputError, match="num_classes"):
        losses.build(name, num_classes=1, embedding_dim=8, **hparams)
    with pytest.raises(UserInputError, match="no_such_option"):
        losses.build(name, num_classes=4, embedding_dim=8, no_such_option=1, **hparams)

    loss = losses.build(name, num_classes=4, embedding_dim=8, **hparams)
    # An empty batch is no error: a zero (SoftTriple: its batch-independent regulariser) that keeps the graph.
    value = loss(torch.zeros(0, 8, requires_grad=True), torch.zeros(0, dtype=torch.long))
    assert value.dim() == 0 and torch.isfinite(value) and value.requires_grad
    parameters = losses.loss_parameters(loss)
    assert parameters and all(isinstance(p, torch.nn.Parameter) for p in parameters)
    same_seed = losses.build(name, num_classes=4, embedding_dim=8, **hparams)
    other_seed = losses.build(name, num_classes=4, embedding_dim=8, **{**hparams, "seed": 1})
    for mine, same, other in zip(loss.parameters(), same_seed.parameters(), other_seed.parameters()):
        assert torch.equal(mine, same)
        assert not torch.equal(mine, other)

    # Properties: the embeddings are normalised inside (positive rescaling changes nothing) and the
    # reduction is a mean or sum over the batch (its order changes nothing).
    embeddings, labels = random_batch(10, 8, 4, seed=11, normalize=False)
    scales = torch.rand(10, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 10 + 0.1
    loss64 = losses.build(name, num_classes=4, embedding_dim=8, **hparams).double()
    torch.testing.assert_close(loss64(embeddings * scales, labels), loss64(embeddings, labels), rtol=1e-10, atol=1e-12)
    check_permutation_invariance(loss64, embeddings, labels)

    embeddings, labels = random_batch(6, 8, 4, dtype=torch.float32)
    with pytest.raises(UserInputError, match="num_classes"):
        loss(embeddings, torch.tensor([0, 1, 2, 3, 4, 0]))
    with pytest.raises(UserInputError, match="num_classes"):
        loss(embeddings, torch.tensor([0, 1, 2, 3, -1, 0]))
    with pytest.raises(UserInputError, match="embedding_dim"):
        loss(embeddings[:, :5], labels)
    with pytest.raises(UserInputError, match="labels"):
        loss(embeddings, labels[:5])


# --- Checks shared by a whole family of losses (appended) ----------------------------------------


def check_bad_hyper_parameters(name: str, bad: dict[str, Iterable[object]], **fixed: object) -> None:
    """Building loss ``name`` (with the ``fixed`` options) with any of the ``bad`` values of a
    parameter raises a ``UserInputError`` whose message names the parameter."""
    for parameter, values in bad.items():
        for value in values:
            with pytest.raises(UserInputError, match=parameter):
                losses.build(name, **fixed, **{parameter: value})


# What a float64 loop reference of a tuple loss must match: value (rtol, atol) and embedding gradient.
LOOP_REFERENCE_TOLERANCES = {"value_tol": (1e-10, 1e-12), "gradient_tol": (1e-8, 1e-10)}


def assert_same_value_and_gradient(
    loss_fn: LossFn,
    expected_fn: LossFn,
    embeddings: Tensor,
    labels: Tensor,
    *,
    scale: float = 1.0,
    value_tol: tuple[float, float] = (1e-9, 1e-12),
    gradient_tol: tuple[float, float] = (1e-7, 1e-10),
) -> Tensor:
    """``loss_fn = scale * expected_fn`` on the batch, in value and in the gradient w.r.t. the
    embeddings (tolerances as ``(rtol, atol)``); returns the value.

    Both sides are backpropagated, so loss modules are left with the gradients of their own
    parameters in ``.grad`` for the caller to compare."""
    x = embeddings.detach().clone().requires_grad_(True)
    x_expected = embeddings.detach().clone().requires_grad_(True)
    value, expected = loss_fn(x, labels), expected_fn(x_expected, labels)
    torch.testing.assert_close(value, scale * expected, rtol=value_tol[0], atol=value_tol[1])
    value.backward()
    expected.backward()
    torch.testing.assert_close(x.grad, scale * x_expected.grad, rtol=gradient_tol[0], atol=gradient_tol[1])
    return value.detach()


def check_class_loss_degenerate_and_bf16(name: str, bf16_atol: float, **hparams: object) -> None:
    """Loss ``name`` with class weights (4 classes, 8 dimensions) is finite on every degenerate
    batch (float64), and under bf16 autocast finite and within rtol 0.05 / ``bf16_atol`` of float32."""
    loss = losses.build(name, num_classes=4, embedding_dim=8, **hparams)
    check_degenerate_inputs(lambda e, l: loss.double()(e, l))
    embeddings, labels = random_batch(12, 8, 4, seed=1, dtype=torch.float32)
    value = check_bf16_autocast(loss.float(), embeddings, labels)
    torch.testing.assert_close(value, loss(embeddings, labels).detach(), rtol=0.05, atol=bf16_atol)


def check_pair_loss_degenerate_bf16_and_empty_pairs(
    loss: torch.nn.Module, *, normalize: bool = True, rel: float | None = None, abs: float | None = None
) -> dict[str, Tensor]:
    """What every batch-wise pair/list loss must do: stay finite on the degenerate batches (whose
    values are returned for the loss's own expectations), give under bf16 autocast a value within
    ``pytest.approx(rel, abs)`` of float32, and give a graph-keeping 0 for an empty pair set."""
    values = check_degenerate_inputs(loss)
    embeddings, labels = random_batch(12, 8, 3, seed=7, normalize=normalize)
    bf16 = check_bf16_autocast(loss, embeddings, labels)
    assert float(bf16) == pytest.approx(float(loss(embeddings, labels)), rel=rel, abs=abs)
    check_empty_tuples_keep_graph(loss, embeddings, labels, empty_pairs())
    return values


def check_tuple_loss_bf16(loss: torch.nn.Module, seed: int, rtol: float, atol: float) -> None:
    """A tuple-based loss under bf16 autocast is finite and within ``rtol``/``atol`` of float32 on
    a random 16-sample batch of 4 classes."""
    embeddings, labels = random_batch(16, 8, 4, seed=seed)
    bf16 = check_bf16_autocast(loss, embeddings, labels)
    torch.testing.assert_close(bf16, loss(embeddings.float(), labels).detach(), rtol=rtol, atol=atol)


def check_empty_tuple_sets_keep_graph(loss: torch.nn.Module, embeddings: Tensor, labels: Tensor) -> None:
    """Both an empty pair set and an empty triplet set give exactly 0 with an autograd graph."""
    check_empty_tuples_keep_graph(loss, embeddings, labels, empty_pairs())
    check_empty_tuples_keep_graph(loss, embeddings, labels, empty_triplets())


def mined_tuples(
    kind: str, embeddings: Tensor, labels: Tensor, *, keep: float, pair_seed: int, miner_seed: int
) -> Tuples | None:
    """The tuples a loss test feeds: ``None`` for ``"all"``, a random pair subset (``keep``,
    ``pair_seed``) for ``"pairs"``, otherwise what miner ``kind`` (seeded ``miner_seed``) returns."""
    if kind == "all":
        return None
    if kind == "pairs":
        return random_pair_subset(labels, keep=keep, seed=pair_seed)
    return mining.build(kind, generator=torch.Generator().manual_seed(miner_seed))(embeddings, labels)


def all_valid_triplets(labels: list[int]) -> list[tuple[int, int, int]]:
    """Every ``(a, p, n)`` with ``a != p``, ``y_a == y_p`` and ``y_n != y_a``, in index order."""
    indices = range(len(labels))
    return [
        (a, p, n) for a in indices for p in indices for n in indices if a != p and labels[a] == labels[p] != labels[n]
    ]


def reference_triplets(labels: Tensor, tuples: Tuples | None) -> list[tuple[int, int, int]]:
    """The triplets a triplet-based loss sums over: every valid one without tuples, else ``tuples`` as triplets."""
    if tuples is None:
        return all_valid_triplets(labels.tolist())
    triplets = to_triplets(tuples)
    return list(zip(triplets.anchors.tolist(), triplets.positives.tolist(), triplets.negatives.tolist()))


def reference_pairs(labels: Tensor, tuples: Tuples | None) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The ``(positive, negative)`` pairs a pair-based loss sums over: every one without tuples,
    else ``tuples`` as pairs."""
    if tuples is None:
        return all_pair_lists(labels.tolist())
    return pair_lists(to_pairs(tuples))
