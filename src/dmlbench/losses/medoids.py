"""Song et al.'s loss-augmented inference for the facility-location loss (``losses.facility_location``):
the greedy choice of medoids that maximises ``F(X, S) + gamma (1 - NMI)`` (Song et al. 2017, alg. 1), then
the PAM-style swap refinement (seed 000 sec. 2.7), with the NMI of every candidate move computed in batches."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor


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


def nmi_after_moves(bases: Tensor, truth: Tensor, base_of_row: Tensor, row: Tensor, point: Tensor) -> Tensor:
    """``batched_nmi`` of each row's clustering: row ``r`` is ``bases[base_of_row[r]]`` (``[g, b]`` cluster
    ids ``>= 0``) with the points ``point[row == r]`` (each at most once) taken into one new cluster;
    ``truth`` ``[b]`` has ids in ``[0, K)``.

    Equal to ``batched_nmi`` of those clusterings up to round-off, at the cost of the moved points only
    (a few per row in the greedy and the swaps, not ``b``): a move changes the ``sum n log n`` terms of
    the cells and clusters it touches and nothing else. Its sums are those the medoid search compares
    (``estimated_nmi_after_moves`` only preselects), so its arithmetic decides ties.
    """
    rows, (groups, size) = len(base_of_row), bases.shape
    num_true, num_base = int(truth.max()) + 1, int(bases.max()) + 1
    num_cells = num_base * num_true
    cells = bases * num_true + truth
    group = torch.arange(groups, device=bases.device).unsqueeze(1)
    # Every count is an integer in [0, b]: n log n comes from a table of the same xlogy values, not
    # from a log per entry.
    counts = torch.arange(size + 1, dtype=torch.float64, device=bases.device)
    n_log_n = torch.special.xlogy(counts, counts)
    # Clusters and the new cluster's cells are few enough to count densely per row; the (row, cell)
    # pairs the moves leave are counted sparsely. N * MI = sum n_pk log n_pk - sum n_p log n_p
    # - sum n_k log n_k + N log N (see batched_nmi).
    cluster_sizes = torch.bincount((group * num_base + bases).view(-1), minlength=groups * num_base)
    moved_base = base_of_row[row]
    leaving = torch.bincount(row * num_base + bases[moved_base, point], minlength=rows * num_base)
    remaining = cluster_sizes.view(groups, num_base)[base_of_row] - leaving.view(rows, num_base)
    arriving = torch.bincount(row * num_true + truth[point], minlength=rows * num_true).view(rows, num_true)
    moved_count = arriving.sum(dim=1)
    clusters_term = n_log_n[remaining].sum(dim=1) + n_log_n[moved_count]
    cell_sizes = torch.bincount((group * num_cells + cells).view(-1), minlength=groups * num_cells)
    cell_sizes = cell_sizes.view(groups, num_cells)
    keys, taken = torch.unique(row * num_cells + cells[moved_base, point], return_counts=True)
    key_rows = keys // num_cells
    before = cell_sizes[base_of_row[key_rows], keys % num_cells]
    change = n_log_n[before - taken] - n_log_n[before]
    cells_term = n_log_n[cell_sizes].sum(dim=1)[base_of_row] + n_log_n[arriving].sum(dim=1)
    cells_term = cells_term.index_add_(0, key_rows, change)
    num_clusters = (remaining > 0).sum(dim=1) + (moved_count > 0).long()
    return _nmi_from_terms(cells_term, clusters_term, num_clusters, truth, n_log_n)


def _nmi_from_terms(
    cells_term: Tensor, clusters_term: Tensor, num_clusters: Tensor, truth: Tensor, n_log_n: Tensor
) -> Tensor:
    """NMI from ``sum n_pk log n_pk`` and ``sum n_p log n_p`` (see batched_nmi), with batched_nmi's limit cases."""
    size = len(truth)
    class_sizes = torch.bincount(truth)
    classes_term = n_log_n[class_sizes].sum()
    total = size * math.log(size)
    mutual_information = ((cells_term - clusters_term - classes_term + total) / size).clamp_min(0.0)
    entropy_predicted, entropy_true = (total - clusters_term) / size, (total - classes_term) / size
    normaliser = (entropy_predicted + entropy_true) / 2
    nmi = torch.where(mutual_information > 0, mutual_information / normaliser.clamp_min(1e-300), 0.0)
    single_cluster = (num_clusters == 1) & (int((class_sizes > 0).sum()) == 1)
    return torch.where(single_cluster, 1.0, nmi)


