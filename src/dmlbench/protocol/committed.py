"""A committed study re-judged from the files it was committed with (``runs.csv`` and ``benchmark.json``),
with no storage and no checkpoints: the running half's file names (``layout``) given to the judging
half's rules (``analysis.verdicts``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dmlbench import files
from dmlbench.analysis.verdicts import rejudged_comparison_csv
from dmlbench.protocol import layout
from dmlbench.protocol.benchmark_file import read_benchmark
from dmlbench.protocol.results import read_runs


@dataclass(frozen=True)
class Rejudged:
    """What re-judging a study found: the new ``comparisons.csv`` text, whether it differs from the
    stored one (how many rows), and a one-line summary."""

    text: str
    changed: bool
    summary: str


def rejudge(directory: Path, *, write: bool) -> Rejudged:
    """``comparisons.csv`` of the study in ``directory`` as today's rules give it from its committed files;
    with ``write`` it replaces the stored one (atomically) when they differ."""
    text = rejudged_comparison_csv(read_runs(directory), read_benchmark(directory).analysis_in_force(), layout.BASELINES)
    path = Path(directory) / layout.COMPARISONS_CSV
    stored = path.read_text() if path.is_file() else ""
    new_rows, old_rows = text.splitlines()[1:], stored.splitlines()[1:]
    differing = sum(row not in old_rows for row in new_rows) + sum(row not in new_rows for row in old_rows)
    if text == stored:
        return Rejudged(text, False, f"{path}: {len(new_rows)} comparisons, the same as today's rules give")
    if write:
        files.atomic_write_text(path, text)
    verb = "rewritten" if write else "differs from today's rules"
    return Rejudged(text, True, f"{path}: {verb} ({len(old_rows)} rows stored, {len(new_rows)} re-judged, {differing} rows differ)")
