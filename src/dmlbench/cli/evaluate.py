"""``dmlbench evaluate``: metrics of a finished run, or of embeddings stored as ``.npy`` files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dmlbench.cli.common import Command
from dmlbench.errors import UserInputError
from dmlbench.files import atomic_write, load_array

if TYPE_CHECKING:
    import numpy as np


def register(app: typer.Typer) -> None:
    app.command("evaluate", cls=Command)(evaluate_command)


def _parse_ks(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserInputError(f"--ks must be a comma-separated list of integers, got {text!r}") from None


def evaluate_command(
    run: Annotated[Path | None, typer.Argument(help="A training run directory.")] = None,
    embeddings: Annotated[list[Path] | None, typer.Option("--embeddings", help="Embeddings [N, D] (.npy); repeat for several models.")] = None,
    labels: Annotated[Path | None, typer.Option("--labels", help="Integer labels [N] (.npy).")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the results as JSON here.")] = None,
    metrics: Annotated[str | None, typer.Option("--metrics", help="Comma-separated subset, e.g. map_at_r,recall_at_1.")] = None,
    ks: Annotated[str, typer.Option("--ks", help="K values of the default recall_at_<k> metrics.")] = "1,2,4,8",
    query_mask: Annotated[Path | None, typer.Option("--query-mask", help="Bool [N] (.npy): queries; the rest is the gallery.")] = None,
    backend: Annotated[str, typer.Option(help="torch, faiss (exact), faiss_approx (inverted lists) or faiss_hnsw (graph).")] = "torch",
    binarize: Annotated[bool, typer.Option("--binarize", help="Sign bits and Hamming distance.")] = False,
    normalize: Annotated[bool, typer.Option("--normalize/--no-normalize", help="L2-normalise before searching.")] = True,
    k: Annotated[int | None, typer.Option("--k", help="Neighbours per query (default: the largest class size).")] = None,
    seed: Annotated[int | None, typer.Option(help="k-means seed (default 0, or the run's seed).")] = None,
    block_size: Annotated[int | None, typer.Option(help="Rows per block of the torch engine.")] = None,
    nprobe: Annotated[int | None, typer.Option(help="Inverted lists probed by faiss_approx.")] = None,
    mode: Annotated[str, typer.Option(help="Several --embeddings: concatenated or separated.")] = "concatenated",
    analysis: Annotated[bool, typer.Option("--analysis", help="Also print rho and the pi distance ratios.")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="With --analysis: spectrum plot path (PNG).")] = None,
    drop: Annotated[int, typer.Option(help="Largest singular values left out of rho.")] = 1,
    center: Annotated[bool, typer.Option("--center", help="Center the embeddings before the SVD.")] = False,
    per_query: Annotated[Path | None, typer.Option("--per-query", help="RUN: write each test query's label, first correct rank and AP@R (CSV).")] = None,
    worst: Annotated[int | None, typer.Option("--worst", help="RUN: show the N queries with the lowest AP@R (with --html).")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="With --worst: the page of those queries and their neighbours.")] = None,
    verification: Annotated[bool, typer.Option("--verification", help="RUN: thresholds and FNMR at target false match rates.")] = False,
    roc: Annotated[Path | None, typer.Option("--roc", help="With --verification: plot FNMR against FMR here (PNG).")] = None,
) -> None:
    """Retrieval and clustering metrics as a table (and JSON with --json)."""
    from dmlbench import evaluation
    from dmlbench.evaluation.table import format_table

    _check_options(run, embeddings, per_query, worst, html, verification, roc)
    for option, target in (("--json", json_path), ("--per-query", per_query), ("--html", html), ("--roc", roc)):
        _check_writable(option, target)
    options: dict[str, Any] = {"ks": _parse_ks(ks), "backend": backend, "binarize": binarize, "normalize": normalize}
    for name, value in (("metrics", metrics), ("k", k), ("seed", seed), ("block_size", block_size), ("nprobe", nprobe)):
        if value is not None:
            options[name] = value
    if query_mask is not None:
        options["query_mask"] = load_array(query_mask, "query mask")

    if run is not None:
        results = _evaluate_run(run, options)
        if analysis:
            from dmlbench.training.runs import embed_run

            # Roth et al. 2020 measure the embedding space on the training data, never on the test split.
            train_embeddings, train_labels = embed_run(run, "train")
            results = {**results, "analysis": _analyze(train_embeddings, train_labels, drop, center, normalize, plot, "train split")}
        if per_query or worst or verification:
            results = {**results, **_diagnose(run, per_query, worst, html, verification, roc, seed)}
        _write_json(json_path, results)
        return

    if labels is None:
        raise UserInputError("--embeddings needs --labels")
    label_array = load_array(labels, "labels")
    matrices = {str(path): load_array(path, "embeddings") for path in embeddings or []}
    if len(matrices) == 1:
        results: dict[str, Any] = evaluation.evaluate(next(iter(matrices.values())), label_array, **options)
    else:
        results = evaluation.evaluate_many(matrices, label_array, mode=mode, **options)
    typer.echo(format_table(results))
    if analysis:
        import numpy as np

        arrays = list(matrices.values())
        # Several models are analysed as evaluated: each L2-normalised, then concatenated.
        combined = arrays[0] if len(arrays) == 1 else np.concatenate([_unit_rows(array) for array in arrays], axis=1)
        results = {**results, "analysis": _analyze(combined, label_array, drop, center, normalize, plot, "analysis")}
    _write_json(json_path, results)


def _check_options(
    run: Path | None, embeddings: list[Path] | None, per_query: Path | None, worst: int | None, html: Path | None,
    verification: bool, roc: Path | None,
) -> None:
    """The combinations of options that make sense; a one-line error for any other."""
    if (run is None) == (not embeddings):
        raise UserInputError("give either a RUN directory or --embeddings E.npy --labels L.npy")
    if run is None and (per_query or worst or verification):
        raise UserInputError("--per-query, --worst and --verification evaluate a RUN's test split")
    if (worst is None) != (html is None):
        raise UserInputError("--worst N and --html OUT.html go together")
    if roc is not None and not verification:
        raise UserInputError("--roc goes with --verification")


def _evaluate_run(run: Path, options: dict[str, Any]) -> dict[str, Any]:
    """A run's test scores, trained and untrained, printed as a table; only options changed from their
    defaults are passed on, so the run's own evaluation settings hold otherwise."""
    from dmlbench.evaluation.table import format_table
    from dmlbench.training.runs import evaluate_run

    run_defaults = {"ks": (1, 2, 4, 8), "backend": "torch", "binarize": False, "normalize": True}
    changed = {name: value for name, value in options.items() if run_defaults.get(name, object()) != value}
    results = evaluate_run(run, **changed)
    trained = {name: value for name, value in results.items() if name != "untrained"}
    typer.echo(format_table({"trained": trained, "untrained": results.get("untrained", {})}))
    return results


