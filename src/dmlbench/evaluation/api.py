"""``evaluate``: retrieval and clustering metrics of one embedding matrix; ``evaluate_many`` for several models."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dmlbench.errors import UserInputError
from dmlbench.evaluation import clustering
from dmlbench.evaluation.knn_index import KnnIndex, prepare
from dmlbench.evaluation.metrics import METRICS, QueryLayout
from dmlbench.evaluation.neighbors import Neighbors, nearest_neighbors
from dmlbench.evaluation.rerank import KReciprocal, QueryExpansion, Reranking, build, reranked_neighbors, validate_combination
from dmlbench.validation import check_positive_int

# The built-in metrics by name (``recall_at_<k>`` aside); ``evaluation.metrics.METRICS`` holds every one.
RETRIEVAL_METRICS = tuple(name for name in METRICS.listing()
                          if (metric := METRICS.entry(name)) is not None and not metric.is_clustering)
CLUSTERING_METRICS = tuple(name for name in METRICS.listing()
                           if (metric := METRICS.entry(name)) is not None and metric.is_clustering)
COUNT_KEYS = ("num_queries", "num_queries_without_match")
DEFAULT_KS = (1, 2, 4, 8)
MODES = ("concatenated", "separated")


def default_metrics(ks: Sequence[int] = DEFAULT_KS) -> list[str]:
    """Every metric except ``map_at_1000`` (it needs 1000 neighbours per query; ask for it by name)."""
    return ["precision_at_1", *(f"recall_at_{k}" for k in ks), "r_precision", "map_at_r", "map_at_c", "mrr",
            *CLUSTERING_METRICS]


def available_metrics() -> list[str]:
    """Every registered metric, plugins' included; ``recall_at_<k>`` stands for its family."""
    return METRICS.listing()


def evaluate(
    embeddings: Tensor | np.ndarray,
    labels: Tensor | np.ndarray | Sequence[int],
    *,
    metrics: Iterable[str] | None = None,
    ks: Sequence[int] = DEFAULT_KS,
    query_mask: Tensor | np.ndarray | None = None,
    backend: str = "torch",
    binarize: bool = False,
    normalize: bool = True,
    k: int | None = None,
    seed: int = 0,
    block_size: int | None = None,
    kmeans_iterations: int = clustering.DEFAULT_KMEANS_ITERATIONS,
    nprobe: int | None = None,
    domains: Tensor | np.ndarray | Sequence[Any] | None = None,
    rerank: Reranking | Mapping[str, Any] | str | None = None,
    device: torch.device | str | None = None,
) -> dict[str, float | int]:
    """Metrics of ``embeddings`` ``[N, D]`` with integer ``labels`` ``[N]`` (definitions: docs/decisions.md).

    Queries are the references (each query excluded from its own list) unless ``query_mask``
    (bool ``[N]``) marks the queries; the rest is then the gallery. With ``domains`` (one value per
    row: a vendor, a camera, ...) retrieval is cross-domain: each query's gallery holds only the
    references of the other domains, and R counts only those (clustering ignores domains). Distances are Euclidean on
    L2-normalised embeddings (``normalize=False``: as given), or Hamming on the signs with
    ``binarize``. ``metrics`` names a subset (``recall_at_<k>`` for any k; default
    ``default_metrics(ks)``); ``k`` neighbours are retrieved (default: the largest class size).
    Every metric is a ``float``. Retrieval metrics come with two counts (``int``), ``num_queries`` and
    ``num_queries_without_match`` (queries whose label has no reference, left out of all retrieval
    averages except mAP@C and mAP@1000).
    Clustering metrics run faiss k-means (``seed``, ``kmeans_iterations``) on all N rows with as
    many clusters as classes. Neighbours are exact and ordered by (distance, index) for every
    ``backend`` except ``faiss_approx`` (inverted lists, ``nprobe`` probes) and ``faiss_hnsw`` (a
    graph built by one thread, so that it is reproducible).
    ``rerank`` (``evaluation.rerank.build``'s result, or ``{"kind": ..., "params": {...}}``) re-ranks
    every query's list before the retrieval metrics (exact; not with ``binarize``, ``normalize=False``,
    ``domains``, another ``backend`` or ``block_size``); clustering metrics stay on the embeddings.
    ``device``: where the exact neighbour search runs (default: the device ``embeddings`` are on; the
    CPU for arrays); on a GPU the numbers are the CPU's, ties included. Faiss backends, re-ranking
    and clustering run on the CPU.
    """
    names = _parse_metrics(metrics, ks)
    method = _as_reranking(rerank, binarize=binarize, normalize=normalize, domains=domains, backend=backend,
                           block_size=block_size)
    for name, value in (("block_size", block_size), ("nprobe", nprobe)):
        if value is not None:
            check_positive_int(name, value)
    search_device = _search_device(embeddings, device, backend=backend, rerank=method)
    space = prepare(_as_embeddings(embeddings, device=search_device), normalize=normalize, binarize=binarize)
    label_tensor = _as_labels(labels, space.num_rows)
    if len(torch.unique(label_tensor)) < 2:
        raise UserInputError("labels contain a single class; evaluation needs at least 2 classes")
    results: dict[str, float | int] = {}
    retrieval_names = [name for name in names if not METRICS.get(name).is_clustering]
    if retrieval_names:
        mask = _as_query_mask(query_mask, space.num_rows)
        domain_codes = as_domain_codes(domains, space.num_rows)
        results.update(_retrieval(space, label_tensor, mask, retrieval_names, k, backend, block_size, nprobe, seed,
                                  domain_codes, method))
    clustering_names = [name for name in names if METRICS.get(name).is_clustering]
    if clustering_names:
        results.update(_clustering(space, label_tensor, clustering_names, seed, kmeans_iterations))
    ordered = {name: results[name] for name in names}
    ordered.update({key: results[key] for key in COUNT_KEYS if key in results})
    return ordered


