"""The layout of a benchmark's output directory: every file name, folder name, run-directory name and
stage name. (The files inside a run directory are ``training.records``'s.)

The protocol writes, and the audit, the report, the API and ``dmlbench status`` read, through these
names only, so that a renamed file is renamed everywhere (``tests/test_architecture.py`` checks that
no other module spells them)::

    OUTPUT_DIR/
      benchmark.json           the spec, overrides, protocol, fold layout, dataset hash, git commit
                               (``protocol.design.benchmark_file``)
      benchmark.lock           held by the worker(s) writing the directory now (``dmlbench.ownership``)
      study.db | study.journal the Optuna studies (unless --storage names a database server);
                               study.journal.work-lock: the journal's work lock
      test_access.jsonl        every opening of the test data
      search.json, reproductions.json, results.json   summaries, rebuilt from the studies
      results.csv, runs.csv    the leaderboard and its per-reproduction values
      report.md, report.html, comparisons.csv, results.tex, the claim and uncertainty CSVs, the figures
                               the report (``report.build.write_report``)
      trunks/fold_K, features/fold_K.pt, features/.lock the frozen-trunk feature cache
      slurm.json, slurm/       the SLURM jobs of ``--slurm`` and their scripts and logs
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
REPORT_HTML = "report.html"
COMPARISONS_CSV = "comparisons.csv"
RESULTS_TEX = "results.tex"
# The claim files of ``report.analysis`` and ``report.uncertainty``.
CLAIM_COMPARISONS_CSV = "claim_comparisons.csv"
METHOD_COMPARISONS_CSV = "method_comparisons.csv"  # verdicts about the methods, their repeated searches included
SEQUENTIAL_CSV = "sequential.csv"  # a sequential study's looks (protocol.sequential)
EMBEDDING_SPACE_CSV = "embedding_space.csv"
CORRELATIONS_CSV = "correlations.csv"
RANKINGS_CSV = "rankings.csv"
VALIDATION_CURVES_CSV = "validation_curves.csv"
CLASS_BOOTSTRAP_CSV = "class_bootstrap.csv"
CLASS_SUMS_CSV = "class_sums.csv"  # per reproduction and test class, what class_bootstrap.csv recomputes from
SEARCH_REPEATS_CSV = "search_repeats.csv"
SEARCH_VARIANCE_CSV = "search_variance.csv"  # each repeated method's search and seed SD (analysis.search_luck)
BUDGET_CSV = "budget.csv"  # expected best validation score over the number of trials (Dodge et al. 2019)
POWER_CSV = "power.csv"
# The report's figures (``report.plots``), linked from report.md and embedded in report.html.
SEARCH_FIGURE = "search.png"
BUDGET_FIGURE = "budget.png"
VALIDATION_CURVES_FIGURE = "validation_curves.png"
FOREST_FIGURE = "forest.png"
DIFFERENCES_FIGURE = "differences.png"
SEQUENTIAL_FIGURE = "sequential.png"
SPACE_FIGURE = "rho_vs_precision_at_1.png"
# The Optuna studies' files of the default storages (``storage.default_url``), and the journal's work
# lock beside its file (not ``PATH.lock``: Optuna's journal backend locks that one itself).
SQLITE_FILE = "study.db"
JOURNAL_FILE = "study.journal"
WORK_LOCK_SUFFIX = ".work-lock"
FEATURES_LOCK = ".lock"  # in FEATURES_DIR: the feature cache is computed once, under this file lock
# Held (flock) while workers write the directory: by one process with SQLite, shared by the workers
# of a journal or PostgreSQL storage; removed by the last one.
LOCK_FILE = "benchmark.lock"

SEARCH_STAGE = "search"
REPRODUCTION_STAGE = "reproduction"
TRUNK_STAGE = "trunk"
# The baseline rows' method names (``protocol.baselines``), reserved in a benchmark YAML: the reference
# method's models before any training step, and the images' pixels themselves as the embedding.
UNTRAINED = "untrained"
RAW_PIXELS = "raw_pixels"
BASELINES = (UNTRAINED, RAW_PIXELS)
TRUNKS_DIR = "trunks"
FEATURES_DIR = "features"
# ``benchmark --slurm``: submitit's scripts, pickles and each task's log, and the record of every
# submission (``protocol.run.slurm``), which ``dmlbench status`` reads.
SLURM_DIR = "slurm"
SLURM_FILE = "slurm.json"
RESERVED_METHOD_NAMES = (*BASELINES, TRUNKS_DIR, FEATURES_DIR, SLURM_DIR)
# Joins a method's name and the number of a repeat of its search; not allowed in a method's name.
SEARCH_REPEAT_MARK = "@search"


def trial_dir(output_dir: Path, method: str, slot: int) -> Path:
    """The run directories of search slot ``slot`` (one ``fold_K`` per fold)."""
    return Path(output_dir) / method / f"trial_{slot:04d}"


def reproduction_dir(output_dir: Path, method: str, reproduction: int) -> Path:
    """The run directories of one reproduction (one ``fold_K`` per fold) and its ``test_metrics.json``."""
    return Path(output_dir) / method / f"reproduction_{reproduction:02d}"


FOLD_PREFIX = "fold_"


def fold_dir(directory: Path, fold: int) -> Path:
    """Fold ``fold``'s run directory of a trial or reproduction, or its trunk run under ``trunks_dir``."""
    return Path(directory) / f"{FOLD_PREFIX}{fold}"


