"""The layout of a benchmark's output directory: every file name, run-directory name and stage name.

The protocol writes, and the audit, the report and ``dmlbench status`` read, through these names
only, so that a renamed file is renamed everywhere::

    OUTPUT_DIR/
      benchmark.json           the spec, overrides, protocol, fold layout, dataset hash, git commit
      benchmark.lock           held by the worker(s) writing the directory now (``dmlbench.ownership``)
      study.db | study.journal the Optuna studies (unless --storage names a database server)
      test_access.jsonl        every opening of the test data
      search.json, reproductions.json, results.json   summaries, rebuilt from the studies
      results.csv, runs.csv    the leaderboard and its per-reproduction values
      trunks/fold_K, features/fold_K.pt                the frozen-trunk feature cache
      METHOD/trial_SSSS/fold_K                         search runs (slot SSSS)
      METHOD/reproduction_RR/fold_K                    reproduction runs; test_metrics.json beside them
      METHOD@searchK/...                               search repeat K of a method (protocol.search_repeats)
"""

from __future__ import annotations

from pathlib import Path

BENCHMARK_FILE = "benchmark.json"
TEST_ACCESS_FILE = "test_access.jsonl"
SEARCH_FILE = "search.json"
REPRODUCTIONS_FILE = "reproductions.json"
RESULTS_FILE = "results.json"
RESULTS_CSV = "results.csv"
RUNS_CSV = "runs.csv"
REPORT_FILE = "report.md"
# Held (flock) while workers write the directory: by one process with SQLite, shared by the workers
# of a journal or PostgreSQL storage; removed by the last one.
LOCK_FILE = "benchmark.lock"

SEARCH_STAGE = "search"
REPRODUCTION_STAGE = "reproduction"
TRUNK_STAGE = "trunk"
# The baseline row's method name, reserved in a benchmark YAML.
UNTRAINED = "untrained"
TRUNKS_DIR = "trunks"
FEATURES_DIR = "features"
RESERVED_METHOD_NAMES = (UNTRAINED, TRUNKS_DIR, FEATURES_DIR)
# Joins a method's name and the number of a repeat of its search; not allowed in a method's name.
SEARCH_REPEAT_MARK = "@search"


def trial_dir(output_dir: Path, method: str, slot: int) -> Path:
    """The run directories of search slot ``slot`` (one ``fold_K`` per fold)."""
    return Path(output_dir) / method / f"trial_{slot:04d}"


def reproduction_dir(output_dir: Path, method: str, reproduction: int) -> Path:
    """The run directories of one reproduction (one ``fold_K`` per fold) and its ``test_metrics.json``."""
    return Path(output_dir) / method / f"reproduction_{reproduction:02d}"


def fold_dir(directory: Path, fold: int) -> Path:
    return Path(directory) / f"fold_{fold}"


def search_repeat_name(method: str, repeat: int) -> str:
    """The name under which search repeat ``repeat`` >= 1 of ``method`` (``protocol.search_repeats``) is
    stored: its studies, its run directories ``METHOD@searchK/...``."""
    return f"{method}{SEARCH_REPEAT_MARK}{repeat}"


def reproduction_study(method: str) -> str:
    """The study of a method's reproductions (``untrained``: the baseline's); a search study is the method's name."""
    return f"reproductions:{method}"
