"""rho-regularisation: switch tuple negatives to samples of the anchor's own class (Roth et al. 2020 sec. 5.1)."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.distances import same_label_mask
from dmlbench.mining.draw import draw_from_masks, uniform
from dmlbench.mining.tuples import Pairs, Triplets, Tuples


def switch_negatives(tuples: Tuples, labels: Tensor, p_switch: float, generator: torch.Generator) -> Tuples:
    """rho-regularisation, Roth et al. 2020 sec. 5.1: negatives switched to classmates with probability ``p_switch``.

    Each tuple whose anchor has a classmate in the batch is switched independently with probability
    ``p_switch`` (per tuple; for the one-tuple-per-anchor miners of the paper that is per anchor).
    The replacement negative is drawn uniformly from the anchor's class without the anchor, so the
    loss, which trusts the roles of the tuple and treats it as a negative, pushes two samples of
    one class apart.

    * ``Triplets``: ``(a, p, n)`` becomes ``(a, a, s)``. The positive becomes the anchor itself
      (distance 0), as in the authors' reference miner (``rho_distance``): the switched triplet
      is then a pure push of ``s`` away from ``a``. Keeping ``p`` would let a triplet loss pull
      ``p`` in as much as it pushes ``s`` out, and with two samples per class (``s == p``) the
      triplet ``(a, p, p)`` would carry no gradient at all.
    * ``Pairs``: each negative pair ``(a, n)`` becomes ``(a, s)``; positive pairs are untouched.
      Pairs stay pairs, so pair losses (contrastive, margin) see as many pairs as without rho.
    """
    if p_switch == 0 or len(tuples) == 0:
        return tuples
    classmates = same_label_mask(labels) & ~torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    if isinstance(tuples, Triplets):
        anchors, switched, replacements = _draw_switches(tuples.anchors, classmates, p_switch, generator)
        positives = tuples.positives.clone()
        negatives = tuples.negatives.clone()
        positives[switched] = anchors[switched]
        negatives[switched] = replacements
        return Triplets(anchors, positives, negatives)
    anchors, switched, replacements = _draw_switches(tuples.negative_anchors, classmates, p_switch, generator)
    negatives = tuples.negatives.clone()
    negatives[switched] = replacements
    return Pairs(tuples.positive_anchors, tuples.positives, anchors, negatives)


def _draw_switches(
    anchors: Tensor, classmates: Tensor, p_switch: float, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """``(anchors, switched tuple indices, replacement negatives)``: one coin per tuple, one classmate per switch."""
    coins = uniform(len(anchors), generator, anchors.device) < p_switch
    switched = (coins & classmates[anchors].any(dim=1)).nonzero().squeeze(1)
    replacements = draw_from_masks(classmates[anchors[switched]], generator)
    return anchors, switched, replacements
