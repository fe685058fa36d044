"""``dmlbench status``: a benchmark's progress, read from its storage (train nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dmlbench.cli.common import QUIET_SILENT_HELP, Command
from dmlbench.errors import UserInputError


def register(app: typer.Typer) -> None:
    app.command("status", cls=Command)(status_command)


def status_command(
    directory: Annotated[Optional[Path], typer.Argument(metavar="DIR", help="A benchmark output directory.", show_default=False)] = None,
    storage: Annotated[Optional[str], typer.Option("--storage", metavar="URL", help="The benchmark's storage URL instead of DIR (password from PGPASSWORD or ~/.pgpass).", show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_SILENT_HELP)] = False,
) -> None:
    """Per method: search trials done / running / failed / left, reproductions done; the workers seen
    in the last minutes and an estimate of the time left.

    Exit codes: 0 printed, 2 no benchmark in DIR or the storage cannot be reached, 130 interrupted by
    Ctrl-C, 143 by SIGTERM.
    """
    from dmlbench.protocol.layout import BENCHMARK_FILE

    # Before optuna is imported: the messages of status_lines' own checks.
    if storage is None and directory is None:
        raise UserInputError("give a benchmark directory or --storage URL")
    if storage is None and directory is not None and not (directory / BENCHMARK_FILE).is_file():
        raise UserInputError(f"{directory} holds no benchmark study (no {BENCHMARK_FILE})")
    from dmlbench.protocol.inspection.status import status_lines

    for line in status_lines(directory, storage):
        typer.echo(line)
