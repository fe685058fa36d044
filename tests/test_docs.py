"""The documentation runs as written: every fenced command block of README.md and docs/*.md is run,
or says why it cannot be.

A block is marked by an HTML comment on the line just before its opening fence (CONTRIBUTING.md):

- ``<!-- runnable -->``: run with bash (``set -euo pipefail``) or, for a ``python`` block, the
  interpreter of these tests, in a new folder holding copies of ``configs/`` and ``examples/``, with
  this environment's ``dmlbench`` first on ``PATH``; it must exit 0. The runnable blocks of one file run
  in order in one folder, as a reader following the page would run them.
- ``<!-- runnable: slow -->``: the same, in the slow suite (``python -m pytest -m slow``).
- ``<!-- runnable: exit=2 -->``: the block is documented to fail; it must exit with that code.
- ``<!-- runnable: fresh -->`` (with ``slow``): a set-up command for a fresh machine, run in a new
  virtual environment on a copy of the package (it installs from the package index).
- ``<!-- runnable: ci -->``: CI runs exactly these commands (``.ci/run``); checked against that script.
- ``<!-- not-runnable: REASON -->``: not run (a real dataset on disk, a GPU, placeholders), for REASON.

Every block whose language is a shell, ``python`` or not given must carry one of these, so nothing
is skipped silently; ``text`` and ``yaml`` blocks are not commands.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import replicas

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGUAGES = frozenset({"bash", "sh", "shell"})
COMMAND_LANGUAGES = SHELL_LANGUAGES | {"", "console", "python", "py", "pycon"}
RUNNABLE_OPTIONS = frozenset({"slow", "fresh", "ci"})
VALUED_OPTIONS = frozenset({"exit", "replica"})  # exit=N; replica=NAME: replicas.DOC_REPLICAS[NAME] under ~/data
BLOCK_TIMEOUT_S = 300
SLOW_BLOCK_TIMEOUT_S = 3600
# What a block may read besides what it creates: the shipped configs and the worked example.
COPIED_FOLDERS = ("configs", "examples")
# What `pip install -e .` of a fresh machine needs from the repository, besides the copied folders.
PACKAGE_FILES = ("pyproject.toml", "README.md", "src")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)")
_MARKER = re.compile(r"^\s*<!--\s*(runnable|not-runnable)\s*(?::\s*(.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text and its marker (``None``: unmarked)."""

    document: Path
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    marker: str | None  # "runnable" or "not-runnable"
    options: str

    @property
    def where(self) -> str:
        shown = self.document.relative_to(REPO) if self.document.is_relative_to(REPO) else self.document
        return f"{shown}:{self.line}"

    def runnable_options(self) -> dict[str, str]:
        """``slow, exit=2`` -> ``{"slow": "", "exit": "2"}``."""
        options = {}
        for part in filter(None, (piece.strip() for piece in self.options.split(","))):
            key, _, value = part.partition("=")
            options[key.strip()] = value.strip()
        return options

    @property
    def slow(self) -> bool:
        return "slow" in self.runnable_options()

    @property
    def expected_exit(self) -> int:
        return int(self.runnable_options().get("exit", "0"))


