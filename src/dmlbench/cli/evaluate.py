"""``dmlbench evaluate``: metrics of a finished run, or of embeddings stored as ``.npy`` files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from dmlbench.cli.common import QUIET_SILENT_HELP, Command, require_file, require_run_dir, rerank_option
from dmlbench.errors import UserInputError
from dmlbench.files import atomic_write, load_array


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
    ks: Annotated[str | None, typer.Option("--ks", metavar="K[,K...]", help="K values of the default recall_at_<k> metrics (default 1,2,4,8).", show_default=False)] = None,
    query_mask: Annotated[Path | None, typer.Option("--query-mask", metavar="FILE", help="Bool [N] (.npy): queries; the rest is the gallery.", show_default=False)] = None,
    domains: Annotated[Path | None, typer.Option("--domains", metavar="FILE", help="Domain of each row [N] (.npy, integers or strings): also score each query against the other domains only.", show_default=False)] = None,
    backend: Annotated[str | None, typer.Option(metavar="NAME", help="torch (default), faiss (exact), faiss_approx (inverted lists) or faiss_hnsw (graph).", show_default=False)] = None,
    binarize: Annotated[bool | None, typer.Option("--binarize/--no-binarize", help="Sign bits and Hamming distance (default: no).", show_default=False)] = None,
    normalize: Annotated[bool | None, typer.Option("--normalize/--no-normalize", help="L2-normalise before searching (default: yes).", show_default=False)] = None,
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
    _check_combinations(run, embeddings, labels, per_query, worst, html, verification, roc, open_set, calibration)
    # Paths first: a missing file is reported before torch and NumPy are imported.
    if run is not None:
        require_run_dir(run)
    for path, what in [(labels, "labels file"), *((path, "embeddings file") for path in embeddings or []),
                       (query_mask, "query mask file"), (domains, "domains file")]:
        if path is not None:
            require_file(path, what)
    for option, target in (("--json", json_path), ("--per-query", per_query), ("--html", html), ("--roc", roc)):
        _check_writable(option, target)
    # An option left out is None and not passed on: what the user did not give never overrides anything.
    options = _evaluation_options({"ks": None if ks is None else _parse_ks(ks), "backend": backend, "binarize": binarize, "normalize": normalize,
                                   "metrics": metrics, "k": k, "seed": seed, "block_size": block_size, "nprobe": nprobe},
                                  query_mask, rerank_option(rerank, rerank_params))
    from dmlbench.report.evaluation import EvaluateRequest, evaluate

    request = EvaluateRequest(
        run=run, embeddings=list(embeddings or []), labels=labels, domains=domains, mode=mode, options=options,
        analysis=analysis, plot=plot, drop=drop, center=center, per_query=per_query, worst=worst, html=html,
        verification=verification, roc=roc, open_set=open_set, calibration=calibration, seed=seed)
    _write_json(json_path, evaluate(request, typer.echo))


def _evaluation_options(given: dict[str, Any], query_mask: Path | None, rerank: dict[str, Any] | None) -> dict[str, Any]:
    """The options of ``evaluation.evaluate`` that were given (``None``: left to the defaults); ``rerank``
    travels with them and is applied beside the raw metrics, never instead of them."""
    options = {name: value for name, value in given.items() if value is not None}
    if query_mask is not None:
        options["query_mask"] = load_array(query_mask, "query mask")
    if rerank is not None:
        options["rerank"] = rerank
    return options


def _check_combinations(
    run: Path | None, embeddings: list[Path] | None, labels: Path | None, per_query: Path | None, worst: int | None,
    html: Path | None, verification: bool, roc: Path | None, open_set: bool, calibration: Path | None,
) -> None:
    """The combinations of options that make sense; a one-line error naming the options for any other."""
    if (run is None) == (not embeddings):
        raise UserInputError("give either a RUN directory or --embeddings E.npy --labels L.npy")
    if embeddings and labels is None:
        raise UserInputError("--embeddings needs --labels")
    if run is None and (per_query or worst or verification or open_set):
        raise UserInputError("--per-query, --worst, --verification and --open-set evaluate a RUN's test split")
    if (worst is None) != (html is None):
        raise UserInputError("--worst N and --html OUT.html go together")
    if roc is not None and not verification:
        raise UserInputError("--roc goes with --verification")
    if calibration is not None and not open_set:
        raise UserInputError("--calibration goes with --open-set")


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