def evaluate_many(
    embeddings: Mapping[str, Tensor | np.ndarray],
    labels: Tensor | np.ndarray | Sequence[int],
    *,
    mode: str = "concatenated",
    **evaluate_kwargs: Any,
) -> dict[str, float | int]:
    """Several models' embeddings of the same samples, Musgrave et al. 2020 section 3.3.

    ``concatenated``: each model's embeddings L2-normalised, concatenated, then evaluated (and
    normalised again when ``normalize``). ``separated``: each evaluated alone, metrics averaged.
    """
    if mode not in MODES:
        raise UserInputError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    if not embeddings:
        raise UserInputError("evaluate_many needs at least one embedding matrix")
    matrices = {name: _as_embeddings(value, name=f"embeddings[{name!r}]") for name, value in embeddings.items()}
    sizes = {len(matrix) for matrix in matrices.values()}
    if len(sizes) > 1:
        raise UserInputError(f"all embedding matrices must have the same number of rows; got {sorted(sizes)}")
    if mode == "concatenated":
        return evaluate(concatenate(matrices.values()), labels, **evaluate_kwargs)
    per_model = [evaluate(matrix, labels, **evaluate_kwargs) for matrix in matrices.values()]
    return {key: (value if key in COUNT_KEYS else float(np.mean([result[key] for result in per_model])))
            for key, value in per_model[0].items()}


def concatenate(matrices: Iterable[Tensor]) -> Tensor:
    """Several models' embeddings of the same rows, each L2-normalised in float64, side by side: the
    concatenated mode of Musgrave et al. 2020 section 3.3."""
    return torch.cat([torch.nn.functional.normalize(matrix.detach().cpu().to(torch.float64), dim=1) for matrix in matrices], dim=1)


def _retrieval(
    space: KnnIndex,
    labels: Tensor,
    query_mask: Tensor | None,
    names: list[str],
    k: int | None,
    backend: str,
    block_size: int | None,
    nprobe: int | None,
    seed: int,
    domains: Tensor | None = None,
    rerank: Reranking | None = None,
) -> dict[str, float | int]:
    layout = query_layout(labels, query_mask, domains)
    query_ids, reference_ids, relevant = layout.query_ids, layout.reference_ids, layout.relevant
    largest_class, available = layout.largest_class, layout.available
    needs = {name: METRICS.get(name).neighbours(layout) for name in names}
    if k is None:
        k = max(largest_class, *needs.values())
    else:
        check_positive_int("k", k)
        if k > available:
            raise UserInputError(f"k={k} exceeds the {available} references available per query")
        for name, needed in needs.items():
            if k < needed:
                raise UserInputError(f"k={k} is too small for {name}, which needs {needed} neighbours")
    if rerank is not None:  # the float64 unit rows, re-ranked by their own exact search
        neighbours = reranked_neighbors(space.exact_rows, query_ids, reference_ids, k,
                                        exclude_self=layout.self_retrieval, method=rerank)
    else:
        neighbours = nearest_neighbors(
            space, query_ids, reference_ids, k, exclude_self=layout.self_retrieval,
            backend=backend, block_size=block_size, nprobe=nprobe, seed=seed, domains=domains,
        )
    # Counted on the CPU: the lists are small next to the search, and metric plugins get CPU tensors.
    neighbours = Neighbors(neighbours.ids.cpu(), neighbours.distances.cpu())
    # An approximate backend may find fewer than k neighbours for a query; the missing ones (-1) are misses.
    hits = (neighbours.ids >= 0) & (labels[neighbours.ids.clamp_min(0)] == labels[query_ids].unsqueeze(1))
    results = {name: METRICS.get(name).compute(hits, layout) for name in names}
    results["num_queries"] = len(query_ids)
    results["num_queries_without_match"] = int((relevant == 0).sum())
    return results


