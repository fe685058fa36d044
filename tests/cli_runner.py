"""Running the ``dmlbench`` command in-process, as the CLI tests do."""

import pytest

from dmlbench.cli import main


def cli_exit_code(argv: list[str]) -> int:
    """Exit code of ``dmlbench ARGV`` (its output left to whoever captures it)."""
    try:
        main(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    return 0


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``dmlbench ARGV``."""
    code = cli_exit_code(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err
