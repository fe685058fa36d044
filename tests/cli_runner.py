"""Running the ``dmlbench`` command in-process, as the CLI tests do."""

import pytest

from dmlbench.cli import main


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``dmlbench ARGV``."""
    try:
        main(argv)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err