def estimated_nmi_after_moves(
    bases: np.ndarray, truth: np.ndarray, base_of_row: np.ndarray, row: np.ndarray, point: np.ndarray
) -> np.ndarray:
    """``nmi_after_moves`` up to round-off (about 1e-13), in NumPy: each row's sums start from its base
    clustering's and add what the moves change (the same terms summed in another order), so no row's
    counts over all clusters and classes are written out, and the few dozen small array operations
    cost a fraction of torch's per call."""
    rows, (groups, size) = len(base_of_row), bases.shape
    num_true, num_base = int(truth.max()) + 1, int(bases.max()) + 1
    num_cells = num_base * num_true
    counts = np.arange(size + 1, dtype=np.float64)
    n_log_n = counts * np.log(np.maximum(counts, 1.0))
    cells = bases * num_true + truth
    group = np.arange(groups)[:, None]
    cluster_sizes = np.bincount((group * num_base + bases).ravel(), minlength=groups * num_base).reshape(groups, -1)
    cell_sizes = np.bincount((group * num_cells + cells).ravel(), minlength=groups * num_cells).reshape(groups, -1)
    clusters_term = n_log_n[cluster_sizes].sum(axis=1)[base_of_row]
    cells_term = n_log_n[cell_sizes].sum(axis=1)[base_of_row]
    num_clusters = (cluster_sizes > 0).sum(axis=1)[base_of_row]
    moved_base = base_of_row[row]
    # The cells the moves leave, sorted by row, cluster and class: one sort serves the clusters too.
    keys, taken = np.unique(row * num_cells + cells[moved_base, point], return_counts=True)
    key_rows, before = keys // num_cells, cell_sizes[base_of_row[keys // num_cells], keys % num_cells]
    cells_term += np.bincount(key_rows, n_log_n[before - taken] - n_log_n[before], minlength=rows)
    clusters = keys // num_true  # row * num_base + cluster
    starts = np.flatnonzero(np.concatenate([[True], clusters[1:] != clusters[:-1]]))
    taken, clusters = np.add.reduceat(taken, starts), clusters[starts]
    key_rows, before = clusters // num_base, cluster_sizes[base_of_row[clusters // num_base], clusters % num_base]
    clusters_term += np.bincount(key_rows, n_log_n[before - taken] - n_log_n[before], minlength=rows)
    num_clusters -= np.bincount(key_rows, before == taken, minlength=rows).astype(np.int64)
    # The new cluster's cells: counted densely where that array is the smaller, else sorted.
    arrivals = row * num_true + truth[point]
    if rows * num_true < 4 * len(arrivals):
        arriving = np.bincount(arrivals, minlength=rows * num_true)
        arrivals = arriving.nonzero()[0]
        arriving = arriving[arrivals]
    else:
        arrivals, arriving = np.unique(arrivals, return_counts=True)
    cells_term += np.bincount(arrivals // num_true, n_log_n[arriving], minlength=rows)
    moved_count = np.bincount(row, minlength=rows)
    clusters_term += n_log_n[moved_count]
    num_clusters += moved_count > 0
    class_sizes = np.bincount(truth, minlength=num_true)
    classes_term = n_log_n[class_sizes].sum()
    total = size * math.log(size)
    mutual_information = np.maximum((cells_term - clusters_term - classes_term + total) / size, 0.0)
    normaliser = ((total - clusters_term) / size + (total - classes_term) / size) / 2
    nmi = np.where(mutual_information > 0, mutual_information / np.maximum(normaliser, 1e-300), 0.0)
    return np.where((num_clusters == 1) & (np.count_nonzero(class_sizes) == 1), 1.0, nmi)


def _moves_of_rows(
    keep: np.ndarray, bases: np.ndarray, truth: np.ndarray, base_of_row: np.ndarray, row: np.ndarray, point: np.ndarray
) -> tuple[np.ndarray, ...]:
    """``nmi_after_moves``'s arguments for the rows where ``keep`` only (renumbered in order)."""
    renumbered = np.cumsum(keep) - 1
    moves = keep[row]
    return bases, truth, base_of_row[keep], renumbered[row[moves]], point[moves]


# Scores computed by estimated_nmi_after_moves differ from nmi_after_moves's by round-off (about 1e-13
# relative); a row further than this below the best estimate cannot be the best, or tie with it.
_ESTIMATE_TOLERANCE = 1e-9


def ranked_columns(distances: np.ndarray) -> tuple[Tensor, np.ndarray]:
    """Each point's distances from all points in increasing order (as a tensor, for torch's batched
    binary search), and those points (ties by index): row ``i`` of both sorts column ``i`` of ``distances``."""
    order = np.argsort(distances.T, axis=1, kind="stable")
    return torch.from_numpy(np.take_along_axis(distances.T, order, axis=1)), order


def closer_points(
    ranked: tuple[Tensor, np.ndarray], limits: np.ndarray, inclusive: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every ``(k, j, i)`` with ``d[j, i] < limits[k, i]``, or ``==`` where ``inclusive[k, i]``, for the
    rows ``k`` of ``limits`` ``[c, b]``; a limit of -inf takes nothing. ``ranked`` is ``ranked_columns(d)``.

    With each point's distances sorted once, the few points nearer than a limit are a binary search
    away, instead of a [c, b, b] comparison and a scan of it.
    """
    sorted_distances, order = ranked
    bounds = torch.from_numpy(np.ascontiguousarray(limits.T))
    below = torch.searchsorted(sorted_distances, bounds).numpy()
    counts = np.where(inclusive.T, torch.searchsorted(sorted_distances, bounds, right=True).numpy(), below).ravel()
    pair = np.repeat(np.arange(len(counts)), counts)  # entry i * c + k, once per point it takes
    rank = np.arange(len(pair)) - np.repeat(np.cumsum(counts) - counts, counts)
    point = pair // len(limits)
    return pair % len(limits), order[point, rank], point


def greedy_loss_augmented_medoids(distances: Tensor, class_index: Tensor, margin_multiplier: float) -> Tensor:
    """Greedy maximiser of ``F(X, S) + gamma (1 - NMI(g(S), y))`` over ``|S| = |Y|`` (Song et al. 2017).

    The loss-augmented inference of eq. 11: adds one medoid at a time, the one with the best augmented
    score (ties: lowest index). Returns the medoid indices in the order they were chosen, which is
    also the order ``assign_to_medoids`` uses to break distance ties. Each candidate's NMI is estimated
    in NumPy and computed with torch for the few that can decide (``_best_score``); runs on the CPU
    (see ``swap_refined_medoids``).
    """
    device, distances, class_index = distances.device, distances.detach().cpu(), class_index.cpu()
    batch = len(class_index)
    nearest = torch.full((batch,), float("inf"), dtype=distances.dtype)
    assignment = np.zeros(batch, dtype=np.int64)
    available = np.ones(batch, dtype=bool)
    on_cpu, truth = distances.numpy(), class_index.numpy()
    chosen: list[int] = []
    for step in range(int(class_index.max()) + 1):
        # Row j: the facility location after adding candidate j as medoid number `step`.
        energy = -torch.minimum(nearest.unsqueeze(0), distances).sum(dim=1).double()
        energy = energy.masked_fill(torch.from_numpy(~available), float("-inf"))
        # 1 - NMI lies in [0, 1], so a candidate more than gamma below the best energy cannot win:
        # the NMI (the expensive part) is only needed for the others. The slack covers round-off.
        best_energy = energy.max()
        bound = best_energy - margin_multiplier - 1e-9 * (best_energy.abs() + 1.0)
        contenders = (energy >= bound).nonzero().squeeze(1)
        candidates = contenders.numpy()
        # Strict: ties stay with the earlier medoid; medoids already chosen stay in their own cluster.
        captured = (on_cpu[candidates] < nearest.numpy()) & available
        captured[np.arange(len(candidates)), candidates] = True
        row, point = captured.nonzero()
        moves = (assignment[None], truth, np.zeros_like(candidates), row, point)
        winner = _best_score(energy[contenders], margin_multiplier, moves)
        best = int(candidates[winner])
        chosen.append(best)
        nearest = torch.minimum(nearest, distances[best])
        assignment[captured[winner]] = step
        available[best] = False
    return torch.tensor(chosen, dtype=torch.long, device=device)


def _best_score(energy: Tensor, margin_multiplier: float, moves: tuple[np.ndarray, ...]) -> int:
    """The first maximum of ``energy + gamma (1 - NMI)`` over the rows of ``moves`` (``nmi_after_moves``'s
    arguments, in NumPy): estimated for all, computed exactly for the few that may be the maximum."""
    estimate = energy.numpy() + margin_multiplier * (1.0 - estimated_nmi_after_moves(*moves))
    tolerance = _ESTIMATE_TOLERANCE * (float(np.abs(estimate).max()) + margin_multiplier + 1.0)
    near = estimate >= estimate.max() - tolerance
    if np.count_nonzero(near) == 1:
        return int(near.argmax())
    rows = near.nonzero()[0]
    exact = nmi_after_moves(*(torch.from_numpy(array) for array in _moves_of_rows(near, *moves)))
    return int(rows[int(torch.argmax(energy[torch.from_numpy(rows)] + margin_multiplier * (1.0 - exact)))])


class MedoidState(NamedTuple):
    """Medoids and what scoring their swaps shares until one is made (``medoid_state``)."""

    medoids: np.ndarray  # [m] point indices
    is_medoid: np.ndarray  # [b] bool
    nearest: tuple[np.ndarray, np.ndarray]  # each point's nearest medoid: distance, position (ties: the earlier)
    runner_up: tuple[np.ndarray, np.ndarray]  # the same with that medoid left out (a single medoid: inf, 0)
    candidates: np.ndarray  # the non-medoids, in index order
    candidate_distances: Tensor  # their rows of the distances


def medoid_state(distances: Tensor, medoids: np.ndarray) -> MedoidState:
    """The ``MedoidState`` of ``medoids`` (CPU ``distances``)."""
    rows = distances.numpy()[medoids]
    columns = np.arange(rows.shape[1])
    own = rows.argmin(axis=0)  # the first minimum: the earlier position
    others = rows.copy()
    others[own, columns] = np.inf
    runner_up_own = others.argmin(axis=0)
    is_medoid = np.zeros(len(distances), dtype=bool)
    is_medoid[medoids] = True
    candidates = (~is_medoid).nonzero()[0]
    return MedoidState(
        medoids.copy(),
        is_medoid,
        (rows[own, columns], own),
        (others[runner_up_own, columns], runner_up_own),
        candidates,
        distances[torch.from_numpy(candidates)],
    )


def nearest_other_medoids(state: MedoidState, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``positions`` ``[c]``, each point's distance to, and position of, its nearest medoid
    other than ``medoids[position]`` (ties: the earlier position; with a single medoid: inf and 0), ``[c, b]``."""
    # Without its own medoid a point's nearest is the runner-up; leaving out another one changes nothing.
    its_own = state.nearest[1][None] == positions[:, None]
    return (
        np.where(its_own, state.runner_up[0], state.nearest[0]),
        np.where(its_own, state.runner_up[1], state.nearest[1]),
    )


def swap_moves(
    ranked: tuple[Tensor, np.ndarray],
    state: MedoidState,
    positions: np.ndarray,
    nearest_other: tuple[np.ndarray, np.ndarray],
    which: np.ndarray,
    newcomers: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The clusterings of ``state.medoids`` with ``newcomers[r]`` (a non-medoid) at position
    ``positions[which[r]]``, as moves: ``(held, row, point)`` with ``held[k]`` each point's cluster
    without the medoid at ``positions[k]`` and ``point[row == r]`` the points newcomer r takes, so that
    ``held[which[r]]`` with those points at ``positions[which[r]]`` is ``assign_to_medoids`` of the
    swapped set. ``nearest_other`` is ``nearest_other_medoids``'s answer; ``ranked`` is ``ranked_columns(d)``."""
    held_distance, held = nearest_other
    every, swapped_out = np.arange(len(positions)), state.medoids[positions]
    # Medoids keep their own cluster: the ones kept, and the newcomer; the swapped-out one not.
    limits = np.where(state.is_medoid, -np.inf, held_distance)
    limits[every, swapped_out] = held_distance[every, swapped_out]
    # The newcomer at `position` wins a point if nearer, or as near and earlier in the medoid order.
    which_taker, taker, point = closer_points(ranked, limits, positions[:, None] < held)
    row_of = np.full(held.shape, -1)
    row_of[which, newcomers] = np.arange(len(which))
    row = row_of[which_taker, taker]
    taken = (row >= 0) & (taker != point)
    clusters = held.copy()
    clusters[:, state.medoids] = np.arange(len(state.medoids))
    clusters[every, swapped_out] = held[every, swapped_out]
    return clusters, np.concatenate([row[taken], np.arange(len(which))]), np.concatenate([point[taken], newcomers])


def _first_improving_swap(
    ranked: tuple[Tensor, np.ndarray],
    class_index: np.ndarray,
    margin_multiplier: float,
    state: MedoidState,
    positions: list[int],
    current: Tensor,
) -> tuple[int, int, Tensor] | None:
    """Scores every swap of the medoids at ``positions`` (in increasing order) at once: the first of them
    whose best swap (ties: lowest index) beats ``current`` by more than the round-off slack, as
    ``(its index in positions, the newcomer, the new objective)``, or None."""
    at = np.array(positions)
    nearest_other = nearest_other_medoids(state, at)
    others = torch.from_numpy(nearest_other[0]).unsqueeze(1)
    energy = -torch.minimum(others, state.candidate_distances.unsqueeze(0)).sum(dim=2)
    # As in the greedy: 1 - NMI <= 1, so only swaps with energy + gamma above the current value
    # can improve; the NMI is computed for those only.
    slack = 1e-10 * (abs(float(current)) + 1.0)
    which, candidate = (energy + margin_multiplier > current + slack).numpy().nonzero()
    if len(which) == 0:
        return None
    newcomers = state.candidates[candidate]
    held, row, point = swap_moves(ranked, state, at, nearest_other, which, newcomers)
    moves = (held, class_index, which, row, point)
    energy = energy[torch.from_numpy(which), torch.from_numpy(candidate)]
    estimate = energy.numpy() + margin_multiplier * (1.0 - estimated_nmi_after_moves(*moves))
    best_estimate = np.full(len(positions), -np.inf)
    np.maximum.at(best_estimate, which, estimate)
    # The exact scores (nmi_after_moves's arithmetic) of the swaps that may be their position's best
    # and an improvement decide.
    tolerance = _ESTIMATE_TOLERANCE * (abs(float(current)) + margin_multiplier + 1.0)
    maybe = best_estimate >= float(current) + slack - tolerance
    near = maybe[which] & (estimate >= best_estimate[which] - tolerance)
    if not near.any():
        return None
    exact = nmi_after_moves(*(torch.from_numpy(array) for array in _moves_of_rows(near, *moves)))
    score = energy[torch.from_numpy(near)] + margin_multiplier * (1.0 - exact)
    which, newcomers = torch.from_numpy(which[near]), newcomers[near]
    best = score.new_full((len(positions),), float("-inf")).scatter_reduce(0, which, score, "amax")
    improving = (best > current + slack).nonzero()
    if len(improving) == 0:
        return None
    index = int(improving[0])
    rows = (which == index).nonzero().squeeze(1)
    winner = int(rows[torch.argmax(score[rows])])  # the first maximum: the lowest index
    return index, int(newcomers[winner]), score[winner]


_FIRST_WIDTH = 4  # positions scored together after a swap (the next swap is often near)


def swap_refined_medoids(
    distances: Tensor, class_index: Tensor, margin_multiplier: float, medoids: Tensor, max_passes: int = 10
) -> Tensor:
    """PAM-style swap refinement (Song et al. 2017) of ``medoids`` for ``F(X, S) + gamma (1 - NMI(g(S), y))``.

    A pass visits the medoid positions in order; at position ``p`` it scores the swap of the medoid
    with every non-medoid ``j`` (``j`` takes position ``p``, so ``assign_to_medoids``'s tie order
    holds) and makes the best one (ties: lowest ``j``) if it strictly increases the objective, by
    more than a 1e-10 relative round-off slack. Stops after a pass without a swap, or after
    ``max_passes`` passes (2-3 passes on the 112-point batches measured). Never lowers the objective.

    The swaps of several positions are scored in one go (``_first_improving_swap``), and the NMI of
    each swap is estimated in NumPy, then computed with torch for the few that can decide: the medoids
    are those of the visits one by one. The search runs on the CPU: thousands of small array operations,
    which a GPU would run no faster than their launches.
    """
    batch, size = len(class_index), len(medoids)
    if size == batch:
        return medoids.clone()
    device = medoids.device
    # float64: exact copies of the values (same ties), sums without float32 noise
    distances, class_index = distances.detach().double().cpu(), class_index.cpu()
    ranked = ranked_columns(distances.numpy())
    chosen = medoids.cpu().numpy().copy()
    state = medoid_state(distances, chosen)
    nmi = batched_nmi(assign_to_medoids(distances, torch.from_numpy(chosen)).unsqueeze(0), class_index).squeeze(0)
    current = -distances[torch.from_numpy(chosen)].amin(dim=0).sum() + margin_multiplier * (1.0 - nmi)
    truth = class_index.numpy()
    swaps = 0
    # The swap count at which each position last found no improving swap: until another swap changes
    # the medoids, looking again would score the same sets and find none.
    settled = [-1] * size
    for _ in range(max_passes):
        swaps_before, position, width = swaps, 0, _FIRST_WIDTH
        while pending := [p for p in range(position, size) if settled[p] != swaps]:
            # A swap at the last position leaves one cluster id fewer, so nmi_after_moves would sum
            # over another number of clusters with the others: it is scored alone.
            visit = pending[:width]
            if len(visit) > 1 and visit[-1] == size - 1:
                visit.pop()
            found = _first_improving_swap(ranked, truth, margin_multiplier, state, visit, current)
            settled_until = len(visit) if found is None else found[0]
            for p in visit[:settled_until]:
                settled[p] = swaps
            if found is None:
                # Swaps come rarer as the objective settles: look further ahead next time.
                position, width = visit[-1] + 1, 2 * width
                continue
            index, newcomer, current = found
            chosen[visit[index]] = newcomer
            state = medoid_state(distances, chosen)
            swaps += 1
            settled[visit[index]] = swaps
            position, width = visit[index] + 1, _FIRST_WIDTH
        if swaps == swaps_before:
            break
    return torch.from_numpy(chosen).to(device)


def assign_to_medoids(distances: Tensor, medoids: Tensor) -> Tensor:
    """``g(S)``: each point's nearest medoid (position in ``medoids``; ties go to the earlier medoid),
    every medoid in its own cluster."""
    assignment = torch.argmin(distances[medoids], dim=0)
    assignment[medoids] = torch.arange(len(medoids), device=medoids.device)
    return assignment
