"""Exact blocked k-nearest-neighbour candidate search in torch, with bounded memory.

The score matrix (``[Q, R]``, larger is nearer) is produced one ``block x block`` float32 product at
a time and never held whole. Each query keeps its running best ``width`` candidates; a block only
touches the state through the few entries that beat the query's current worst candidate, found
via the maxima of ``cell``-sized slices, so the selection costs little next to the product. When
the queries are the references and the scores are symmetric, each block above the diagonal is
computed once and used for both its rows and its columns.

Float32 candidates are not yet exact: ``dmlbench.evaluation.neighbors`` re-ranks them by exact keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dmlbench.evaluation.knn_index import KnnIndex, float32_products

DEFAULT_BLOCK_SIZE = 4096
_CELL = 32
_COLUMN_CELL = 8
# A block with more than 1/_DENSE_FRACTION of its entries in active cells (weak thresholds, or many
# tied scores as with binary codes) is merged with one dense top-k instead.
_DENSE_FRACTION = 8


class _RunningTopK:
    """Best ``width`` (score, reference id) per query, updated from blocks of scores."""

    def __init__(self, num_queries: int, width: int) -> None:
        self.scores = torch.full((num_queries, width), -math.inf, dtype=torch.float32)
        self.ids = torch.full((num_queries, width), -1, dtype=torch.int64)
        self.width = width

    def thresholds(self, start: int, stop: int) -> Tensor:
        return self.scores[start:stop, -1]

    def update_rows(self, block: Tensor, query_start: int, reference_ids: Tensor) -> None:
        """Merge ``block[i, j]`` = score of query ``query_start + i`` and reference ``reference_ids[j]``."""
        rows, columns = block.shape
        cells = block.view(rows, columns // _CELL, _CELL)
        cell_maxima = cells.amax(dim=2)
        threshold = self._threshold(cell_maxima, query_start, dim=1)
        if threshold is None:
            self._merge_dense(block, query_start, reference_ids)
            return
        active_rows, active_cells = torch.nonzero(cell_maxima > threshold.unsqueeze(1), as_tuple=True)
        if active_rows.numel() == 0:
            return
        if active_rows.numel() * _CELL > block.numel() // _DENSE_FRACTION:
            self._merge_dense(block, query_start, reference_ids)
            return
        cells_per_row = columns // _CELL
        values = cells.reshape(-1, _CELL).index_select(0, active_rows * cells_per_row + active_cells)
        self._merge(values, active_rows, active_cells * _CELL, threshold, query_start, reference_ids)

    def update_columns(self, block: Tensor, query_start: int, reference_ids: Tensor) -> None:
        """Merge ``block[j, i]`` = score of query ``query_start + i`` and reference ``reference_ids[j]``."""
        rows, columns = block.shape
        # Column cells are short: their entries are strided, so gathering them is what costs.
        cell_maxima = block.view(rows // _COLUMN_CELL, _COLUMN_CELL, columns).amax(dim=1)
        threshold = self._threshold(cell_maxima, query_start, dim=0)
        if threshold is None:
            self._merge_dense(block.T.contiguous(), query_start, reference_ids)
            return
        active_cells, active_columns = torch.nonzero(cell_maxima > threshold.unsqueeze(0), as_tuple=True)
        if active_cells.numel() == 0:
            return
        if active_cells.numel() * _COLUMN_CELL > block.numel() // _DENSE_FRACTION:
            self._merge_dense(block.T.contiguous(), query_start, reference_ids)
            return
        # Entry (c * COLUMN_CELL + p, j) of the block sits at flat position (c * COLUMN_CELL + p) * columns + j.
        flat_positions = (active_cells * _COLUMN_CELL).unsqueeze(1) + torch.arange(_COLUMN_CELL)
        flat_positions = flat_positions.mul_(columns).add_(active_columns.unsqueeze(1))
        values = block.view(-1).index_select(0, flat_positions.view(-1)).view(-1, _COLUMN_CELL)
        self._merge(values, active_columns, active_cells * _COLUMN_CELL, threshold, query_start, reference_ids)

    def _threshold(self, cell_maxima: Tensor, query_start: int, dim: int) -> Tensor | None:
        """Scores a block entry must exceed to matter; ``None`` when every entry must be considered.

        Normally the query's current worst candidate. A query with fewer than ``width`` candidates
        instead uses the ``width``-th largest cell maximum of the block: at least ``width`` entries
        of the block reach it, so nothing below it can enter (taken one step lower, so that `>`
        keeps entries equal to it).
        """
        threshold = self.thresholds(query_start, query_start + cell_maxima.shape[1 - dim])
        if not bool(torch.isneginf(threshold).any()):
            return threshold
        if cell_maxima.shape[dim] < self.width:
            return None
        block_bound = cell_maxima.topk(self.width, dim=dim).values.select(dim, self.width - 1)
        return torch.maximum(threshold, torch.nextafter(block_bound, torch.tensor(-math.inf)))

    def _merge_dense(self, block: Tensor, query_start: int, reference_ids: Tensor) -> None:
        # For blocks too narrow to bound the entries that may enter, or where most entries may.
        rows = slice(query_start, query_start + block.shape[0])
        block_scores, block_positions = block.topk(min(self.width, block.shape[1]), dim=1)
        all_scores = torch.cat([self.scores[rows], block_scores], dim=1)
        all_ids = torch.cat([self.ids[rows], reference_ids[block_positions]], dim=1)
        best_scores, best_positions = all_scores.topk(self.width, dim=1)
        self.scores[rows] = best_scores
        self.ids[rows] = all_ids.gather(1, best_positions)

    def _merge(
        self,
        values: Tensor,
        local_queries: Tensor,
        cell_starts: Tensor,
        threshold: Tensor,
        query_start: int,
        reference_ids: Tensor,
    ) -> None:
        # `values[a, p]` scores query `local_queries[a]` against block reference `cell_starts[a] + p`.
        kept_cell, kept_slot = torch.nonzero(values > threshold[local_queries].unsqueeze(1), as_tuple=True)
        if kept_cell.numel() == 0:
            return
        queries = local_queries[kept_cell]
        candidate_scores = values[kept_cell, kept_slot]
        candidate_ids = reference_ids[cell_starts[kept_cell] + kept_slot]
        if queries.numel() > 1 and not bool((queries[1:] >= queries[:-1]).all()):
            order = torch.argsort(queries, stable=True)
            queries, candidate_scores, candidate_ids = queries[order], candidate_scores[order], candidate_ids[order]
        unique_queries, counts = torch.unique_consecutive(queries, return_counts=True)
        slot_of_query = torch.repeat_interleave(torch.arange(len(unique_queries)), counts)
        first = torch.cumsum(counts, 0) - counts
        position = torch.arange(len(queries)) - torch.repeat_interleave(first, counts)
        width = int(counts.max())
        padded_scores = torch.full((len(unique_queries), width), -math.inf, dtype=torch.float32)
        padded_ids = torch.full((len(unique_queries), width), -1, dtype=torch.int64)
        padded_scores[slot_of_query, position] = candidate_scores
        padded_ids[slot_of_query, position] = candidate_ids
        state_rows = unique_queries + query_start
        all_scores = torch.cat([self.scores[state_rows], padded_scores], dim=1)
        all_ids = torch.cat([self.ids[state_rows], padded_ids], dim=1)
        best_scores, best_positions = all_scores.topk(self.width, dim=1)
        self.scores[state_rows] = best_scores
        self.ids[state_rows] = all_ids.gather(1, best_positions)


def zero_padded(rows: Tensor, multiple: int) -> Tensor:
    """``rows`` with zero rows appended up to a multiple of ``multiple`` (their scores are masked later)."""
    missing = -rows.shape[0] % multiple
    if missing == 0:
        return rows
    return torch.cat([rows, rows.new_zeros(missing, rows.shape[1])])


def candidate_search(
    space: KnnIndex,
    query_ids: Tensor,
    reference_ids: Tensor,
    width: int,
    *,
    exclude_self: bool,
    block_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Top ``width`` float32 candidates per query: (scores ``[Q, width]``, global reference ids ``[Q, width]``).

    ``exclude_self`` drops the pair where the reference id equals the query id.
    """
    block = _CELL * max(1, math.ceil((block_size or DEFAULT_BLOCK_SIZE) / _CELL))
    return blocked_search(space, query_ids, reference_ids, width, block, exclude_self, _symmetric_search,
                          _rectangular_search)


