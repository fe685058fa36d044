"""The Python API: what the commands do, as functions (``import dmlbench``; docs/api.md).

``benchmark`` runs the fair protocol and writes the report, ``train`` trains one model, ``evaluate``
scores embeddings, ``load_results`` reads a finished benchmark's tables. They call the same library
functions as the commands, with the same checks: bad input is a ``UserInputError`` with a one-line
message, a stop signal a ``RunInterrupted``.
"""

from __future__ import annotations

import contextlib
import csv
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dmlbench.errors import UserInputError


def benchmark(
    config: str | Path | None, output_dir: str | Path, overrides: Sequence[str] = (), *,
    storage: str | None = None, jobs: int | str = 1, progress: bool = False, accept_plugin_changes: bool = False,
    accept_analysis_change: bool = False,
) -> Any:
    """Run (or continue) the benchmark of the YAML ``config`` (``None``: the built-in glyphs one) in
    ``output_dir`` and write its report with ``jobs`` worker processes (``"auto"``: as
    ``dmlbench benchmark --jobs auto``); returns the ``BenchmarkOutcome`` (``results``, ``failed``),
    or ``None`` when another worker on the same storage wrote the report. ``accept_plugin_changes`` and
    ``accept_analysis_change`` continue a benchmark whose plugin code or analysis changed, on purpose (recorded
    in its ``benchmark.json``), as their options do."""
    from dmlbench.protocol.design.benchmark import load_spec
    from dmlbench.protocol.design.prepare import prepare
    from dmlbench.protocol.run.schedule import run_benchmark
    from dmlbench.report import write_report

    config_path = None if config is None else Path(config)
    with _optuna_warnings_only():
        prepared = prepare(load_spec(config_path), Path(output_dir), list(overrides), storage, jobs=jobs,
                           accept_plugin_changes=accept_plugin_changes, accept_analysis_change=accept_analysis_change)
        if prepared.jobs > 1:
            from dmlbench.protocol.run.jobs import run_jobs

            return run_jobs(prepared, config_path, list(overrides), progress=progress, report=write_report)
        return run_benchmark(prepared, progress=progress, report=write_report)


@contextlib.contextmanager
def _optuna_warnings_only() -> Iterator[None]:
    """Optuna logs a line per study created (one per method, fold and trial); the command hides them,
    and so does the API, giving the caller's verbosity back afterwards."""
    import optuna

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


def train(
    config: str | Path | Mapping[str, Any] | None, output_dir: str | Path, overrides: Sequence[str] = (), *,
    resume: bool = False, progress: bool = False,
) -> Any:
    """Train one model from a YAML path, a mapping of config sections or ``None`` (the defaults) into
    the run directory ``output_dir``; returns the ``TrainResult`` (best epoch and validation scores)."""
    from dmlbench import config as config_module
    from dmlbench.training import train as train_run

    if isinstance(config, Mapping):
        loaded = config_module.from_dict(dict(config), list(overrides))
    else:
        loaded = config_module.load(config, list(overrides))
    return train_run(loaded, Path(output_dir), resume=resume, progress=progress)


def evaluate(embeddings: Any, labels: Any, **options: Any) -> dict[str, float | int]:
    """Retrieval and clustering metrics of ``embeddings`` ``[N, D]`` with labels ``[N]`` (arrays or
    tensors); ``options`` as ``dmlbench.evaluation.evaluate`` (``metrics``, ``query_mask``, ``k``, ...).
    Every metric is a ``float``; retrieval metrics come with two counts, ``num_queries`` and
    ``num_queries_without_match``, as ``int``."""
    from dmlbench.evaluation import evaluate as evaluate_embeddings

    return evaluate_embeddings(embeddings, labels, **options)


def load_results(output_dir: str | Path) -> dict[str, list[dict[str, Any]]]:
    """A finished benchmark's tables as lists of rows (dicts): ``results`` (``results.csv``: per
    method, mode and metric the mean and 95% interval), ``runs`` (``runs.csv``: every reproduction's
    scores) and ``comparisons`` (``comparisons.csv``, when there are two methods or more). Numbers
    are ``int`` or ``float``, an empty cell ``None``, everything else ``str``."""
    from dmlbench.protocol import layout

    directory = Path(output_dir)
    tables = {"results": directory / layout.RESULTS_CSV, "runs": directory / layout.RUNS_CSV,
              "comparisons": directory / layout.COMPARISONS_CSV}
    if not tables["results"].is_file():
        raise UserInputError(f"{directory} holds no {layout.RESULTS_CSV} (a finished benchmark writes it; "
                             f"`dmlbench report {directory}` rebuilds it from the storage)")
    return {name: _read_rows(path) for name, path in tables.items() if path.is_file()}


def _read_rows(path: Path) -> list[dict[str, Any]]:
    with open(path, newline="") as stream:
        return [{key: _value(text) for key, text in row.items()} for row in csv.DictReader(stream)]


def _value(text: str | None) -> Any:
    if not text:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text
