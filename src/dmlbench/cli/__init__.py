"""The ``dmlbench`` command. Thin: parses arguments, loads configs and calls the library.

Every ``UserInputError`` ends as one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys

import click
import typer

from dmlbench.errors import UserInputError

app = typer.Typer(
    name="dmlbench",
    help="Train and fairly compare deep metric learning methods.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_commands() -> None:
    from dmlbench.cli import benchmark, data, evaluate, train

    for module in (data, train, evaluate, benchmark):
        module.register(app)


def main(argv: list[str] | None = None) -> None:
    _register_commands()
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="dmlbench", standalone_mode=False)
    except UserInputError as error:
        print(f"dmlbench: error: {error}", file=sys.stderr)
        sys.exit(2)
    except click.exceptions.Abort:
        print("dmlbench: aborted", file=sys.stderr)
        sys.exit(130)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except click.exceptions.Exit as exit_:
        sys.exit(exit_.exit_code)
