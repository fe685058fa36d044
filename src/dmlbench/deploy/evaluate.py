"""``dmlbench evaluate`` as one call: a finished run evaluated in one pass (``RunEvaluation``: each split
embedded once) or stored embedding files, every table printed, every requested file written, and the
results returned as the JSON the command writes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dmlbench.errors import UserInputError
from dmlbench.files import load_array

Echo = Callable[[str], None]
EXTRA_COLUMNS = ("untrained", "reranked", "untrained_reranked", "cross_domain", "untrained_cross_domain")


@dataclass(frozen=True)
class EvaluateRequest:
    """What ``dmlbench evaluate`` was asked for: a ``run`` or ``embeddings`` with ``labels``, the options of
    ``evaluation.evaluate`` (``rerank`` among them), and the extra outputs."""

    run: Path | None = None
    embeddings: list[Path] = field(default_factory=list)
    labels: Path | None = None
    domains: Path | None = None
    mode: str = "concatenated"
    options: dict[str, Any] = field(default_factory=dict)
    analysis: bool = False
    plot: Path | None = None
    drop: int = 1
    center: bool = False
    per_query: Path | None = None
    worst: int | None = None
    html: Path | None = None
    verification: bool = False
    roc: Path | None = None
    open_set: bool = False
    calibration: Path | None = None
    seed: int | None = None


def evaluate(request: EvaluateRequest, echo: Echo) -> dict[str, Any]:
    """Every table of the request printed through ``echo``, its files written; the results returned."""
    if request.run is not None:
        return _evaluate_run(request, echo)
    if request.labels is None:
        raise UserInputError("EvaluateRequest.labels is required with embeddings")
    labels = load_array(request.labels, "labels")
    matrices = {str(path): load_array(path, "embeddings") for path in request.embeddings}
    results = _evaluate_arrays(matrices, labels, request, echo)
    if request.analysis:
        import torch

        from dmlbench.evaluation import concatenate

        arrays = list(matrices.values())
        # Several models are analysed as evaluated: each L2-normalised, then concatenated.
        combined = arrays[0] if len(arrays) == 1 else concatenate(torch.as_tensor(array) for array in arrays)
        space = _space(combined, labels, request)
        _print_space(space, "analysis", request.plot, request.drop, echo)
        results = {**results, "analysis": space}
    return results


def _evaluate_run(request: EvaluateRequest, echo: Echo) -> dict[str, Any]:
    """The run's scores, then the analysis, diagnostics and open set it was asked for, in one pass."""
    from dmlbench.evaluation.table import format_table
    from dmlbench.training.run_evaluation import RunEvaluation

    assert request.run is not None
    run = RunEvaluation.open(request.run)
    results = run.scores(**request.options)
    columns = {"trained": {name: value for name, value in results.items() if name not in EXTRA_COLUMNS}}
    if "reranked" in results:  # --rerank, or the run's config sets evaluation.rerank
        columns["trained, re-ranked"] = results["reranked"]
    columns["untrained"] = results.get("untrained", {})
    if "reranked" in results:
        columns["untrained, re-ranked"] = results["untrained_reranked"]
    if "cross_domain" in results:  # the run's config sets evaluation.cross_domain
        columns.update({"trained, cross-domain": results["cross_domain"], "untrained, cross-domain": results["untrained_cross_domain"]})
    echo(format_table(columns))
    if request.analysis:
        space = run.embedding_space(drop=request.drop, center=request.center, normalize=request.options.get("normalize", True))
        _print_space(space, "train split", request.plot, request.drop, echo)
        results = {**results, "analysis": space}
    seed = 0 if request.seed is None else request.seed
    if request.per_query is not None or request.worst is not None:
        _per_query(run, request, echo)
    if request.verification:
        results = {**results, "verification": _verification(run, request.roc, seed, echo)}
    if request.open_set:
        results = {**results, "open_set": _open_set(run, request.calibration, seed, echo)}
    return results


def _evaluate_arrays(matrices: dict[str, Any], labels: Any, request: EvaluateRequest, echo: Echo) -> dict[str, Any]:
    """Metrics of stored embeddings printed as a table; with ``domains`` also cross-domain, with ``rerank``
    also re-ranked, beside them."""
    from dmlbench import evaluation
    from dmlbench.evaluation.table import format_table

    options = dict(request.options)
    rerank = options.pop("rerank", None)

    def score(extra: dict[str, Any]) -> dict[str, Any]:
        if len(matrices) == 1:
            return evaluation.evaluate(next(iter(matrices.values())), labels, **options, **extra)
        return evaluation.evaluate_many(matrices, labels, mode=request.mode, **options, **extra)

    results = score({})
    columns, added = {"all": results}, {}
    if rerank is not None and rerank["kind"] != "none":
        added["reranked"] = columns["re-ranked"] = score({"rerank": rerank})
    if request.domains is not None:  # answered from the other domains only
        added["cross_domain"] = columns["cross-domain"] = score({"domains": load_array(request.domains, "domains")})
    echo(format_table(columns if added else results))
    return {**results, **added}


