"""The first minutes of a new user: every command's --help in one style, and mistakes in paths
reported at once, before torch (seconds, more on a loaded machine) is imported."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "optuna", "faiss", "matplotlib")

# Runs `dmlbench ARGV` in a fresh interpreter; prints the exit code and which heavy libraries it imported.
RUN_AND_REPORT_IMPORTS = f"""
import json, sys
from dmlbench.cli import main
try:
    main(sys.argv[1:])
    code = 0
except SystemExit as exit_:
    code = exit_.code if isinstance(exit_.code, int) else 1
print(json.dumps({{"code": code, "imported": [name for name in {HEAVY!r} if name in sys.modules]}}))
"""

# Every command's --help in one interpreter: {"train": text, "data check": text, ...} and the heavy imports.
ALL_HELP = f"""
import contextlib, io, json, sys
import typer.main
from dmlbench import cli

cli._register_commands()

def commands(group, prefix):
    for name, command in group.commands.items():
        yield from commands(command, prefix + [name]) if hasattr(command, "commands") else [prefix + [name]]

texts = {{}}
for path in [[], *commands(typer.main.get_command(cli.app), [])]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            cli.main([*path, "--help"])
        except SystemExit as exit_:
            assert exit_.code in (0, None), (path, exit_.code)
    texts[" ".join(path)] = out.getvalue()
print(json.dumps({{"help": texts, "imported": [name for name in {HEAVY!r} if name in sys.modules]}}))
"""


def run_python(code: str, *arguments: str, cwd: Path | None = None) -> tuple[subprocess.CompletedProcess[str], dict]:
    result = subprocess.run([sys.executable, "-c", code, *arguments], capture_output=True, text=True, timeout=120,
                            cwd=cwd)
    return result, json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def help_texts() -> dict[str, str]:
    result, found = run_python(ALL_HELP)
    assert result.returncode == 0, result.stderr
    assert found["imported"] == [], f"--help imported {found['imported']}"
    return found["help"]


# The commands of issue 32 ("" is the top-level help).
COMMANDS = ("", "train", "evaluate", "benchmark", "search", "report", "audit", "status", "embed", "export", "index",
            "query", "data check", "data fetch", "toy", "list", "calibrate", "plan")


def test_every_command_is_walked(help_texts: dict[str, str]) -> None:
    assert set(COMMANDS) <= set(help_texts)


def test_every_help_uses_one_placeholder_style(help_texts: dict[str, str]) -> None:
    """``DIR``, ``FILE``, ``RUN``, ``CONFIG``: not the CLI library's ``{CONFIG}``, ``[[KIND]]`` or ``<path>``."""
    for command, text in help_texts.items():
        for form in ("{", "[[", "<list", "<Path", "<path>", "<str>", "<int>", "<float>", "<bool>", "TEXT", "INTEGER"):
            assert form not in text, f"dmlbench {command} --help shows {form!r}:\n{text}"
        # Each option that takes a value names it in capitals (N|auto, K[,K...] and P[,P...] included).
        for line in text.split("\nOptions:\n")[-1].splitlines():
            option = re.match(r"  (?:-\w, )?--[\w-]+ (\S+)\s", line)
            if option and option.group(1) != "/":  # --normalize / --no-normalize takes no value
                assert re.fullmatch(r"[A-Z][A-Z0-9_=|,.\[\]]*(\|auto)?", option.group(1)), (command, line)


def test_every_command_documents_quiet_exit_codes_and_plugins(help_texts: dict[str, str]) -> None:
    for command in COMMANDS:
        text = help_texts[command]
        assert "-q, --quiet" in text or command == "", command
        assert "--plugin MODULE_OR_FILE" in text, command
        assert "Exit codes:" in text and "130" in text and "143" in text, command
        assert " 2 " in text.split("Exit codes:")[1], command


def test_k_is_the_neighbour_count_of_query_and_evaluate(help_texts: dict[str, str]) -> None:
    for command in ("query", "evaluate"):
        assert "-k, --k K" in help_texts[command]


def test_search_help_names_only_options_search_takes(help_texts: dict[str, str]) -> None:
    text = help_texts["search"]
    assert "--db-retry SECONDS" in text
    for option in ("--jobs", "--dry-run"):
        assert option not in text
    assert "--storage URL" in help_texts["audit"]


def test_toy_help_is_short_and_points_to_the_docs(help_texts: dict[str, str]) -> None:
    text = help_texts["toy"]
    assert len(text.splitlines()) < 40 and "docs/usage.md" in text
    assert "The toy example" in (Path(__file__).resolve().parent.parent / "docs" / "usage.md").read_text()