def _analyze(
    embeddings: Any, labels: Any, drop: int, center: bool, normalize: bool, plot: Path | None, title: str
) -> dict[str, Any]:
    """rho, pi_intra, pi_inter, pi_ratio printed as a table, the spectrum optionally plotted."""
    from dmlbench.evaluation import embedding_space
    from dmlbench.evaluation.table import format_table

    space = embedding_space.analyze(embeddings, labels, drop=drop, center=center, normalize=normalize)
    typer.echo("")
    typer.echo(format_table({title: {key: value for key, value in space.items() if key != "singular_values"}}))
    if plot is not None:
        embedding_space.plot_spectrum(space["singular_values"], plot, drop=drop)
        typer.echo(f"spectrum plot: {plot}")
    return space


def _diagnose(
    run: Path, per_query_path: Path | None, worst: int | None, html: Path | None, verification: bool, roc: Path | None,
    seed: int | None,
) -> dict[str, Any]:
    """Per-query results, the worst queries' page and verification thresholds of the run's test split."""
    from dmlbench.deploy import diagnostics
    from dmlbench.evaluation.per_query import per_query
    from dmlbench.evaluation.table import format_table

    split = diagnostics.load_test_split(run)
    added: dict[str, Any] = {}
    if per_query_path is not None or worst is not None:
        found = per_query(split.embeddings, split.labels, query_mask=split.query_mask)
        if per_query_path is not None:
            diagnostics.write_per_query_csv(per_query_path, found, split.names)
            typer.echo(f"per-query results: {per_query_path} ({len(found.query_ids)} queries)")
        if worst is not None and html is not None:
            diagnostics.write_worst_page(html, found, split, worst, f"The {worst} worst test queries of {run}")
            typer.echo(f"worst queries: {html}")
    if verification:
        summary = diagnostics.verification_summary(split, roc, 0 if seed is None else seed)
        lines = {
            f"FMR {point['target_fmr']:g}": {"threshold": point["threshold"], "fmr": point["fmr"], "fnmr": point["fnmr"]}
            for point in summary["operating_points"]
        }
        typer.echo("")
        typer.echo(format_table(lines))
        typer.echo(
            f"equal error rate {summary['equal_error_rate']:.4f} over {_pairs_used(summary, 'positive')} and "
            f"{_pairs_used(summary, 'negative')}" + (f"; ROC: {roc}" if roc is not None else "")
        )
        added["verification"] = summary
    return added


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    import numpy as np

    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2:
        raise UserInputError(f"embeddings must have shape [N, D]; got {list(matrix.shape)}")
    return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)


def _check_writable(option: str, path: Path | None) -> None:
    """Fail before any work when the file an ``option`` names cannot be written."""
    if path is None:
        return
    if path.is_dir():
        raise UserInputError(f"{option} {path} is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path.parent / f".{path.name}.probe", lambda stream: None)
        (path.parent / f".{path.name}.probe").unlink()
    except OSError as error:
        raise UserInputError(f"cannot write {option} {path}: {error.strerror or error}") from None


def _write_json(path: Path | None, results: dict[str, Any]) -> None:
    if path is None:
        return
    text = json.dumps(results, indent=2) + "\n"
    atomic_write(path, lambda stream: stream.write(text.encode()))


def _pairs_used(summary: dict[str, Any], kind: str) -> str:
    """``all 160,210 positive pairs`` or ``2,000,000 of 51,042,345 negative pairs (sampled without replacement, seed 0)``."""
    used, total = summary[f"{kind}_pairs"], summary[f"{kind}_pairs_total"]
    if used == total:
        return f"all {total:,} {kind} pairs"
    return f"{used:,} of {total:,} {kind} pairs (sampled without replacement, seed {summary['seed']})"
