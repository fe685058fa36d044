"""Build every report file of a benchmark directory from what is stored there; no training, no test data.

Inputs: ``benchmark.json`` and the Optuna studies, read by ``report.data``. Outputs: ``results.csv``
and ``runs.csv`` (``protocol.units.results.write_results``: the same bytes whoever writes them),
``comparisons.csv`` (every pair of methods), the claim files of ``report.analysis``
(``claim_comparisons.csv``, ``embedding_space.csv``, ``correlations.csv``, ``rankings.csv``), the
figures of ``report.plots`` as PNG files, ``report.md`` (linking them), ``report.html`` (inline CSS,
the figures embedded as base64 PNG), ``results.tex`` (booktabs). The tables come from
``report.tables``, their order on the page from ``report.sections``, the two pages from ``report.render``.
"""

from __future__ import annotations

from pathlib import Path

from dmlbench import files
from dmlbench.analysis.verdicts import comparison_csv
from dmlbench.errors import UserInputError
from dmlbench.evaluation.metrics import metric_title
from dmlbench.protocol import layout
from dmlbench.protocol.units.results import result_rows, write_results
from dmlbench.report import plots, render, sequential, tables, uncertainty
from dmlbench.report.analysis import ALPHA
from dmlbench.report.data import ReportData, computed_metrics, load_report_data
from dmlbench.report.sections import sections


def write_report(output_dir: Path, storage: str | None = None, destination: Path | None = None) -> dict[str, Path]:
    """Write every report file of the benchmark in ``output_dir`` (see the module docstring) into
    ``destination`` (default ``output_dir``, e.g. a folder to publish without checkpoints or the
    database); returns their paths, ``{file name: path}``: exactly the files it wrote (what MLflow
    tracking uploads, ``protocol.run.record.track_report``). The names are ``protocol.layout``'s."""
    data = load_report_data(output_dir, storage)
    source, output_dir = Path(output_dir), Path(destination or output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise UserInputError(f"report destination {output_dir} is a file, not a directory")
    output_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    if output_dir.resolve() != source.resolve():
        # The records that make a published report checkable: the spec, fold layout and dataset hash,
        # and every opening of the test data.
        for name in (layout.BENCHMARK_FILE, layout.TEST_ACCESS_FILE):
            if (source / name).is_file():
                paths[name] = output_dir / name
                files.atomic_write_text(paths[name], (source / name).read_text())
    if data.results:
        paths[layout.RESULTS_CSV], paths[layout.RUNS_CSV] = write_results(data.results, output_dir,
                                                                          uncertainty.repeated_reproductions(data))
        paths[layout.COMPARISONS_CSV] = output_dir / layout.COMPARISONS_CSV
        files.atomic_write_text(paths[layout.COMPARISONS_CSV], tables.comparisons_csv(data))
        paths[layout.RESULTS_TEX] = output_dir / layout.RESULTS_TEX
        files.atomic_write_text(paths[layout.RESULTS_TEX], tables.latex(data))
    method_families = uncertainty.method_families(data)
    if method_families:
        paths[layout.METHOD_COMPARISONS_CSV] = output_dir / layout.METHOD_COMPARISONS_CSV
        files.atomic_write_text(paths[layout.METHOD_COMPARISONS_CSV], comparison_csv(method_families, conditional=False))
    for name, text in {**tables.claim_csvs(data), **uncertainty.uncertainty_csvs(data), **sequential.sequential_csvs(data)}.items():
        paths[name] = output_dir / name
        files.atomic_write_text(paths[name], text)
    figures = _figures(data)
    document = sections(data, figures)
    for _, name, png in figures:
        paths[name] = output_dir / name
        files.atomic_write(paths[name], lambda stream, png=png: stream.write(png))
    paths[layout.REPORT_FILE] = output_dir / layout.REPORT_FILE
    files.atomic_write_text(paths[layout.REPORT_FILE], render.markdown(document))
    paths[layout.REPORT_HTML] = output_dir / layout.REPORT_HTML
    files.atomic_write_text(paths[layout.REPORT_HTML], render.html_page(document))
    return paths


def _figures(data: ReportData) -> list[plots.Figure]:
    figures = [plots.search_figure(data.methods, data.trials), plots.budget_figure(data.methods, uncertainty.budget_table(data)),
               plots.curves_figure(data.methods, {m: c.get("reproduction", []) for m, c in data.curves.items()})]
    metrics = [metric for metric in ("precision_at_1", "map_at_r") if metric in computed_metrics(data)]
    rows = result_rows(data.results)
    if rows and metrics:
        references = data.benchmark.references
        figures.append(plots.forest_figure(rows, metrics, {metric: metric_title(metric) for metric in metrics}, references))
    family = data.claims.families.get(data.claims.primary)
    if isinstance(family, list) and family:
        figures.append(plots.differences_figure(family, uncertainty.endpoint_title(data.claims.primary),
                                                data.claims.margin, ALPHA))
    judgement = sequential.sequential_judgement(data)
    if judgement is not None and judgement.rows:
        figures.append(plots.sequential_figure(judgement, uncertainty.endpoint_title(data.claims.primary)))
    if data.claims.points:
        figures.append(plots.space_figure(data.claims.points, methods=data.methods))
    return figures
