"""Exact k-nearest-neighbour candidate search on the device the index is on (a CUDA GPU), in torch.

The score matrix (``[Q, R]``, larger is nearer) is produced one float32 ``block x block`` product at a
time, the block sized to the device's free memory, with TF32 off. Each block's best ``width`` entries
per row are found in two steps that read the block once: the maxima of ``cell``-sized slices, the
``width`` best slices by their maxima, then the best ``width`` entries of those slices; they are merged
into each query's running best ``width`` with one top-k of fixed shape, so nothing waits on the host.
When the queries are the references and the scores symmetric, each block above the diagonal is
computed once and serves its rows and its columns (half the products).

The set kept holds a query's ``width`` largest scores (which of several equal scores at the boundary
is unspecified): ``dmlbench.evaluation.neighbors`` re-ranks it by exact keys and certifies it, so the
final lists are the CPU path's, ties broken by index. The same code runs on the CPU (tests compare it
with ``knn_blocked`` there); ``neighbors`` uses it for indexes on any device but the CPU.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dmlbench.evaluation.knn_blocked import blocked_search, mask_padding, zero_padded
from dmlbench.evaluation.knn_index import KnnIndex

_CELL = 32
# A block's float32 scores and the temporaries of its selection take about this many times its size.
_WORKING_COPIES = 3
_MAX_BLOCK = 16384
_CPU_BLOCK = 2048


def block_size_for(device: torch.device, requested: int | None = None) -> int:
    """Rows (and columns) of one block, a multiple of the cell: ``requested``, else what a quarter of
    the device's free memory holds (at most ``16384``; ``2048`` on the CPU)."""
    if requested is not None:
        size = requested
    elif device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        size = min(_MAX_BLOCK, int(math.sqrt(free / 4 / (_WORKING_COPIES * 4))))
    else:
        size = _CPU_BLOCK
    return _CELL * max(1, size // _CELL)


def block_top(scores: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """The ``width`` largest entries of each row of ``scores`` ``[B, C]`` (C a multiple of the cell):
    values and column positions, ``[B, width]``. Every entry left out is at most the smallest kept."""
    rows, columns = scores.shape
    cells = columns // _CELL
    if cells <= 2 * width:
        return scores.topk(min(width, columns), dim=1)
    # Each of the `width` best slices has an entry at least as large as its maximum, the smallest of
    # which bounds every entry of the other slices: the row's best `width` lie in those slices.
    sliced = scores.view(rows, cells, _CELL)
    best_cells = sliced.amax(dim=2).topk(width, dim=1).indices
    candidates = sliced.gather(1, best_cells.unsqueeze(2).expand(rows, width, _CELL)).view(rows, width * _CELL)
    values, slots = candidates.topk(width, dim=1)
    positions = best_cells.gather(1, slots // _CELL) * _CELL + slots % _CELL
    return values, positions


def _column_top(scores: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """``block_top`` of ``scores.T`` without copying the block: values and row positions, ``[C, width]``."""
    rows, columns = scores.shape
    cells = rows // _CELL
    if cells <= 2 * width:
        values, positions = scores.topk(min(width, rows), dim=0)
        return values.T, positions.T
    sliced = scores.view(cells, _CELL, columns)
    best_cells = sliced.amax(dim=1).topk(width, dim=0).indices
    candidates = sliced.gather(0, best_cells.unsqueeze(1).expand(width, _CELL, columns)).view(width * _CELL, columns)
    values, slots = candidates.topk(width, dim=0)
    positions = best_cells.gather(0, slots // _CELL) * _CELL + slots % _CELL
    return values.T, positions.T


class _Best:
    """Each query's best ``width`` (score, reference id) so far, on the device."""

    def __init__(self, num_queries: int, width: int, device: torch.device) -> None:
        self.scores = torch.full((num_queries, width), -math.inf, dtype=torch.float32, device=device)
        self.ids = torch.full((num_queries, width), -1, dtype=torch.int64, device=device)
        self.width = width

    def merge(self, start: int, values: Tensor, ids: Tensor) -> None:
        """Merge candidates ``values``/``ids`` ``[B, w]`` into the queries ``start .. start + B - 1``."""
        rows = slice(start, start + values.shape[0])
        scores = torch.cat([self.scores[rows], values], dim=1)
        best, positions = scores.topk(self.width, dim=1)
        self.ids[rows] = torch.cat([self.ids[rows], ids], dim=1).gather(1, positions)
        self.scores[rows] = best


def _padded(rows: Tensor, ids: Tensor, multiple: int) -> tuple[Tensor, Tensor]:
    """Rows and ids padded with zero rows of id -1 to a multiple of ``multiple`` (masked to -inf later)."""
    padded = zero_padded(rows, multiple)
    return padded, torch.cat([ids, ids.new_full((padded.shape[0] - len(ids),), -1)])


def candidate_search(
    space: KnnIndex,
    query_ids: Tensor,
    reference_ids: Tensor,
    width: int,
    *,
    exclude_self: bool,
    block_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Top ``width`` float32 candidates per query on ``space``'s device: (scores ``[Q, width]``, global
    reference ids ``[Q, width]``, -1 for none); ``exclude_self`` drops each query's own row."""
    device = space.search_rows.device
    query_ids, reference_ids = query_ids.to(device), reference_ids.to(device)
    return blocked_search(space, query_ids, reference_ids, width, block_size_for(device, block_size), exclude_self,
                          _symmetric_search, _rectangular_search)


def _symmetric_search(rows: Tensor, ids: Tensor, width: int, block: int) -> _Best:
    count = len(ids)
    rows, ids = _padded(rows, ids, _CELL)
    best = _Best(rows.shape[0], width, rows.device)
    starts = range(0, rows.shape[0], block)
    for i in starts:
        for j in (start for start in starts if start >= i):
            scores = rows[i : i + block] @ rows[j : j + block].T
            mask_padding(scores, i, j, count)
            if i == j:
                scores.fill_diagonal_(-math.inf)
            values, positions = block_top(scores, width)
            best.merge(i, values, ids[j : j + block][positions])
            if i != j:
                values, positions = _column_top(scores, width)
                best.merge(j, values, ids[i : i + block][positions])
    return best


def _rectangular_search(space: KnnIndex, query_ids: Tensor, reference_ids: Tensor, width: int, block: int,
                        exclude_self: bool) -> _Best:
    queries = space.search_rows[query_ids]
    references, padded_ids = _padded(space.reference_rows[reference_ids], reference_ids, _CELL)
    best = _Best(len(query_ids), width, queries.device)
    for i in range(0, len(query_ids), block):
        block_query_ids = query_ids[i : i + block]
        for j in range(0, references.shape[0], block):
            block_ids = padded_ids[j : j + block]
            scores = queries[i : i + block] @ references[j : j + block].T
            # Padding (id -1) and, with exclude_self, each query's own row never enter.
            excluded = block_ids.unsqueeze(0) < 0
            if exclude_self:
                excluded = excluded | (block_query_ids.unsqueeze(1) == block_ids.unsqueeze(0))
            scores.masked_fill_(excluded, -math.inf)
            values, positions = block_top(scores, width)
            best.merge(i, values, block_ids[positions])
    return best

