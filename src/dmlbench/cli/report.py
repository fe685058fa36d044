"""``dmlbench report`` and ``dmlbench audit``: read a benchmark directory, train nothing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dmlbench.cli.common import Command


def register(app: typer.Typer) -> None:
    app.command("report", cls=Command)(report_command)
    app.command("audit", cls=Command)(audit_command)


def report_command(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="A benchmark output directory.", show_default=False)],
    storage: Annotated[Optional[str], typer.Option("--storage", help="Read this storage URL instead of the one DIR/benchmark.json records.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report files here instead of DIR (a folder to publish: no checkpoints, no database).")] = None,
) -> None:
    """Rebuild report.md, report.html, results.csv, runs.csv, comparisons.csv, the claim CSVs, the plots and results.tex from storage.

    Exit codes: 0 written, 2 no benchmark study in DIR.
    """
    from dmlbench.report import write_report

    paths = write_report(directory, storage, output)
    for path in paths.values():
        typer.echo(str(path))


def audit_command(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="A benchmark output directory.", show_default=False)],
) -> None:
    """Check every record: no search run saw a test class, no checkpoint was selected with test data,
    train/validation/test classes disjoint in every run, the same budget for every method.

    Exit codes: 0 the audit passed, 1 problems (each offending run named), 2 no benchmark study in DIR.
    """
    from dmlbench.protocol.audit import audit

    problems = audit(directory)
    if problems:
        for problem in problems:
            print(f"dmlbench: audit: {problem}", file=sys.stderr)
        raise typer.Exit(1)
    typer.echo(f"audit passed: {directory}")
