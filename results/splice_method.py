"""A committed study with one method re-measured: the study's committed rows with that method's rows taken
from a run of the same design that measured it alone (after a fix that changes that method only), ready to
be re-judged by ``dmlbench rejudge``.

    python results/splice_method.py results/converged_glyphs \
        results/converged_glyphs_semihard_fix/triplet_semihard --method triplet_semihard \
        -o results/converged_glyphs_semihard_fix
    dmlbench rejudge results/converged_glyphs_semihard_fix

The re-measure must have the study's design: the same base config, protocol, fold layout and the method's
own overrides and search (``benchmark.json``), so its rows are the ones the whole study would produce
today, trained with the study's thread count (``threads_per_worker``; a thread count changes a run's last
digits and a search's choices), which it can check only where both recorded it. Every other method's
rows are the study's as committed; the baselines it also ran are compared with the study's and reported
(identical values: the data, code and machine give the study's untrained runs).
It writes ``runs.csv`` and ``results.csv`` (the method's rows replaced where they stood) and the study's
``benchmark.json`` (its declared analysis), and prints what it did.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
from pathlib import Path

from dmlbench.errors import UserInputError
from dmlbench.protocol.design.benchmark_file import read_benchmark
from dmlbench.protocol.layout import BASELINES, BENCHMARK_FILE, RESULTS_CSV, RUNS_CSV


def design_differences(study: Path, remeasure: Path, method: str) -> list[str]:
    """What differs between two studies' designs (``benchmark.json``), as far as ``method``'s runs are concerned;
    a protocol key one of them predates reads as its default."""
    records = [read_benchmark(folder) for folder in (study, remeasure)]
    found = [key for key in ("fold_layout_hash", "dataset") if getattr(records[0], key) != getattr(records[1], key)]
    if records[0].protocol.model_dump() != records[1].protocol.model_dump():
        found.append("protocol")
    if records[0].spec.base != records[1].spec.base:
        found.append("spec.base")
    if None not in (records[0].threads_per_worker, records[1].threads_per_worker) and \
            records[0].threads_per_worker != records[1].threads_per_worker:
        found.append("threads_per_worker")
    own = [[entry for entry in record.spec.methods if entry.name == method] for record in records]
    if not own[0] or not own[1]:
        found.append(f"no method {method!r} in {'the study' if not own[0] else 'the re-measure'}")
    elif own[0] != own[1]:
        found.append(f"spec.methods[{method}]")
    return found


def _rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The file's columns and rows; a damaged copy (cut short: the report writes it whole, ending in a
    newline; a row with missing fields) is a ``ValueError`` naming it, never rows spliced from part of it."""
    text = path.read_text()
    reader = csv.DictReader(text.splitlines())
    rows = list(reader)
    if not text.endswith("\n") or any(None in row.values() or None in row for row in rows):
        raise ValueError(f"{path} is truncated or damaged; restore it from a copy")
    return list(reader.fieldnames or []), rows


def spliced(study_rows: list[dict[str, str]], remeasured: list[dict[str, str]], method: str) -> list[dict[str, str]]:
    """``study_rows`` with ``method``'s rows replaced by ``remeasured``'s, at the place the first of them held."""
    new = [row for row in remeasured if row["method"] == method]
    if not new:
        raise ValueError(f"the re-measure holds no row of {method!r}")
    place = next((i for i, row in enumerate(study_rows) if row["method"] == method), None)
    if place is None:
        raise ValueError(f"the study holds no row of {method!r}")
    kept = [row for row in study_rows if row["method"] != method]
    before = sum(1 for row in study_rows[:place] if row["method"] != method)
    return kept[:before] + new + kept[before:]


def _in_columns(rows: list[dict[str, str]], columns: list[str], wanted: list[str]) -> list[dict[str, str]]:
    """``rows`` with ``wanted``'s columns; a ``search`` column the study predates may be dropped only where
    every row is search 0 (the re-measure searched once, as the study did)."""
    extra = [name for name in columns if name not in wanted]
    missing = [name for name in wanted if name not in columns]
    if missing or extra not in ([], ["search"]) or any(row.get("search", "0") not in ("0", "") for row in rows):
        raise ValueError(f"the re-measure's columns {columns} do not fit the study's {wanted}")
    return [{name: row[name] for name in wanted} for row in rows]


def _write(path: Path, columns: list[str], rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def baseline_agreement(study_rows: list[dict[str, str]], remeasured: list[dict[str, str]]) -> str:
    """Whether the baselines both ran give the same values to the last digit."""
    def values(rows: list[dict[str, str]]) -> dict[tuple[str, ...], str]:
        return {tuple(row[key] for key in row if key != "value"): row["value"] for row in rows if row["method"] in BASELINES}
    ours, theirs = values(study_rows), values(remeasured)
    common = set(ours) & set(theirs)
    same = sum(ours[key] == theirs[key] for key in common)
    return f"baselines: {same} of {len(common)} values in both identical"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path, help="the committed study (a report folder)")
    parser.add_argument("remeasure", type=Path, help="the report of the run that measured the method alone")
    parser.add_argument("--method", required=True, help="the method whose rows are replaced")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the folder to write")
    args = parser.parse_args(argv)
    for folder in (args.study, args.remeasure):
        for name in (RUNS_CSV, BENCHMARK_FILE, RESULTS_CSV):
            if not (folder / name).is_file():
                parser.error(f"{folder} holds no {name}")
    try:
        differences = design_differences(args.study, args.remeasure, args.method)
    except UserInputError as error:
        parser.error(str(error))
    if differences:
        parser.error(f"{args.remeasure} does not have {args.study}'s design: {', '.join(differences)} differ")
    tables, agreement = {}, ""
    try:
        for name in (RUNS_CSV, RESULTS_CSV):
            columns, rows = _rows(args.study / name)
            new_columns, new_rows = _rows(args.remeasure / name)
            new_rows = _in_columns(new_rows, new_columns, columns)
            tables[name] = (columns, spliced(rows, new_rows, args.method))
            if name == RUNS_CSV:
                agreement = baseline_agreement(rows, new_rows)
    except ValueError as error:
        parser.error(str(error))
    args.output.mkdir(parents=True, exist_ok=True)
    for name, (columns, rows) in tables.items():
        _write(args.output / name, columns, rows)
    print(agreement)
    shutil.copyfile(args.study / BENCHMARK_FILE, args.output / BENCHMARK_FILE)
    print(f"{args.output}: {args.study}'s {RUNS_CSV} and {RESULTS_CSV} with {args.method}'s rows from {args.remeasure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
