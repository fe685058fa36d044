"""Embeddings prepared for exact nearest-neighbour search: the index every backend searches.

Every backend ranks neighbours by one *exact key* per (query, reference) pair: the float64 squared
Euclidean distance ``sum((q - r) ** 2)`` (float embeddings) or the Hamming distance of the packed
sign bits (binarised embeddings, seed 002 section 4.3). Candidates are found with fast float32
products whose error is bounded (``distance_error_bound``), then re-ranked by the exact key with
ties broken by reference index, which makes results independent of backend and thread count.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

# Unit round-off of float32 (round to nearest).
FLOAT32_UNIT_ROUNDOFF = 2.0**-24
# Covers float64 round-off in the exact keys and in the norms (|x|^2 = 1 up to ~1e-16).
_FLOAT64_MARGIN = 1e-12
_POPCOUNT = torch.tensor([byte.bit_count() for byte in range(256)], dtype=torch.int64)


@dataclass(frozen=True)
class KnnIndex:
    """All rows of one evaluation, in the two forms the search needs.

    ``search_rows`` (queries) and ``reference_rows`` (float32) feed the candidate products: unit
    rows for both (``normalize=True``); ``[q, 1]`` and ``[r, -|r|^2 / 2]`` (``normalize=False``, so
    that one product gives ``q.r - |r|^2/2``, ordered like ``-|q - r|^2``); or +-1 sign vectors for
    both (binarised, ``q.r = D - 2 * hamming``). ``symmetric_scores``: the two are the same matrix,
    so score(i, j) = score(j, i). ``exact_rows`` hold what the exact key is computed from (float64
    rows, or packed sign bits); ``squared_norms`` is ``None`` for unit rows. ``scale``: the power of
    two the float rows were multiplied by (``normalize=False``), so a key divided by ``scale**2`` is
    the squared distance of the embeddings as given.
    """

    search_rows: Tensor
    reference_rows: Tensor
    exact_rows: Tensor
    binary: bool
    dim: int
    symmetric_scores: bool
    squared_norms: Tensor | None
    scale: float = 1.0

    @property
    def num_rows(self) -> int:
        return int(self.exact_rows.shape[0])

    def is_self_search(self, query_ids: Tensor, reference_ids: Tensor, exclude_self: bool) -> bool:
        """Every row queries every other under symmetric scores: each block pair can serve both its rows and its columns."""
        return (exclude_self and self.symmetric_scores and len(query_ids) == len(reference_ids)
                and bool(torch.equal(query_ids, reference_ids)))

    def exact_distances(self, query_ids: Tensor, reference_ids: Tensor) -> Tensor:
        """Exact keys, float64 ``[Q, C]``, of ``query_ids[q]`` against ``reference_ids[q, c]``; -1 ids give inf."""
        valid = reference_ids >= 0
        safe_ids = reference_ids.clamp_min(0)
        queries = self.exact_rows[query_ids].unsqueeze(1)
        references = self.exact_rows[safe_ids]
        if self.binary:
            differing = torch.bitwise_xor(queries, references)
            keys = _POPCOUNT.to(differing.device)[differing.long()].sum(dim=-1).to(torch.float64)
        else:
            keys = (queries - references).square().sum(dim=-1)
        return keys.masked_fill(~valid, math.inf)

    def scores_to_distances(self, scores: Tensor, query_ids: Tensor) -> Tensor:
        """Map float32 candidate scores ``[Q, C]`` (larger is nearer) to approximate exact keys (float64)."""
        scores = scores.to(torch.float64)
        if self.binary:
            return (self.dim - scores) / 2.0
        if self.squared_norms is None:
            return 2.0 - 2.0 * scores
        return self.squared_norms[query_ids].unsqueeze(1) - 2.0 * scores

    def distance_error_bound(self, query_ids: Tensor) -> Tensor:
        """Bound on ``|approximate - exact key|`` per query, float64 ``[Q]``.

        The float32 product of ``D`` terms errs by at most ``gamma_D * sum|q_i r_i|`` (Higham,
        Accuracy and Stability of Numerical Algorithms, eq. 3.5), rounding the float64 rows to float32
        adds ``2u |q||r|``; the bound below doubles that for safety. Binary scores are exact integers.
        """
        if self.binary:
            return torch.zeros(len(query_ids), dtype=torch.float64, device=query_ids.device)
        terms = self.search_rows.shape[1] + 4
        relative = 4.0 * terms * FLOAT32_UNIT_ROUNDOFF
        if self.squared_norms is None:
            return torch.full((len(query_ids),), relative + _FLOAT64_MARGIN, dtype=torch.float64, device=query_ids.device)
        query_norms = self.squared_norms[query_ids].sqrt()
        max_reference_norm = float(self.squared_norms.max().sqrt())
        scale = query_norms * max_reference_norm + max_reference_norm**2
        return relative * scale + _FLOAT64_MARGIN * (query_norms + max_reference_norm) ** 2


@contextmanager
def float32_products() -> Iterator[None]:
    """Matrix products in true float32 while inside: ``distance_error_bound`` assumes no TF32 or bfloat16 shortcuts."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def pack_signs(embeddings: Tensor) -> Tensor:
    """Bits ``x > 0`` packed 8 per byte (most significant bit first, like ``numpy.packbits``), seed 002 section 4.3."""
    bits = embeddings > 0
    num_rows, dim = bits.shape
    padded = torch.zeros(num_rows, 8 * math.ceil(dim / 8), dtype=torch.uint8, device=bits.device)
    padded[:, :dim] = bits
    weights = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8, device=bits.device)
    return (padded.view(num_rows, -1, 8) * weights).sum(dim=-1, dtype=torch.uint8)


def unpack_signs(packed: Tensor, dim: int) -> Tensor:
    """Inverse of ``pack_signs``: bool ``[N, dim]``."""
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8, device=packed.device)
    bits = (packed.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(packed.shape[0], -1)[:, :dim].bool()


def prepare(embeddings: Tensor, *, normalize: bool, binarize: bool) -> KnnIndex:
    """Build the ``KnnIndex`` of float64 ``embeddings`` ``[N, D]`` (already validated finite) on their device."""
    num_rows, dim = embeddings.shape
    if binarize:
        packed = pack_signs(embeddings)
        signs = unpack_signs(packed, dim).to(torch.float32) * 2.0 - 1.0
        return KnnIndex(signs, signs, packed, True, dim, True, None)
    if normalize:
        unit = torch.nn.functional.normalize(embeddings, dim=1)
        rows = unit.to(torch.float32)
        return KnnIndex(rows, rows, unit, False, dim, True, None)
    # A power-of-two scale is exact, keeps float32 away from overflow and leaves every ranking unchanged.
    max_norm = float(embeddings.norm(dim=1).max())
    scale = 2.0 ** -math.ceil(math.log2(max_norm)) if max_norm > 0 else 1.0
    scaled = embeddings * scale
    squared_norms = scaled.square().sum(dim=1)
    ones = torch.ones(num_rows, 1, dtype=torch.float64, device=embeddings.device)
    queries = torch.cat([scaled, ones], dim=1).to(torch.float32)
    references = torch.cat([scaled, -0.5 * squared_norms.unsqueeze(1)], dim=1).to(torch.float32)
    return KnnIndex(queries, references, scaled, False, dim, False, squared_norms, scale)