def _space(embeddings: Any, labels: Any, request: EvaluateRequest) -> dict[str, Any]:
    from dmlbench.evaluation import embedding_space

    return embedding_space.analyze(embeddings, labels, drop=request.drop, center=request.center,
                                   normalize=request.options.get("normalize", True))


def _print_space(space: dict[str, Any], title: str, plot: Path | None, drop: int, echo: Echo) -> None:
    """rho, pi_intra, pi_inter, pi_ratio printed as a table, the spectrum optionally plotted."""
    from dmlbench.evaluation import embedding_space
    from dmlbench.evaluation.table import format_table

    echo("")
    echo(format_table({title: {key: value for key, value in space.items() if key != "singular_values"}}))
    if plot is not None:
        embedding_space.plot_spectrum(space["singular_values"], plot, drop=drop)
        echo(f"spectrum plot: {plot}")


def _per_query(run: Any, request: EvaluateRequest, echo: Echo) -> None:
    """Per-query results as a CSV file, and the worst queries' page."""
    from dmlbench.deploy import diagnostics

    split, found = run.test_split(), run.per_query()
    if request.per_query is not None:
        diagnostics.write_per_query_csv(request.per_query, found, split.names)
        echo(f"per-query results: {request.per_query} ({len(found.query_ids)} queries)")
    if request.worst is not None and request.html is not None:
        diagnostics.write_worst_page(request.html, found, split, request.worst,
                                     f"The {request.worst} worst test queries of {run.run.run_dir}")
        echo(f"worst queries: {request.html}")


def _verification(run: Any, roc: Path | None, seed: int, echo: Echo) -> dict[str, Any]:
    """Thresholds and FNMR at the target FMRs printed as a table, with the pairs they rest on."""
    from dmlbench.evaluation.table import format_table

    summary = run.verification(seed, roc)
    lines = {f"FMR {point['target_fmr']:g}": {"threshold": point["threshold"], "fmr": point["fmr"], "fnmr": point["fnmr"]}
             for point in summary["operating_points"]}
    echo("")
    echo(format_table(lines))
    echo(f"equal error rate {summary['equal_error_rate']:.4f} over {_pairs_used(summary, 'positive')} and "
         f"{_pairs_used(summary, 'negative')}" + (f"; ROC: {roc}" if roc is not None else ""))
    return summary


def _open_set(run: Any, calibration: Path | None, seed: int, echo: Echo) -> dict[str, Any]:
    """DIR and FAR at the default FAR targets and at the calibrated thresholds, with their 95% intervals."""
    from dmlbench.deploy.calibration import open_set_of_run
    from dmlbench.evaluation.open_set import DEFAULT_FAR_TARGETS

    found = open_set_of_run(run, calibration, DEFAULT_FAR_TARGETS, seed=seed)

    def span(values: list[float] | None) -> str:
        return "[n/a]" if values is None else f"[{values[0]:.3f}, {values[1]:.3f}]"

    echo("")
    echo(f"open set: {found['enrolled_classes']} enrolled classes ({found['gallery_items']} gallery items, "
         f"{found['known_queries']} known queries), {found['unknown_classes']} unknown classes "
         f"({found['unknown_queries']} queries); rank-1 identification {found['rank_1_identification_rate']:.4f}")
    for point in found["at_far"] + found["at_calibrated_threshold"]:
        at = f"FAR {point['target_far']:g}" if "target_far" in point else f"calibrated FMR {point['target_fmr']:g}"
        unreachable = "" if point.get("reachable", True) else " (too few unknown queries for this FAR)"
        echo(f"  {at:>22}: threshold {point['threshold']:.4f}  DIR {point['dir']:.4f} {span(point['dir_ci'])}"
             f"  FAR {point['far']:.4f} {span(point['far_ci'])}{unreachable}")
    return found


def _pairs_used(summary: dict[str, Any], kind: str) -> str:
    """``all 160,210 positive pairs`` or ``2,000,000 of 51,042,345 negative pairs (sampled without replacement, seed 0)``."""
    used, total = summary[f"{kind}_pairs"], summary[f"{kind}_pairs_total"]
    if used == total:
        return f"all {total:,} {kind} pairs"
    return f"{used:,} of {total:,} {kind} pairs (sampled without replacement, seed {summary['seed']})"
