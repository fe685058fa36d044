"""``dmlbench evaluate``: metrics of a finished run, or of embeddings stored as ``.npy`` files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dmlbench.cli.common import QUIET_SILENT_HELP, Command, require_file, require_run_dir
from dmlbench.errors import UserInputError
from dmlbench.files import atomic_write, load_array

if TYPE_CHECKING:
    from dmlbench.training.runs import Run


def register(app: typer.Typer) -> None:
    app.command("evaluate", cls=Command)(evaluate_command)


def _parse_ks(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserInputError(f"--ks must be a comma-separated list of integers, got {text!r}") from None


def evaluate_command(
    run: Annotated[Path | None, typer.Argument(metavar="RUN", help="A training run directory.", show_default=False)] = None,
    embeddings: Annotated[list[Path] | None, typer.Option("--embeddings", metavar="FILE", help="Embeddings [N, D] (.npy); repeat for several models.", show_default=False)] = None,
    labels: Annotated[Path | None, typer.Option("--labels", metavar="FILE", help="Integer labels [N] (.npy).", show_default=False)] = None,
    json_path: Annotated[Path | None, typer.Option("--json", metavar="FILE", help="Write the results as JSON here.", show_default=False)] = None,
    metrics: Annotated[str | None, typer.Option("--metrics", metavar="NAMES", help="Comma-separated subset, e.g. map_at_r,recall_at_1.", show_default=False)] = None,
    ks: Annotated[str, typer.Option("--ks", metavar="K[,K...]", help="K values of the default recall_at_<k> metrics.")] = "1,2,4,8",
    query_mask: Annotated[Path | None, typer.Option("--query-mask", metavar="FILE", help="Bool [N] (.npy): queries; the rest is the gallery.", show_default=False)] = None,
    domains: Annotated[Path | None, typer.Option("--domains", metavar="FILE", help="Domain of each row [N] (.npy, integers or strings): also score each query against the other domains only.", show_default=False)] = None,
    backend: Annotated[str, typer.Option(metavar="NAME", help="torch, faiss (exact), faiss_approx (inverted lists) or faiss_hnsw (graph).")] = "torch",
    binarize: Annotated[bool, typer.Option("--binarize", help="Sign bits and Hamming distance.")] = False,
    normalize: Annotated[bool, typer.Option("--normalize/--no-normalize", help="L2-normalise before searching.")] = True,
    k: Annotated[int | None, typer.Option("-k", "--k", metavar="K", min=1, help="Neighbours per query (default: the largest class size).", show_default=False)] = None,
    seed: Annotated[int | None, typer.Option(metavar="N", help="k-means seed (default 0, or the run's seed).", show_default=False)] = None,
    block_size: Annotated[int | None, typer.Option(metavar="N", help="Rows per block of the torch engine.", show_default=False)] = None,
    nprobe: Annotated[int | None, typer.Option(metavar="N", help="Inverted lists probed by faiss_approx.", show_default=False)] = None,
    mode: Annotated[str, typer.Option(metavar="MODE", help="Several --embeddings: concatenated or separated.")] = "concatenated",
    rerank: Annotated[str | None, typer.Option("--rerank", metavar="KIND", help="Also re-ranked: none, query_expansion or k_reciprocal (default: the RUN config's evaluation.rerank).", show_default=False)] = None,
    rerank_params: Annotated[list[str] | None, typer.Option("--rerank-param", metavar="NAME=VALUE", help="With --rerank: one of its parameters, e.g. k1=20; repeat for several.", show_default=False)] = None,
    analysis: Annotated[bool, typer.Option("--analysis", help="Also print rho and the pi distance ratios.")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", metavar="FILE", help="With --analysis: spectrum plot path (PNG).", show_default=False)] = None,
    drop: Annotated[int, typer.Option(metavar="N", help="Largest singular values left out of rho.")] = 1,
    center: Annotated[bool, typer.Option("--center", help="Center the embeddings before the SVD.")] = False,
    per_query: Annotated[Path | None, typer.Option("--per-query", metavar="FILE", help="RUN: write each test query's label, first correct rank and AP@R (CSV).", show_default=False)] = None,
    worst: Annotated[int | None, typer.Option("--worst", metavar="N", help="RUN: show the N queries with the lowest AP@R (with --html).", show_default=False)] = None,
    html: Annotated[Path | None, typer.Option("--html", metavar="FILE", help="With --worst: the page of those queries and their neighbours.", show_default=False)] = None,
    verification: Annotated[bool, typer.Option("--verification", help="RUN: thresholds and FNMR at target false match rates.")] = False,
    roc: Annotated[Path | None, typer.Option("--roc", metavar="FILE", help="With --verification: plot FNMR against FMR here (PNG).", show_default=False)] = None,
    open_set: Annotated[bool, typer.Option("--open-set", help="RUN: open-set identification (DIR@FAR) with half the test classes enrolled.")] = False,
    calibration: Annotated[Path | None, typer.Option("--calibration", metavar="FILE", help="With --open-set: also at this calibration.json's thresholds.", show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_SILENT_HELP)] = False,
) -> None:
    """Retrieval and clustering metrics as a table (and JSON with --json).

    Exit codes: 0 evaluated, 1 a write failed for lack of space, 2 bad input, 130 interrupted by
    Ctrl-C, 143 by SIGTERM.
    """
    _check_options(run, embeddings, per_query, worst, html, verification, roc)
    # Paths first: a missing file is reported before torch and NumPy are imported.
    if run is not None:
        require_run_dir(run)
    for path, what in [(labels, "labels file"), *((path, "embeddings file") for path in embeddings or []),
                       (query_mask, "query mask file"), (domains, "domains file")]:
        if path is not None:
            require_file(path, what)
    _check_open_set_options(run, open_set, calibration)
    for option, target in (("--json", json_path), ("--per-query", per_query), ("--html", html), ("--roc", roc)):
        _check_writable(option, target)
    options = _evaluation_options({"ks": _parse_ks(ks), "backend": backend, "binarize": binarize, "normalize": normalize,
                                   "metrics": metrics, "k": k, "seed": seed, "block_size": block_size, "nprobe": nprobe},
                                  query_mask, rerank_option(rerank, rerank_params))

    if run is not None:
        opened = _open_run(run)  # once: the scores, the analysis, the diagnostics and the open set share it
        results = _evaluate_run(opened, options)
        if analysis:
            results = {**results, "analysis": _analyze_training_split(opened, drop, center, normalize, plot)}
        if per_query or worst or verification:
            results = {**results, **_diagnose(opened, per_query, worst, html, verification, roc, seed)}
        results = {**results, **_open_set(opened, open_set, calibration, seed)}
        _write_json(json_path, results)
        return

    if labels is None:
        raise UserInputError("--embeddings needs --labels")
    label_array = load_array(labels, "labels")
    matrices = {str(path): load_array(path, "embeddings") for path in embeddings or []}
    results = _evaluate_arrays(matrices, label_array, mode, options, None if domains is None else load_array(domains, "domains"))
    if analysis:
        import torch

        from dmlbench.evaluation import concatenate

        arrays = list(matrices.values())
        # Several models are analysed as evaluated: each L2-normalised, then concatenated.
        combined = arrays[0] if len(arrays) == 1 else concatenate(torch.as_tensor(array) for array in arrays)
        results = {**results, "analysis": _analyze(combined, label_array, drop, center, normalize, plot, "analysis")}
    _write_json(json_path, results)


def _evaluation_options(given: dict[str, Any], query_mask: Path | None, rerank: dict[str, Any] | None) -> dict[str, Any]:
    """The options of ``evaluation.evaluate`` that were given (``None``: left to the defaults); ``rerank``
    travels with them and is applied beside the raw metrics, never instead of them."""
    options = {name: value for name, value in given.items() if value is not None}
    if query_mask is not None:
        options["query_mask"] = load_array(query_mask, "query mask")
    if rerank is not None:
        options["rerank"] = rerank
    return options


def rerank_option(kind: str | None, params: list[str] | None) -> dict[str, Any] | None:
    """``--rerank KIND --rerank-param NAME=VALUE ...`` as ``{"kind": ..., "params": {...}}`` (values read as
    YAML), checked by ``evaluation.rerank.build``; ``None`` when not given."""
    from dmlbench.config import parse_override
    from dmlbench.evaluation.rerank import build

    if kind is None:
        if params:
            raise UserInputError("--rerank-param goes with --rerank KIND")
        return None
    values: dict[str, Any] = {}
    for text in params or []:
        path, value = parse_override(text)
        if len(path) != 1:
            raise UserInputError(f"--rerank-param {text!r} must be NAME=VALUE, e.g. k1=20")
        values[path[0]] = value
    build(kind, **values)
    return {"kind": kind, "params": values}


def _evaluate_arrays(matrices: dict[str, Any], labels: Any, mode: str, options: dict[str, Any], domains: Any) -> dict[str, Any]:
    """Metrics of stored embeddings printed as a table; with ``domains`` also cross-domain, with ``rerank``
    also re-ranked, beside them."""
    from dmlbench import evaluation
    from dmlbench.evaluation.table import format_table

    options = dict(options)
    rerank = options.pop("rerank", None)

    def score(extra: dict[str, Any]) -> dict[str, Any]:
        if len(matrices) == 1:
            return evaluation.evaluate(next(iter(matrices.values())), labels, **options, **extra)
        return evaluation.evaluate_many(matrices, labels, mode=mode, **options, **extra)

    results = score({})
    columns, added = {"all": results}, {}
    if rerank is not None and rerank["kind"] != "none":
        added["reranked"] = columns["re-ranked"] = score({"rerank": rerank})
    if domains is not None:
        added["cross_domain"] = columns["cross-domain"] = score({"domains": domains})  # answered from the other domains only
    typer.echo(format_table(columns if added else results))
    return {**results, **added}


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


def _open_run(run: Path) -> Run:
    from dmlbench.training.runs import Run

    return Run.open(run)


def _evaluate_run(run: Run, options: dict[str, Any]) -> dict[str, Any]:
    """A run's test scores, trained and untrained, printed as a table; only options changed from their
    defaults are passed on, so the run's own evaluation settings hold otherwise."""
    from dmlbench.evaluation.table import format_table
    from dmlbench.training.runs import evaluate_run

    run_defaults = {"ks": (1, 2, 4, 8), "backend": "torch", "binarize": False, "normalize": True}
    changed = {name: value for name, value in options.items() if run_defaults.get(name, object()) != value}
    results = evaluate_run(run, **changed)
    extra = ("untrained", "reranked", "untrained_reranked", "cross_domain", "untrained_cross_domain")
    trained = {name: value for name, value in results.items() if name not in extra}
    columns = {"trained": trained}
    if "reranked" in results:  # --rerank, or the run's config sets evaluation.rerank
        columns["trained, re-ranked"] = results["reranked"]
    columns["untrained"] = results.get("untrained", {})
    if "reranked" in results:
        columns["untrained, re-ranked"] = results["untrained_reranked"]
    if "cross_domain" in results:  # the run's config sets evaluation.cross_domain
        columns.update({"trained, cross-domain": results["cross_domain"],
                        "untrained, cross-domain": results["untrained_cross_domain"]})
    typer.echo(format_table(columns))
    return results


