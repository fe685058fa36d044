"""The ``dmlbench`` command. Thin: parses arguments, loads configs and calls the library.

The CLI library (typer) handles usage errors itself: the usage hint, one error line, exit code 2.
Errors a user causes inside a command (``UserInputError``, a path that cannot be written) end as one
line on stderr and exit code 2; an interrupted run exits 130. Command modules import the library
(torch above all) only inside their functions, so ``--help`` and usage errors answer at once.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from dmlbench import __version__
from dmlbench.errors import RunInterrupted, UserInputError

app = typer.Typer(
    name="dmlbench",
    help="Train and fairly compare deep metric learning methods.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"dmlbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", is_eager=True, callback=_print_version)
    ] = False,
) -> None:
    """Train and fairly compare deep metric learning methods."""


def _register_commands() -> None:
    from dmlbench.cli import benchmark, data, deploy, evaluate, report, status, toy, train

    for module in (data, train, evaluate, benchmark, report, status, toy, deploy):
        module.register(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script and of ``python -m dmlbench``."""
    _register_commands()
    try:
        app(args=argv, prog_name="dmlbench")
    except UserInputError as error:
        _fail(f"error: {error}", 2)
    except RunInterrupted as error:
        _fail(f"interrupted: {error}", 130)
    except OSError as error:
        # A path the user named could not be read or written (a read-only directory, a file where a
        # directory should be, a full disk): one line naming it, not a traceback.
        where = f": {error.filename}" if error.filename else ""
        _fail(f"error: {error.strerror or error}{where}", 2)


def _fail(message: str, code: int) -> None:
    print(f"dmlbench: {message}", file=sys.stderr)
    sys.exit(code)
