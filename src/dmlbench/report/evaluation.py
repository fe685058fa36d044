"""What ``dmlbench evaluate`` reports: a finished run evaluated in one pass (``RunEvaluation``: each split
embedded once) or stored embedding files. Each section of the results (the JSON the command writes) is
printed as a table once it is computed (``evaluation.table.section_text``; together ``evaluation_text``), so
a long verification or open set follows scores already shown; then a line for each file written."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dmlbench.errors import UserInputError

Echo = Callable[[str], None]


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
    """The request's results computed and returned, its files written, and every table printed through ``echo``."""
    from dmlbench.evaluation.table import EVALUATION_SECTIONS

    printer = _SectionPrinter(echo, of_run=request.run is not None)
    if request.run is not None:
        results, written = _of_run(request, printer)
    else:  # stored embeddings score quickly: their sections are printed together at the end
        results, written = _of_files(request)
        for section in EVALUATION_SECTIONS:
            printer.show(results, section)
    for line in written:
        echo(line)
    return results


class _SectionPrinter:
    """Prints sections of the results with ``evaluation_text``'s spacing: a blank line before each one but the first."""

    def __init__(self, echo: Echo, *, of_run: bool) -> None:
        self.echo, self.of_run = echo, of_run
        self.any_lines = False  # whether a section printed lines yet

    def show(self, results: dict[str, Any], section: str) -> None:
        from dmlbench.evaluation.table import section_text

        lines = section_text(results, section, of_run=self.of_run)
        for line in ["", *lines] if self.any_lines and lines else lines:
            self.echo(line)
        self.any_lines = self.any_lines or bool(lines)


def _of_run(request: EvaluateRequest, printer: _SectionPrinter) -> tuple[dict[str, Any], list[str]]:
    """The run's scores, then the analysis, verification, open set and per-query diagnostics asked for, each
    from the embeddings the ``RunEvaluation`` made once and printed once computed, and the files they write."""
    from dmlbench.evaluation import embedding_space, verification
    from dmlbench.evaluation.open_set import open_set
    from dmlbench.evaluation.per_query import per_query
    from dmlbench.training.run_evaluation import RunEvaluation

    assert request.run is not None
    calibrated = None
    if request.calibration is not None:  # a calibration of another model is refused before anything is evaluated
        from dmlbench.deploy.calibration import run_thresholds

        calibrated = run_thresholds(request.calibration, request.run)
    run = RunEvaluation.open(request.run)
    results = dict(run.scores(**request.options))
    printer.show(results, "scores")
    seed = 0 if request.seed is None else request.seed
    diagnosed = request.per_query is not None or request.worst is not None
    # Roth et al. 2020 measure the embedding space on the training data, never on the test split.
    train = run.embedded("train") if request.analysis else None
    test = run.test_split() if request.verification or request.open_set or diagnosed else None
    written: list[str] = []
    if train is not None:
        results["analysis"] = embedding_space.analyze(*train, drop=request.drop, center=request.center,
                                                      normalize=request.options.get("normalize", True))
        if request.plot is not None:
            embedding_space.plot_spectrum(results["analysis"]["singular_values"], request.plot, drop=request.drop)
            written.append(f"spectrum plot: {request.plot}")
    printer.show(results, "analysis")
    if test is not None and request.verification:
        pairs = verification.pair_distances(test.embeddings, test.labels, seed=seed)
        results["verification"] = {**verification.summarize(pairs), "seed": seed}
        if request.roc is not None:
            request.roc.parent.mkdir(parents=True, exist_ok=True)
            verification.plot_roc(pairs, request.roc)
            written.append(f"ROC: {request.roc}")
    printer.show(results, "verification")
    if test is not None and request.open_set:
        mask = None if test.query_mask is None else test.query_mask.numpy()
        results["open_set"] = open_set(test.embeddings, test.labels, calibrated=calibrated, seed=seed, query_mask=mask)
    printer.show(results, "open_set")
    if test is not None and diagnosed:
        from dmlbench.deploy import diagnostics

        found = per_query(test.embeddings, test.labels, query_mask=test.query_mask)
        worst = None if request.worst is None else found.worst(request.worst)
        written += diagnostics.write(found, test, request.per_query, worst, request.html,
                                     f"The {request.worst} worst test queries of {request.run}")
    return results, written


def _of_files(request: EvaluateRequest) -> tuple[dict[str, Any], list[str]]:
    """Metrics of stored embeddings; with ``domains`` also cross-domain and with ``rerank`` also re-ranked,
    beside them; several models analysed as evaluated (each L2-normalised, then concatenated)."""
    import torch

    from dmlbench import evaluation
    from dmlbench.evaluation import embedding_space
    from dmlbench.files import load_array

    if request.labels is None:
        raise UserInputError("EvaluateRequest.labels is required with embeddings")
    labels = load_array(request.labels, "labels")
    matrices = {str(path): load_array(path, "embeddings") for path in request.embeddings}
    options = dict(request.options)
    rerank = options.pop("rerank", None)

    def score(**extra: Any) -> dict[str, Any]:
        if len(matrices) == 1:
            return dict(evaluation.evaluate(next(iter(matrices.values())), labels, **options, **extra))
        return dict(evaluation.evaluate_many(matrices, labels, mode=request.mode, **options, **extra))

    results = score()
    if rerank is not None and rerank["kind"] != "none":
        results["reranked"] = score(rerank=rerank)
    if request.domains is not None:  # answered from the other domains only
        results["cross_domain"] = score(domains=load_array(request.domains, "domains"))
    if not request.analysis:
        return results, []
    arrays = list(matrices.values())
    combined = arrays[0] if len(arrays) == 1 else evaluation.concatenate(torch.as_tensor(array) for array in arrays)
    results["analysis"] = embedding_space.analyze(combined, labels, drop=request.drop, center=request.center,
                                                  normalize=request.options.get("normalize", True))
    if request.plot is None:
        return results, []
    embedding_space.plot_spectrum(results["analysis"]["singular_values"], request.plot, drop=request.drop)
    return results, [f"spectrum plot: {request.plot}"]
