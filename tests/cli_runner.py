"""Running the ``dmlbench`` command in-process, as the CLI tests do."""

import subprocess

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


def run_in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess[str]:
    """``dmlbench ARGV`` run in this process, shaped like the console script's result: the same exit
    code and output without a new interpreter importing torch (seconds per call). Python warnings go
    to whoever records them (pytest), not to stderr: a test of the warning lines a user sees runs the
    console script instead."""
    code, out, err = run_cli(argv, capsys)
    return subprocess.CompletedProcess(["dmlbench", *argv], code, out, err)