def blocked_search(space: KnnIndex, query_ids: Tensor, reference_ids: Tensor, width: int, block: int,
                   exclude_self: bool, symmetric: Callable[..., Any], rectangular: Callable[..., Any]) -> tuple[Tensor, Tensor]:
    """A blocked search's (scores, ids) in true float32: ``symmetric(rows, ids, width, block)`` when each
    block pair can serve its rows and its columns, else ``rectangular(space, query_ids, reference_ids,
    width, block, exclude_self)``; each returns a state with ``scores`` and ``ids`` (``knn_device`` too)."""
    with float32_products():
        if space.is_self_search(query_ids, reference_ids, exclude_self):
            state = symmetric(space.search_rows[query_ids], query_ids, width, block)
        else:
            state = rectangular(space, query_ids, reference_ids, width, block, exclude_self)
    return state.scores[: len(query_ids)], state.ids[: len(query_ids)]


def _symmetric_search(rows: Tensor, ids: Tensor, width: int, block: int) -> _RunningTopK:
    count = rows.shape[0]
    padded_rows = zero_padded(rows, _CELL)
    padded_ids = torch.cat([ids, ids.new_full((padded_rows.shape[0] - count,), -1)])
    state = _RunningTopK(padded_rows.shape[0], width)
    starts = list(range(0, padded_rows.shape[0], block))
    buffer = torch.empty(min(block, padded_rows.shape[0]) ** 2, dtype=torch.float32)
    # Diagonal blocks first: they give every query `width` candidates, hence a finite threshold,
    # before the off-diagonal blocks are filtered against it.
    pairs = [(i, i) for i in starts] + [(i, j) for i in starts for j in starts if j > i]
    for i, j in pairs:
        rows_i, rows_j = padded_rows[i : i + block], padded_rows[j : j + block]
        # Reusing one output buffer avoids page faults on every block, which would cost as much as the product.
        scores = torch.mm(rows_i, rows_j.T, out=buffer[: len(rows_i) * len(rows_j)].view(len(rows_i), len(rows_j)))
        mask_padding(scores, i, j, count)
        if i == j:
            scores.fill_diagonal_(-math.inf)
            state.update_rows(scores, i, padded_ids[j : j + block])
        else:
            state.update_rows(scores, i, padded_ids[j : j + block])
            state.update_columns(scores, j, padded_ids[i : i + block])
    return state