def _analyze_training_split(run: Run, drop: int, center: bool, normalize: bool, plot: Path | None) -> dict[str, Any]:
    """``_analyze`` of the run's training split: Roth et al. 2020 measure the embedding space on the
    training data, never on the test split."""
    from dmlbench.training.runs import embed_run

    train_embeddings, train_labels = embed_run(run, "train")
    return _analyze(train_embeddings, train_labels, drop, center, normalize, plot, "train split")


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
    run: Run, per_query_path: Path | None, worst: int | None, html: Path | None, verification: bool, roc: Path | None,
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
            diagnostics.write_worst_page(html, found, split, worst, f"The {worst} worst test queries of {run.run_dir}")
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


def _check_open_set_options(run: Path | None, open_set: bool, calibration: Path | None) -> None:
    """A calibration of another model is refused here, before the run is evaluated."""
    from dmlbench.deploy import calibration as calibrations
    from dmlbench.training.records import run_hashes

    if calibration is not None and not open_set:
        raise UserInputError("--calibration goes with --open-set")
    if open_set and run is None:
        raise UserInputError("--open-set evaluates a RUN's test split")
    if calibration is not None and run is not None:
        calibrations.check_same_model(calibrations.load_calibration(calibration), run_hashes(run), str(calibration), f"run {run}")


