"""``dmlbench benchmark``."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer

from dmlbench.cli.common import Command, OVERRIDES_HELP, config_and_overrides


def register(app: typer.Typer) -> None:
    app.command("benchmark", cls=Command)(benchmark_command)


def benchmark_command(
    config_path: Annotated[Optional[Path], typer.Argument(metavar="CONFIG", help="Benchmark YAML (default: the built-in glyphs benchmark).", show_default=False)] = None,
    overrides: Annotated[Optional[list[str]], typer.Argument(metavar="OVERRIDES", help=OVERRIDES_HELP + " Applied to every method.", show_default=False)] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Output directory (default: runs/benchmark-<time>); an existing one is resumed.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress output.")] = False,
) -> None:
    """Train and evaluate a fixed set of methods under one shared configuration.

    Exit codes: 0 every method completed, 1 some method failed (named on stderr), 2 bad input,
    130 interrupted (re-run the same command to resume).
    """
    from dmlbench.protocol.benchmark import load_spec, run_benchmark

    config_path, overrides = config_and_overrides(config_path, overrides)
    spec = load_spec(config_path)
    output_dir = output or Path("runs") / f"benchmark-{datetime.now():%Y%m%d-%H%M%S}"
    results = run_benchmark(spec, output_dir, overrides, progress=not quiet)
    typer.echo((output_dir / "report.md").read_text())
    typer.echo(f"results: {output_dir / 'results.json'}")
    failed = [result for result in results if result.status != "completed"]
    for result in failed:
        typer.echo(f"dmlbench: error: method {result.name} failed: {result.reason}", err=True)
    if failed:
        raise typer.Exit(1)