def query_layout(labels: Tensor, query_mask: Tensor | None, domains: Tensor | None = None) -> QueryLayout:
    """All rows query all others (``query_mask`` ``None``), or the masked rows query the rest; with
    ``domains`` (int64 codes) a query's references are only those of the other domains."""
    if query_mask is None:
        query_ids = reference_ids = torch.arange(len(labels))
    else:
        query_ids, reference_ids = torch.nonzero(query_mask).squeeze(1), torch.nonzero(~query_mask).squeeze(1)
    if domains is not None:
        return _cross_domain_layout(labels, query_ids, reference_ids, domains)
    self_retrieval = query_mask is None
    query_labels = labels[query_ids]
    classes, reference_counts = torch.unique(labels[reference_ids], return_counts=True)
    position = torch.searchsorted(classes, query_labels).clamp_max(len(classes) - 1)
    counts = torch.where(classes[position] == query_labels, reference_counts[position], 0)
    relevant = counts - 1 if self_retrieval else counts
    if not bool((relevant > 0).any()):
        raise UserInputError("no query has a reference with its label; retrieval metrics are undefined")
    available = len(reference_ids) - int(self_retrieval)
    largest_class = min(available, int(reference_counts.max()))
    return QueryLayout(query_ids, reference_ids, relevant, counts, self_retrieval, largest_class, available)


def _cross_domain_layout(labels: Tensor, query_ids: Tensor, reference_ids: Tensor, domains: Tensor) -> QueryLayout:
    """The layout when each query's gallery excludes its own domain (so never holds the query itself)."""
    num_domains = int(domains.max()) + 1
    num_classes = int(labels.max()) + 1
    # counts[d, c]: references of domain d and class c; a query of domain d sees the column sums minus row d.
    counts = torch.zeros(num_domains, num_classes, dtype=torch.int64)
    counts.index_put_((domains[reference_ids], labels[reference_ids]), torch.ones(len(reference_ids), dtype=torch.int64),
                      accumulate=True)
    outside = counts.sum(dim=0, keepdim=True) - counts  # [d, c]: references of class c outside domain d
    query_domains = domains[query_ids]
    relevant = outside[query_domains, labels[query_ids]]
    present = torch.unique(query_domains)
    available = int((len(reference_ids) - counts.sum(dim=1))[present].min())
    if available < 1:
        raise UserInputError("the queries of a domain have no reference in another domain; cross-domain evaluation needs at least 2 domains")
    if not bool((relevant > 0).any()):
        raise UserInputError("no query has a reference with its label in another domain; cross-domain retrieval metrics are undefined")
    largest_class = min(available, int(outside[present].max()))
    return QueryLayout(query_ids, reference_ids, relevant, relevant, False, largest_class, available)


def as_domain_codes(domains: Any, num_rows: int) -> Tensor | None:
    """One int64 code per row (the sorted order of the distinct domain values), or ``None``."""
    if domains is None:
        return None
    array = np.asarray(domains.detach().cpu() if isinstance(domains, Tensor) else domains)
    if array.shape != (num_rows,):
        raise UserInputError(f"domains must have one value per row ({num_rows}); got shape {list(array.shape)}")
    if array.dtype.kind not in "biuU":
        raise UserInputError(f"domains must be integers or strings; got dtype {array.dtype}")
    _, codes = np.unique(array, return_inverse=True)
    return torch.from_numpy(codes.reshape(-1).astype(np.int64))


def _as_reranking(
    rerank: Reranking | Mapping[str, Any] | str | None, *, binarize: bool, normalize: bool, domains: Any, backend: str,
    block_size: int | None,
) -> Reranking | None:
    """The re-ranking ``evaluate`` was given, validated; the combinations it cannot honour exactly are refused."""
    if isinstance(rerank, Mapping):
        unknown = sorted(set(rerank) - {"kind", "params"})
        if unknown or not isinstance(rerank.get("params", {}), Mapping):
            raise UserInputError("rerank must be {'kind': KIND, 'params': {...}}" + (f"; got key {unknown[0]!r}" if unknown else ""))
        rerank = build(str(rerank.get("kind", "none")), **dict(rerank.get("params", {})))
    elif isinstance(rerank, str):
        rerank = build(rerank)
    if rerank is None:
        return None
    if not isinstance(rerank, (QueryExpansion, KReciprocal)):
        raise UserInputError(f"rerank must be a re-ranking kind, mapping or rerank.build(...); got {type(rerank).__name__}")
    validate_combination(binarize=binarize, normalize=normalize)
    if domains is not None:
        raise UserInputError("re-ranking is not defined for cross-domain retrieval (domains=); evaluate one or the other")
    if backend != "torch" or block_size is not None:
        raise UserInputError("re-ranking searches exactly with its own blocks; drop backend and block_size")
    return rerank