def fenced_blocks(document: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with the marker on the line before its opening fence."""
    lines = document.read_text(encoding="utf-8").splitlines()
    blocks, index = [], 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, language = opening.group(1), opening.group(2).lower()
        end = index + 1
        while end < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        marker = _MARKER.match(lines[index - 1]) if index > 0 else None
        blocks.append(Block(document, index + 1, language, "\n".join(lines[index + 1:end]) + "\n",
                            marker.group(1) if marker else None, (marker.group(2) or "") if marker else ""))
        index = end + 1
    return blocks


ALL_BLOCKS = [block for document in DOCUMENTS for block in fenced_blocks(document)]


def _marker_problems(block: Block) -> list[str]:
    if block.marker is None:
        return [f"{block.where}: an unmarked {block.language or 'untagged'} block: add <!-- runnable --> or <!-- not-runnable: reason -->"]
    if block.marker == "not-runnable":
        return [] if block.options else [f"{block.where}: <!-- not-runnable --> needs a reason after a colon"]
    problems = []
    if block.language not in SHELL_LANGUAGES | {"python"}:
        problems.append(f"{block.where}: a runnable block must be tagged bash or python, not {block.language or 'untagged'!r}")
    for key, value in block.runnable_options().items():
        if key == "exit" and not value.isdigit():
            problems.append(f"{block.where}: exit={value!r} is not an exit code")
        elif key == "replica" and value not in replicas.DOC_REPLICAS:
            problems.append(f"{block.where}: no replica {value!r} (tests/replicas.py: {', '.join(replicas.DOC_REPLICAS)})")
        elif key not in VALUED_OPTIONS and (key not in RUNNABLE_OPTIONS or value):
            problems.append(f"{block.where}: unknown runnable option {key!r} (slow, fresh, ci, exit=N, replica=NAME)")
    if "fresh" in block.runnable_options() and not block.slow:
        problems.append(f"{block.where}: a fresh block installs from the package index: mark it slow too")
    return problems


def test_every_command_block_is_marked_runnable_or_says_why_not() -> None:
    problems = [problem for block in ALL_BLOCKS if block.language in COMMAND_LANGUAGES or block.marker
                for problem in _marker_problems(block)]
    assert not problems, "\n".join(problems)


def test_the_parser_finds_blocks_markers_and_options(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n<!-- runnable: slow, exit=2 -->\n```bash\nfalse\n```\n\n```\nls\n```\n"
                    "<!-- not-runnable: a GPU -->\n~~~python\n```\n~~~\n```text\na -> b\n```\n")
    blocks = fenced_blocks(page)
    assert [(block.line, block.language, block.marker) for block in blocks] == [
        (3, "bash", "runnable"), (7, "", None), (11, "python", "not-runnable"), (14, "text", None)]
    assert blocks[0].text == "false\n" and blocks[0].slow and blocks[0].expected_exit == 2
    assert blocks[2].text == "```\n" and blocks[2].options == "a GPU"
    assert [problem.split(": ")[0] for block in blocks for problem in _marker_problems(block)
            if block.language in COMMAND_LANGUAGES or block.marker] == [f"{page}:7"]


def test_no_marker_is_left_without_its_block() -> None:
    """A marker separated from its fence by a blank line or prose would mark nothing."""
    marked = {(block.document, block.line - 1) for block in ALL_BLOCKS if block.marker}
    stray = [f"{document.relative_to(REPO)}:{number}"
             for document in DOCUMENTS
             for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), start=1)
             if _MARKER.match(line) and (document, number) not in marked]
    assert not stray, f"markers not directly above a fenced block: {stray}"


def test_the_readme_test_command_is_what_ci_runs() -> None:
    """A ``ci`` block's commands are run by .ci/run, in the same order."""
    ci_blocks = [block for block in ALL_BLOCKS if block.marker == "runnable" and "ci" in block.runnable_options()]
    assert ci_blocks, "the README's test command is marked <!-- runnable: ci -->"
    script = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    for block in ci_blocks:
        commands = [command.strip() for line in block.text.splitlines() for command in line.split("&&") if command.strip()]
        positions = [script.index(command) if command in script else -1 for command in commands]
        assert -1 not in positions and positions == sorted(positions), f"{block.where}: {commands} not run in order by .ci/run"


def test_the_readme_sets_up_a_fresh_machine_in_two_commands() -> None:
    """One installs and runs the built-in benchmark, one installs and runs the tests; both are run."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index("## Set up on a fresh machine")
    end = readme.index("\n## ", start + 1)
    set_up = [block for block in fenced_blocks(REPO / "README.md") if start < _offset(readme, block.line) < end]
    assert [(block.marker, block.options) for block in set_up] == [("runnable", "slow, fresh"), ("runnable", "ci")]
    assert "dmlbench benchmark" in set_up[0].text and "pytest" in set_up[1].text


def _offset(text: str, line: int) -> int:
    return sum(len(row) + 1 for row in text.splitlines()[:line - 1])


def _documents_with(slow: bool) -> list[Path]:
    return [document for document in DOCUMENTS if any(_is_run_here(block, slow) for block in fenced_blocks(document))]


def _is_run_here(block: Block, slow: bool) -> bool:
    return block.marker == "runnable" and "ci" not in block.runnable_options() and block.slow == slow


@pytest.mark.parametrize("document", _documents_with(slow=False), ids=lambda path: str(path.relative_to(REPO)))
def test_runnable_blocks_run_as_written(document: Path, tmp_path: Path) -> None:
    _run_blocks(document, tmp_path, slow=False)


@pytest.mark.slow
@pytest.mark.parametrize("document", _documents_with(slow=True), ids=lambda path: str(path.relative_to(REPO)))
def test_slow_runnable_blocks_run_as_written(document: Path, tmp_path: Path) -> None:
    _run_blocks(document, tmp_path, slow=True)


def _run_blocks(document: Path, tmp_path: Path, slow: bool) -> None:
    workdir = tmp_path / "reader"
    for folder in COPIED_FOLDERS:
        shutil.copytree(REPO / folder, workdir / folder)
    for block in fenced_blocks(document):
        if _is_run_here(block, slow):
            result = _run_block(block, workdir, tmp_path)
            assert result.returncode == block.expected_exit, (
                f"{block.where} exited {result.returncode}, documented {block.expected_exit}:\n{block.text}\n"
                f"--- stdout (end) ---\n{result.stdout[-3000:]}\n--- stderr (end) ---\n{result.stderr[-3000:]}"
            )


def _run_block(block: Block, workdir: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    bin_dir = Path(sys.executable).parent
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if "fresh" in block.runnable_options():
        workdir = _fresh_checkout(tmp_path / "fresh")
        bin_dir = _fresh_virtual_environment(tmp_path / "fresh-venv")
        environment["VIRTUAL_ENV"] = str(bin_dir.parent)
    environment["PATH"] = f"{bin_dir}{os.pathsep}{environment.get('PATH', '')}"
    replica = block.runnable_options().get("replica")
    if replica:
        # The block reads ~/data/NAME as a user's machine holds it: a small replica in a home of its own.
        home = tmp_path / "home"
        if not (home / "data" / replica).exists():
            replicas.DOC_REPLICAS[replica](home / "data")
        environment["HOME"] = str(home)
    script = tmp_path / f"block_{block.line}"
    if block.language == "python":
        script.write_text(block.text)
        command = [str(bin_dir / "python"), str(script)]
    else:
        script.write_text("set -euo pipefail\n" + block.text)
        command = ["bash", str(script)]
    timeout = SLOW_BLOCK_TIMEOUT_S if block.slow else BLOCK_TIMEOUT_S
    return subprocess.run(command, cwd=workdir, env=environment, capture_output=True, text=True, timeout=timeout)


def _fresh_checkout(target: Path) -> Path:
    """What a fresh clone holds for installing and running the package."""
    for name in (*PACKAGE_FILES, *COPIED_FOLDERS):
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _fresh_virtual_environment(target: Path) -> Path:
    """A new virtual environment of the interpreter this one was made from; its ``bin`` folder."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(target)], check=True, capture_output=True, timeout=300)
    return target / "bin"


def test_the_smoke_configs_duration_is_the_one_the_protocol_page_gives() -> None:
    """configs/smoke.yaml's header and docs/protocol.md state the same duration (they once said 3 minutes and 11 s)."""
    stated = re.search(r"(\d+ to \d+ s) on 2 cores", (REPO / "configs" / "smoke.yaml").read_text())
    assert stated is not None
    assert f"`configs/smoke.yaml` (the whole protocol in {stated.group(1)} on 2 cores" in (REPO / "docs" / "protocol.md").read_text()


def test_the_readme_stays_a_manual() -> None:
    """At most 200 lines, no reading history (commit hashes, dated readings): those are docs/performance.md's."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    assert not re.search(r"commit [0-9a-f]{7}", readme), "measurement history belongs in docs/performance.md"
    assert "docs/performance.md" in readme and "[docs/datasets.md](docs/datasets.md)" in readme