def method_fold_dirs(output_dir: Path, method: str) -> list[Path]:
    """Every fold run directory of a method's trials and reproductions, sorted (``METHOD/*/fold_K``)."""
    return sorted(path for path in (Path(output_dir) / method).glob(f"*/{FOLD_PREFIX}*") if path.is_dir())


def fold_run_dirs(output_dir: Path) -> list[Path]:
    """Every fold run directory of every method's trials and reproductions, sorted (``*/*/fold_K``)."""
    return sorted(path for path in Path(output_dir).glob(f"*/*/{FOLD_PREFIX}*") if path.is_dir())


def search_repeat_dirs(output_dir: Path, method: str) -> list[Path]:
    """The directories of the repeated searches of ``method`` (``METHOD@searchK``), sorted by name."""
    return sorted(path for path in Path(output_dir).glob(f"{method}{SEARCH_REPEAT_MARK}*") if path.is_dir())


def trunks_dir(output_dir: Path) -> Path:
    """The frozen-trunk runs, one ``fold_K`` run directory per fold."""
    return Path(output_dir) / TRUNKS_DIR


def trunk_run_dirs(output_dir: Path) -> list[Path]:
    """Every frozen-trunk run directory, sorted (``trunks/*``)."""
    return sorted(path for path in trunks_dir(output_dir).glob("*") if path.is_dir())


def feature_file(output_dir: Path, fold: int) -> Path:
    """The cached trunk features of fold ``fold`` (``features/fold_K.pt``)."""
    return Path(output_dir) / FEATURES_DIR / f"{FOLD_PREFIX}{fold}.pt"


def feature_lock(output_dir: Path) -> Path:
    """The file lock under which local workers compute the feature cache once."""
    return Path(output_dir) / FEATURES_DIR / FEATURES_LOCK


def search_repeat_name(method: str, repeat: int) -> str:
    """The name under which search repeat ``repeat`` >= 1 of ``method`` (``protocol.search_repeats``) is
    stored: its studies, its run directories ``METHOD@searchK/...``."""
    return f"{method}{SEARCH_REPEAT_MARK}{repeat}"


def fold_study(method: str) -> str:
    """The study of the fold units of a method's search trials (``protocol.fold_units``)."""
    return f"folds:{method}"


def reproduction_study(method: str) -> str:
    """The study of a method's reproductions (a baseline's: ``untrained``, ``raw_pixels``); a search study is
    the method's name."""
    return f"reproductions:{method}"