def _rectangular_search(
    space: KnnIndex, query_ids: Tensor, reference_ids: Tensor, width: int, block: int, exclude_self: bool
) -> _RunningTopK:
    queries = space.search_rows[query_ids]
    references = zero_padded(space.reference_rows[reference_ids], _CELL)
    num_references = len(reference_ids)
    padded_reference_ids = torch.cat([reference_ids, reference_ids.new_full((references.shape[0] - num_references,), -1)])
    state = _RunningTopK(len(query_ids), width)
    buffer = torch.empty(min(block, len(query_ids)) * min(block, references.shape[0]), dtype=torch.float32)
    for i in range(0, len(query_ids), block):
        block_query_ids = query_ids[i : i + block]
        block_queries = queries[i : i + block]
        for j in range(0, references.shape[0], block):
            block_reference_ids = padded_reference_ids[j : j + block]
            block_references = references[j : j + block]
            shape = (len(block_queries), len(block_references))
            scores = torch.mm(block_queries, block_references.T, out=buffer[: shape[0] * shape[1]].view(shape))
            if j + block > num_references:
                scores[:, max(0, num_references - j) :] = -math.inf
            if exclude_self:
                _mask_self(scores, block_query_ids, reference_ids[j : j + block])
            state.update_rows(scores, i, block_reference_ids)
    return state


def mask_padding(scores: Tensor, row_start: int, column_start: int, count: int) -> None:
    """Set the scores of padding rows and columns (global positions ``count`` on) of a block to -inf."""
    if row_start + scores.shape[0] > count:
        scores[max(0, count - row_start) :] = -math.inf
    if column_start + scores.shape[1] > count:
        scores[:, max(0, count - column_start) :] = -math.inf


def _mask_self(scores: Tensor, block_query_ids: Tensor, block_reference_ids: Tensor) -> None:
    """Set the score of each query against itself to -inf; ``block_reference_ids`` are ascending."""
    if len(block_reference_ids) == 0:
        return
    positions = torch.searchsorted(block_reference_ids, block_query_ids).clamp_max(len(block_reference_ids) - 1)
    is_self = block_reference_ids[positions] == block_query_ids
    scores[torch.nonzero(is_self).squeeze(1), positions[is_self]] = -math.inf