def test_help_answers_without_importing_a_named_plugin(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    plugin = tmp_path / "marker_plugin.py"
    plugin.write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('yes')\n")
    result, found = run_python(RUN_AND_REPORT_IMPORTS, "train", "--help", "--plugin", str(plugin))
    assert found["code"] == 0 and "Usage: dmlbench train" in result.stdout
    assert not marker.exists() and found["imported"] == []
    # The command itself imports it (before its own checks of its arguments).
    result, found = run_python(RUN_AND_REPORT_IMPORTS, "--plugin", str(plugin), "list", "nosuchkind")
    assert found["code"] == 2 and marker.read_text() == "yes", result.stderr


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["train", "missing.yaml"], "config file missing.yaml does not exist"),
        (["train", "--resume", "-o", "missing_run"], "run directory missing_run does not exist"),
        (["evaluate", "missing_run"], "run directory missing_run does not exist"),
        (["evaluate", "--embeddings", "missing.npy", "--labels", "labels.npy"], "embeddings file missing.npy does not exist"),
        (["evaluate", "--embeddings", "labels.npy", "--labels", "missing.npy"], "labels file missing.npy does not exist"),
        (["benchmark", "missing.yaml"], "benchmark config missing.yaml does not exist"),
        (["search", "missing.yaml"], "config missing.yaml does not exist"),
        (["report", "missing_dir"], "missing_dir holds no benchmark study"),
        (["audit", "missing_dir"], "missing_dir holds no benchmark study"),
        (["status", "missing_dir"], "missing_dir holds no benchmark study"),
        (["embed", "missing_run", "-o", "emb", "--images", "."], "run directory missing_run does not exist"),
        (["embed", "run", "-o", "emb", "--images", "missing_images"], "--images missing_images does not exist"),
        (["export", "missing_run", "--format", "onnx", "-o", "model.onnx"], "run directory missing_run does not exist"),
        (["index", "missing_emb", "-o", "index"], "embeddings missing_emb.npy do not exist"),
        (["query", "missing_index", "--embeddings", "labels.npy"], "missing_index is not a dmlbench index"),
        (["query", "index", "--embeddings", "missing.npy"], "query embeddings file missing.npy does not exist"),
        (["data", "check", "missing.yaml"], "config file missing.yaml does not exist"),
        (["data", "check", "folder", "--root", "missing_root"], "--root missing_root does not exist"),
        (["data", "fetch", "emoji", "--root", "labels.npy/emoji"], "--root labels.npy/emoji: labels.npy is a file"),
        (["data", "fetch", "emoji", "--root", "emoji", "--tarballs", "labels.npy"], "--tarballs labels.npy is a file"),
        (["calibrate", "missing_run", "--fmr", "1e-3", "-o", "calibration.json"], "run directory missing_run does not exist"),
        (["calibrate", "--embeddings", "missing.npy", "--labels", "labels.npy", "--test-embeddings", "labels.npy",
          "--test-labels", "labels.npy", "--fmr", "1e-3", "-o", "calibration.json"],
         "embeddings file missing.npy does not exist"),
        (["calibrate", "run", "--fmr", "1e-3", "-o", "labels.npy/calibration.json"], "-o labels.npy is a file"),
        (["plan", "missing.yaml", "--sd", "0.01"], "benchmark config missing.yaml does not exist"),
        (["plan", "missing.yaml", "--pilot", "missing_dir"], "--pilot missing_dir does not exist"),
        (["toy", "-o", "labels.npy/out"], "labels.npy is a file, not a directory"),
        (["list", "nosuchkind"], "unknown kind 'nosuchkind'"),
    ],
)
def test_a_missing_path_is_one_line_exit_2_before_torch(arguments: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "labels.npy").write_bytes(b"\x93NUMPY")  # an existing file; never read before the error
    (tmp_path / "run").mkdir()
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "index.json").write_text("{}")
    result, found = run_python(RUN_AND_REPORT_IMPORTS, *arguments, cwd=tmp_path)
    assert found["code"] == 2
    assert result.stderr.splitlines() == [f"dmlbench: error: {message}"] or (
        len(result.stderr.splitlines()) == 1 and message in result.stderr), result.stderr
    assert found["imported"] == [], f"imported {found['imported']} before reporting a missing path"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["index", "labels.npy", "run"]  # nothing written
