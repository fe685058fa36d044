"""Structured clustering with the facility-location objective (Song et al. 2017)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from dmlbench.distances import euclidean, same_label_mask
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.mining.base import check_batch
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_flag, check_non_negative


def batched_nmi(predicted: Tensor, truth: Tensor) -> Tensor:
    """NMI (arithmetic normalisation, sklearn's default) of each row of ``predicted`` against ``truth``.

    ``predicted`` is ``[n, b]`` with cluster ids ``>= 0``, ``truth`` ``[b]`` with ids in ``[0, K)``;
    returns ``[n]`` in float64. Limit cases as sklearn: both single-cluster gives 1, zero mutual
    information gives 0.
    """
    rows, size = predicted.shape
    num_true = int(truth.max()) + 1
    ones = torch.ones(predicted.shape, dtype=torch.float64, device=predicted.device)
    # Count only the (cluster, class) cells some row occupies, renumbered densely without sorting.
    cell_ids = predicted * num_true + truth.unsqueeze(0)
    occupied = torch.zeros(int(cell_ids.max()) + 1, dtype=torch.bool, device=predicted.device)
    occupied[cell_ids.reshape(-1)] = True
    cell_index = (torch.cumsum(occupied, dim=0) - 1)[cell_ids]
    joint = torch.zeros(rows, int(occupied.sum()), dtype=torch.float64, device=predicted.device)
    joint.scatter_add_(1, cell_index, ones)
    cluster_sizes = torch.zeros(rows, int(predicted.max()) + 1, dtype=torch.float64, device=predicted.device)
    cluster_sizes.scatter_add_(1, predicted, ones)
    class_sizes = torch.bincount(truth, minlength=num_true).to(torch.float64)

    def sum_n_log_n(counts: Tensor) -> Tensor:
        return torch.special.xlogy(counts, counts).sum(dim=-1)

    # With counts n: N * MI = sum n_pk log n_pk - sum n_p log n_p - sum n_k log n_k + N log N and
    # N * H = N log N - sum n log n, which needs no per-cell marginals.
    total = sum_n_log_n(torch.tensor(float(size), dtype=torch.float64))
    clusters_term, classes_term = sum_n_log_n(cluster_sizes), sum_n_log_n(class_sizes)
    mutual_information = ((sum_n_log_n(joint) - clusters_term - classes_term + total) / size).clamp_min(0.0)
    entropy_predicted, entropy_true = (total - clusters_term) / size, (total - classes_term) / size
    normaliser = (entropy_predicted + entropy_true) / 2
    nmi = torch.where(mutual_information > 0, mutual_information / normaliser.clamp_min(1e-300), 0.0)
    single_cluster = ((cluster_sizes > 0).sum(dim=1) == 1) & (int((class_sizes > 0).sum()) == 1)
    return torch.where(single_cluster, 1.0, nmi)


def nmi_after_moves(base: Tensor, truth: Tensor, moved: Tensor) -> Tensor:
    """``batched_nmi`` of each row's clustering: ``base`` with the points ``moved[r]`` taken into one new
    cluster (``base`` ``[b]`` cluster ids ``>= 0``, ``truth`` ``[b]`` in ``[0, K)``, ``moved`` ``[n, b]`` bool).

    Equal to ``batched_nmi(torch.where(moved, new_id, base), truth)`` up to round-off, at the cost of
    the moved points only (a few per row in the greedy and the swaps, not ``b``): a move changes the
    ``sum n log n`` terms of the cells and clusters it touches and nothing else.
    """
    rows, size = moved.shape
    dtype = torch.float64
    num_true, num_base = int(truth.max()) + 1, int(base.max()) + 1
    cell = base * num_true + truth
    row, point = moved.nonzero(as_tuple=True)
    # Clusters and the new cluster's cells are few enough to count densely per row; the (row, cell)
    # pairs the moves leave are counted sparsely. N * MI = sum n_pk log n_pk - sum n_p log n_p
    # - sum n_k log n_k + N log N (see batched_nmi).
    cluster_sizes = torch.bincount(base, minlength=num_base).to(dtype)
    leaving = torch.bincount(row * num_base + base[point], minlength=rows * num_base).view(rows, num_base)
    remaining = cluster_sizes - leaving
    arriving = torch.bincount(row * num_true + truth[point], minlength=rows * num_true).view(rows, num_true).to(dtype)
    moved_count = arriving.sum(dim=1)
    clusters_term = torch.special.xlogy(remaining, remaining).sum(dim=1) + torch.special.xlogy(moved_count, moved_count)
    cell_sizes = torch.bincount(cell, minlength=num_base * num_true).to(dtype)
    keys, taken = torch.unique(row * len(cell_sizes) + cell[point], return_counts=True)
    before = cell_sizes[keys % len(cell_sizes)]
    change = torch.special.xlogy(before - taken, before - taken) - torch.special.xlogy(before, before)
    cells_term = torch.special.xlogy(cell_sizes, cell_sizes).sum() + torch.special.xlogy(arriving, arriving).sum(dim=1)
    cells_term = cells_term.index_add_(0, keys // len(cell_sizes), change)
    class_sizes = torch.bincount(truth, minlength=num_true).to(dtype)
    classes_term = torch.special.xlogy(class_sizes, class_sizes).sum()
    total = size * math.log(size)
    mutual_information = ((cells_term - clusters_term - classes_term + total) / size).clamp_min(0.0)
    entropy_predicted, entropy_true = (total - clusters_term) / size, (total - classes_term) / size
    normaliser = (entropy_predicted + entropy_true) / 2
    nmi = torch.where(mutual_information > 0, mutual_information / normaliser.clamp_min(1e-300), 0.0)
    num_clusters = (remaining > 0).sum(dim=1) + (moved_count > 0).long()
    single_cluster = (num_clusters == 1) & (int((class_sizes > 0).sum()) == 1)
    return torch.where(single_cluster, 1.0, nmi)


def greedy_loss_augmented_medoids(distances: Tensor, class_index: Tensor, margin_multiplier: float) -> Tensor:
    """Greedy maximiser of ``F(X, S) + gamma (1 - NMI(g(S), y))`` over ``|S| = |Y|`` (Song et al. 2017).

    The loss-augmented inference of eq. 11: adds one medoid at a time, the one with the best augmented
    score (ties: lowest index). Returns the medoid indices in the order they were chosen, which is
    also the order ``assign_to_medoids`` uses to break distance ties.
    """
    batch = len(class_index)
    nearest = torch.full((batch,), float("inf"), dtype=distances.dtype, device=distances.device)
    assignment = torch.zeros(batch, dtype=torch.long, device=distances.device)
    available = torch.ones(batch, dtype=torch.bool, device=distances.device)
    chosen: list[int] = []
    for step in range(int(class_index.max()) + 1):
        # Row j: the facility location after adding candidate j as medoid number `step`.
        energy = -torch.minimum(nearest.unsqueeze(0), distances).sum(dim=1).double()
        energy = energy.masked_fill(~available, float("-inf"))
        # 1 - NMI lies in [0, 1], so a candidate more than gamma below the best energy cannot win:
        # the NMI (the expensive part) is only needed for the others. The slack covers round-off.
        best_energy = energy.max()
        bound = best_energy - margin_multiplier - 1e-9 * (best_energy.abs() + 1.0)
        contenders = (energy >= bound).nonzero().squeeze(1)
        # Strict: ties stay with the earlier medoid; medoids already chosen stay in their own cluster.
        captured = (distances[contenders] < nearest.unsqueeze(0)) & available.unsqueeze(0)
        captured[torch.arange(len(contenders), device=distances.device), contenders] = True
        score = energy[contenders] + margin_multiplier * (1.0 - nmi_after_moves(assignment, class_index, captured))
        winner = int(torch.argmax(score))  # contenders are in index order: ties go to the lowest index
        best = int(contenders[winner])
        chosen.append(best)
        nearest = torch.minimum(nearest, distances[best])
        assignment = torch.where(captured[winner], step, assignment)
        available[best] = False
    return torch.tensor(chosen, dtype=torch.long, device=distances.device)


def nearest_other_medoid(distances: Tensor, medoids: Tensor, position: int) -> tuple[Tensor, Tensor]:
    """Each point's distance to, and position of, its nearest medoid other than ``medoids[position]``
    (ties: the earlier position; with a single medoid: inf and position 0)."""
    others = distances[medoids].index_fill(0, torch.tensor([position], device=medoids.device), float("inf"))
    return others.min(dim=0)


def swap_moves(
    distances: Tensor, medoids: Tensor, position: int, newcomers: Tensor, nearest_other: tuple[Tensor, Tensor]
) -> tuple[Tensor, Tensor]:
    """The clusterings of ``medoids`` with ``newcomers[r]`` (a non-medoid) at ``position``, as moves:
    ``(held, moved)`` with ``held`` each point's cluster without the medoid at ``position`` and
    ``moved[r]`` the points that newcomer r takes, so that ``torch.where(moved[r], position, held)``
    is ``assign_to_medoids`` of the swapped set. ``nearest_other`` is ``nearest_other_medoid``'s answer."""
    held_distance, held = nearest_other[0], nearest_other[1].clone()
    new_distance = distances[newcomers]
    # The newcomer at `position` wins a point if nearer, or as near and earlier in the medoid order.
    moved = (new_distance < held_distance) | ((new_distance == held_distance) & (position < held))
    # Medoids keep their own cluster: the ones kept, and the newcomer; the swapped-out one not.
    positions = torch.arange(len(medoids), device=medoids.device)
    kept = positions != position
    held[medoids[kept]] = positions[kept]
    moved[:, medoids[kept]] = False
    moved[torch.arange(len(newcomers), device=medoids.device), newcomers] = True
    return held, moved


def swap_refined_medoids(
    distances: Tensor, class_index: Tensor, margin_multiplier: float, medoids: Tensor, max_passes: int = 10
) -> Tensor:
    """PAM-style swap refinement (Song et al. 2017) of ``medoids`` for ``F(X, S) + gamma (1 - NMI(g(S), y))``.

    A pass visits the medoid positions in order; at position ``p`` it scores the swap of the medoid
    with every non-medoid ``j`` (``j`` takes position ``p``, so ``assign_to_medoids``'s tie order
    holds) and makes the best one (ties: lowest ``j``) if it strictly increases the objective, by
    more than a 1e-10 relative round-off slack. Stops after a pass without a swap, or after
    ``max_passes`` passes (2-3 passes on the 112-point batches measured). Never lowers the objective.
    """
    batch, size = len(class_index), len(medoids)
    medoids = medoids.clone()
    if size == batch:
        return medoids
    distances = distances.double()  # exact copies of the values (same ties), sums without float32 noise
    is_medoid = torch.zeros(batch, dtype=torch.bool, device=distances.device)
    is_medoid[medoids] = True
    nmi = batched_nmi(assign_to_medoids(distances, medoids).unsqueeze(0), class_index).squeeze(0)
    current = -distances[medoids].amin(dim=0).sum() + margin_multiplier * (1.0 - nmi)
    swaps = 0
    # The swap count at which each position last found no improving swap: until another swap changes
    # the medoids, looking again would score the same sets and find none.
    settled = [-1] * size
    for _ in range(max_passes):
        swaps_before = swaps
        for position in range(size):
            if settled[position] == swaps:
                continue
            nearest_other = nearest_other_medoid(distances, medoids, position)
            candidates = (~is_medoid).nonzero().squeeze(1)
            energy = -torch.minimum(nearest_other[0].unsqueeze(0), distances[candidates]).sum(dim=1)
            # As in the greedy: 1 - NMI <= 1, so only swaps with energy + gamma above the current value
            # can improve; the NMI is computed for those only.
            slack = 1e-10 * (abs(float(current)) + 1.0)
            contenders = (energy + margin_multiplier > current + slack).nonzero().squeeze(1)
            if len(contenders) > 0:
                newcomers = candidates[contenders]
                held, moved = swap_moves(distances, medoids, position, newcomers, nearest_other)
                score = energy[contenders] + margin_multiplier * (1.0 - nmi_after_moves(held, class_index, moved))
                best = int(torch.argmax(score))  # the first maximum: the lowest index
                if bool(score[best] > current + slack):
                    is_medoid[medoids[position]] = False
                    is_medoid[newcomers[best]] = True
                    medoids[position] = newcomers[best]
                    current = score[best]
                    swaps += 1
            settled[position] = swaps
        if swaps == swaps_before:
            break
    return medoids


def assign_to_medoids(distances: Tensor, medoids: Tensor) -> Tensor:
    """``g(S)``: each point's nearest medoid (position in ``medoids``; ties go to the earlier medoid),
    every medoid in its own cluster."""
    assignment = torch.argmin(distances[medoids], dim=0)
    assignment[medoids] = torch.arange(len(medoids), device=medoids.device)
    return assignment


def oracle_clustering_score(distances: Tensor, labels: Tensor) -> Tensor:
    """``F~(X, y) = sum_k max_{j in class k} F(X_k, {j})``: the best medoid of every class (eq. 10)."""
    same = same_label_mask(labels)
    # Column j: the total distance from j's classmates to j, i.e. -F(X_{y_j}, {j}).
    cost = (distances * same.to(distances.dtype)).sum(dim=0)
    _, class_index = torch.unique(labels, return_inverse=True)
    members = F.one_hot(class_index).T.bool()
    return -torch.where(members, cost.unsqueeze(0), float("inf")).amin(dim=1).sum()


@LOSSES.register("facility_location")
class FacilityLocationLoss(MetricLoss):
    """Structured clustering loss, Fehervari et al. 2019 eq. 10-12 (Song et al. 2017).

    ``L = [max_{S, |S| = |Y|} {F(X, S) + gamma Delta(g(S), Y)} - F~(X, Y)]_+`` with the facility
    location ``F(X, S) = -sum_i min_{j in S} ||phi_i - phi_j||`` (Euclidean, not squared, as Song et
    al.), ``F~`` the score of the best medoid per class (eq. 10), ``g(S)`` the nearest-medoid
    assignment (eq. 12) and the structured margin ``Delta = 1 - NMI`` (sklearn's arithmetic NMI; the
    reference codes used the geometric mean). The max is Song et al.'s greedy loss-augmented
    inference, then (``refine``, default on) their PAM-style swap refinement (seed 000 sec. 2.7):
    best single medoid/non-medoid swaps while they strictly increase the objective
    (``swap_refined_medoids``; the reference code only tries each cluster's own members, for 5
    iterations). Still a lower bound of eq. 11's max; its medoids are constants for
    the gradient, which flows through the distances of both terms. ``margin_multiplier`` is gamma
    (1, as Song et al.). A sum over the batch, not normalised (as eq. 11). The embeddings are used as
    given (seed 000's Table 1 normalises them for this loss).
    """

    def __init__(self, margin_multiplier: float = 1.0, refine: bool = True) -> None:
        super().__init__()
        self.margin_multiplier = check_non_negative("margin_multiplier", margin_multiplier)
        self.refine = check_flag("refine", refine)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        if len(labels) == 0:
            return zero_loss(embeddings)
        distances = euclidean(embeddings)
        _, class_index = torch.unique(labels, return_inverse=True)
        with torch.no_grad():
            medoids = greedy_loss_augmented_medoids(distances.detach(), class_index, self.margin_multiplier)
            if self.refine:
                medoids = swap_refined_medoids(distances.detach(), class_index, self.margin_multiplier, medoids)
            margin = 1.0 - batched_nmi(assign_to_medoids(distances.detach(), medoids).unsqueeze(0), class_index)
        predicted_score = -distances[medoids].amin(dim=0).sum()
        augmented = predicted_score + self.margin_multiplier * margin.squeeze(0).to(distances.dtype)
        return F.relu(augmented - oracle_clustering_score(distances, labels))