def _open_set(run: Run, open_set: bool, calibration: Path | None, seed: int | None) -> dict[str, Any]:
    """``{"open_set": ...}``: DIR and FAR at the default FAR targets and at the calibrated thresholds,
    printed with their 95% intervals (nothing without ``--open-set``)."""
    from dmlbench.deploy.calibration import open_set_of_run
    from dmlbench.evaluation.open_set import DEFAULT_FAR_TARGETS

    if not open_set:
        return {}
    found = open_set_of_run(run, calibration, DEFAULT_FAR_TARGETS, seed=0 if seed is None else seed)

    def span(values: list[float] | None) -> str:
        return "[n/a]" if values is None else f"[{values[0]:.3f}, {values[1]:.3f}]"

    typer.echo("")
    typer.echo(f"open set: {found['enrolled_classes']} enrolled classes ({found['gallery_items']} gallery items, "
               f"{found['known_queries']} known queries), {found['unknown_classes']} unknown classes "
               f"({found['unknown_queries']} queries); rank-1 identification {found['rank_1_identification_rate']:.4f}")
    for point in found["at_far"] + found["at_calibrated_threshold"]:
        at = f"FAR {point['target_far']:g}" if "target_far" in point else f"calibrated FMR {point['target_fmr']:g}"
        unreachable = "" if point.get("reachable", True) else " (too few unknown queries for this FAR)"
        typer.echo(f"  {at:>22}: threshold {point['threshold']:.4f}  DIR {point['dir']:.4f} {span(point['dir_ci'])}"
                   f"  FAR {point['far']:.4f} {span(point['far_ci'])}{unreachable}")
    return {"open_set": found}


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
