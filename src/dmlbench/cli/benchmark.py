"""``dmlbench benchmark``."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer

from dmlbench.cli.common import config_and_overrides
from dmlbench.protocol.benchmark import load_spec, run_benchmark


def register(app: typer.Typer) -> None:
    app.command("benchmark")(benchmark_command)


def benchmark_command(
    config_path: Annotated[Optional[Path], typer.Argument(metavar="[CONFIG]", help="Benchmark YAML (default: the built-in glyphs benchmark).")] = None,
    overrides: Annotated[Optional[list[str]], typer.Argument(metavar="[OVERRIDES]...", help="Dotted overrides applied to every method, e.g. training.epochs=2.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Output directory (default: runs/benchmark-<time>); an existing one is resumed.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress output.")] = False,
) -> None:
    """Train and evaluate a fixed set of methods under one shared configuration."""
    config_path, overrides = config_and_overrides(config_path, overrides)
    spec = load_spec(config_path)
    output_dir = output or Path("runs") / f"benchmark-{datetime.now():%Y%m%d-%H%M%S}"
    results = run_benchmark(spec, output_dir, overrides, progress=not quiet)
    typer.echo((output_dir / "report.md").read_text())
    typer.echo(f"results: {output_dir / 'results.json'}")
    if any(result.status != "completed" for result in results):
        raise typer.Exit(1)