def _clustering(space: KnnIndex, labels: Tensor, names: list[str], seed: int, iterations: int) -> dict[str, float]:
    check_positive_int("kmeans_iterations", iterations)
    label_array = labels.numpy()
    clusters = clustering.kmeans_assignment(
        space.search_rows.cpu(), len(np.unique(label_array)), seed=seed, iterations=iterations
    )
    return {name: METRICS.get(name).compute(label_array, clusters) for name in names}


def _parse_metrics(metrics: Iterable[str] | None, ks: Sequence[int]) -> list[str]:
    for value in ks:
        check_positive_int("ks", value)
    if metrics is None:
        return default_metrics(ks)
    if isinstance(metrics, str):
        metrics = [part.strip() for part in metrics.split(",") if part.strip()]
    names = list(dict.fromkeys(metrics))
    for name in names:
        if not isinstance(name, str) or name not in METRICS:
            raise UserInputError(f"unknown metric {name!r}; known: {', '.join(available_metrics())}")
    if not names:
        raise UserInputError("metrics selects nothing; known: " + ", ".join(available_metrics()))
    return names


def _search_device(embeddings: Any, device: torch.device | str | None, *, backend: str,
                   rerank: Reranking | None) -> torch.device:
    """Where ``evaluate`` searches: ``device``, else the embeddings' own; the CPU for faiss, re-ranking and MPS."""
    if device is not None:
        try:
            device = torch.device(device)
        except RuntimeError:
            raise UserInputError(f"device={device!r} is not a device (cpu, cuda, cuda:N)") from None
    else:
        device = embeddings.device if isinstance(embeddings, Tensor) else torch.device("cpu")
    # The exact keys are float64, which MPS lacks.
    if backend != "torch" or rerank is not None or device.type == "mps":
        return torch.device("cpu")
    return device


def _as_embeddings(embeddings: Any, name: str = "embeddings", device: torch.device | None = None) -> Tensor:
    """``embeddings`` as a validated float64 ``[N, D]`` tensor on ``device`` (default: the CPU)."""
    if isinstance(embeddings, Tensor):
        data = embeddings.detach().to(device or "cpu")
    else:
        try:
            # Contiguous: torch refuses the negative strides of a reversed view (``x[:, ::-1]``).
            data = torch.as_tensor(np.require(embeddings, requirements="C"))
        except (TypeError, ValueError) as error:
            raise UserInputError(f"{name} must be a numeric array [N, D]: {error}") from None
        data = data.to(device or "cpu")
    if data.ndim != 2 or data.shape[0] < 2 or data.shape[1] < 1:
        raise UserInputError(f"{name} must have shape [N, D] with N >= 2 and D >= 1; got {list(data.shape)}")
    if not (data.dtype.is_floating_point or data.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)):
        raise UserInputError(f"{name} must be a real numeric array; got dtype {data.dtype}")
    data = data.to(torch.float64)
    if not bool(torch.isfinite(data).all()):
        bad = int((~torch.isfinite(data)).any(dim=1).sum())
        raise UserInputError(f"{name} contain NaN or Inf values (in {bad} rows)")
    return data


def _as_labels(labels: Any, num_rows: int) -> Tensor:
    array = np.asarray(labels.detach().cpu() if isinstance(labels, Tensor) else labels)
    if array.ndim != 1:
        raise UserInputError(f"labels must be one-dimensional [N]; got shape {list(array.shape)}")
    if len(array) != num_rows:
        raise UserInputError(f"embeddings have {num_rows} rows but labels have {len(array)} entries")
    if not (np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_):
        raise UserInputError(f"labels must be integers; got dtype {array.dtype}")
    return torch.from_numpy(array.astype(np.int64))


def _as_query_mask(query_mask: Any, num_rows: int) -> Tensor | None:
    if query_mask is None:
        return None
    array = np.asarray(query_mask.detach().cpu() if isinstance(query_mask, Tensor) else query_mask)
    if array.dtype != np.bool_ or array.shape != (num_rows,):
        raise UserInputError(f"query_mask must be a bool array of shape [{num_rows}]; got {array.dtype} {list(array.shape)}")
    if not array.any():
        raise UserInputError("query_mask selects no query")
    if array.all():
        raise UserInputError("query_mask selects every row, which leaves no gallery")
    return torch.from_numpy(array.copy())
