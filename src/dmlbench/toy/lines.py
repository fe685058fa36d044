"""The 2-D line data of the toy example (Roth et al. 2020, Fig. 6 and supp. G / Fig. 12).

Each split has four classes ("lines") of 15 points drawn uniformly at random along a straight
segment (positions from the run's generator, so each seed has its own sample; no noise off the
line). All points lie in the square [-1.25, 1.25]^2. Random rather than evenly spaced positions keep the
test lines from being aligned point by point: a model blind to the feature that separates the test
classes then finds its nearest neighbours at random among them (Recall@1 near chance) instead of
exactly on the neighbouring line (Recall@1 = 0).

* ``axes`` (supp. Fig. 12): the training lines are vertical, ``x = c`` for
  ``c in (-0.75, -0.25, 0.25, 0.75)``, ``y`` from -1 to 1, so the training classes differ only in
  ``x``. The test lines are the same segments turned horizontal (``y = c``, ``x`` from -1 to 1):
  they differ only in ``y``, which varies inside every training class but never separates two of them.
* ``diagonal`` (Fig. 6): the training lines are four parallel diagonal segments along
  ``u = (1, 1)/sqrt 2``, at offsets ``c in (-0.75, -0.25, 0.25, 0.75)`` along ``v = (-1, 1)/sqrt 2``,
  ``u`` from -1 to 1; they differ only in ``v``. The four test lines are short segments along the
  other diagonal ``v``, in a 2 x 2 grid: at ``u = -0.5`` and ``u = 0.5``, each with one segment
  ``v in [-0.75, -0.1]`` and one ``v in [0.1, 0.75]``. Two test lines in different ``v`` halves
  differ in the feature the training labels need (``v``); two in the same half differ only in
  ``u``, a feature the training data show (it varies within every training class) but the
  training labels never ask for. A model that compresses ``u`` away separates some test classes
  but not all of them, as in the caption of Fig. 6; it collapses all of them in ``axes``.

Recall@1 is invariant to the scale of the embedding, so a feature the model keeps only faintly still
orders the neighbours; each test line therefore varies along the trained feature (``x`` in ``axes``,
``v`` in ``diagonal``), which makes a model that is blind to the test feature mix up the test classes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from dmlbench.errors import UserInputError

VARIANTS = ("diagonal", "axes")
SAMPLES_PER_LINE = 15
OFFSETS = (-0.75, -0.25, 0.25, 0.75)


@dataclass(frozen=True)
class LineData:
    """Training and test points ``[60, 2]`` (float32) with labels ``[60]`` (int64, classes 0-3 each)."""

    variant: str
    train_points: Tensor
    train_labels: Tensor
    test_points: Tensor
    test_labels: Tensor


def check_variant(variant: object) -> str:
    if variant not in VARIANTS:
        raise UserInputError(f"unknown toy variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    return str(variant)


def _segment(start: tuple[float, float], end: tuple[float, float], generator: torch.Generator) -> Tensor:
    t = torch.rand(SAMPLES_PER_LINE, 1, generator=generator, dtype=torch.float64).sort(dim=0).values
    return (1 - t) * torch.tensor(start, dtype=torch.float64) + t * torch.tensor(end, dtype=torch.float64)


def _stack(segments: list[Tensor]) -> tuple[Tensor, Tensor]:
    points = torch.cat(segments).to(torch.float32)
    labels = torch.arange(len(segments)).repeat_interleave(SAMPLES_PER_LINE)
    return points, labels


def _rotated(u_from: float, v_from: float, u_to: float, v_to: float, generator: torch.Generator) -> Tensor:
    """The segment from ``u_from * u + v_from * v`` to ``u_to * u + v_to * v`` (``u``, ``v`` the two diagonals)."""
    root = math.sqrt(0.5)
    point = lambda a, b: (root * (a - b), root * (a + b))  # noqa: E731  a * (1, 1)/sqrt 2 + b * (-1, 1)/sqrt 2
    return _segment(point(u_from, v_from), point(u_to, v_to), generator)


def make_lines(variant: str, generator: torch.Generator) -> LineData:
    """The four training and four test lines of ``variant`` (``diagonal`` or ``axes``), points drawn from ``generator``."""
    variant = check_variant(variant)
    if variant == "axes":
        train = [_segment((c, -1.0), (c, 1.0), generator) for c in OFFSETS]
        test = [_segment((-1.0, c), (1.0, c), generator) for c in OFFSETS]
    else:
        train = [_rotated(-1.0, c, 1.0, c, generator) for c in OFFSETS]
        halves = ((-0.75, -0.1), (0.1, 0.75))
        test = [_rotated(u, v_from, u, v_to, generator) for u in (-0.5, 0.5) for v_from, v_to in halves]
    train_points, train_labels = _stack(train)
    test_points, test_labels = _stack(test)
    return LineData(variant, train_points, train_labels, test_points, test_labels)
