"""``dmlbench status``: a benchmark's progress, read from its storage (train nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dmlbench.cli.common import Command


def register(app: typer.Typer) -> None:
    app.command("status", cls=Command)(status_command)


def status_command(
    directory: Annotated[Optional[Path], typer.Argument(metavar="DIR", help="A benchmark output directory.", show_default=False)] = None,
    storage: Annotated[Optional[str], typer.Option("--storage", help="The benchmark's storage URL instead of DIR (password from PGPASSWORD or ~/.pgpass).")] = None,
) -> None:
    """Per method: search trials done / running / failed / left, reproductions done; the workers seen
    in the last minutes and an estimate of the time left.

    Exit codes: 0 printed, 2 no benchmark in DIR or the storage cannot be reached.
    """
    from dmlbench.protocol.status import status_lines

    for line in status_lines(directory, storage):
        typer.echo(line)
