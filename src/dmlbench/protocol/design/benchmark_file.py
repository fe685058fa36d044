"""``benchmark.json`` as a typed record: what a benchmark recorded when it started (its description,
storage, config hash, commit, machine) and the changes accepted on purpose since. Every reader (the
protocol, the audit, ``dmlbench status``, the report) goes through ``read_benchmark``, the writer
(``protocol.run.record``) through ``write_benchmark``.

The file is versioned by ``format``. A file without one was written before the field existed and is
format 1, which this one is too: the fields are the same, so every benchmark directory written so far
opens and continues. A file of a newer format, one that is not JSON or one that does not hold these
fields is refused with one line, and nothing is written over it.

Only the keys a file holds are written back (``exclude_unset``): a benchmark started before a key
existed keeps its description, so its config hash and the comparison of ``protocol.design.prepare`` stay as
they were. Keys this version does not know are kept too (``extra="allow"``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator

from dmlbench import files
from dmlbench.analysis.spec import AnalysisSpec
from dmlbench.errors import UserInputError
from dmlbench.protocol.design.benchmark import SHARED_SEEDS, ProtocolSpec
from dmlbench.protocol.layout import BENCHMARK_FILE, JOURNAL_FILE, SQLITE_FILE
from dmlbench.protocol.queue import storage as storage_module

# The format this version writes; it reads this one and the older ones. Raise it when a field changes
# meaning or a new field must not be ignored by an older dmlbench.
BENCHMARK_FORMAT = 1


class _Stored(BaseModel):
    model_config = ConfigDict(extra="allow")


class StoredMethod(_Stored):
    """A method of the stored spec: its overrides of the base config and its search space."""

    name: str
    overrides: dict[str, Any] = Field(default_factory=dict)
    search: dict[str, Any] = Field(default_factory=dict)


class StoredSpec(_Stored):
    """The benchmark YAML as recorded: without its analysis and tracking settings, and without the
    protocol keys left at the defaults they had before they existed (``prepare.Prepared.description``)."""

    plugins: list[str] = Field(default_factory=list)
    base: dict[str, Any] = Field(default_factory=dict)
    methods: list[StoredMethod] = Field(default_factory=list)
    protocol: dict[str, Any] = Field(default_factory=dict)


class StoredProtocol(ProtocolSpec):
    """The protocol settings; a key a benchmark started before it existed reads as its default. A benchmark whose
    description leaves out ``search_seeds`` and ``resplit_per_search`` (one search per method, or recorded before
    they existed) ran every search on search 0's seeds and folds."""

    model_config = ConfigDict(extra="allow")
    search_seeds: Literal["fresh", "shared"] = SHARED_SEEDS
    resplit_per_search: StrictBool | None = False

    @field_validator("reproductions")
    @classmethod
    def _enough_reproductions(cls, value: int) -> int:
        # Replaces the config's rule (at least 2): a benchmark started before that rule with one
        # reproduction still opens, and its report says why it has no intervals.
        if value < 1:
            raise ValueError(f"{value} reproductions: a benchmark has at least one")
        return value


class StoredAnalysis(AnalysisSpec):
    """An analysis (declared, or accepted later); a key missing from an old file reads as its default."""

    model_config = ConfigDict(extra="allow")


class StoredFold(_Stored):
    index: int
    train_classes: list[int]
    val_classes: list[int]


class StoredFoldLayout(_Stored):
    """``folds.FoldLayout.as_dict()``: the development classes cut into folds, and the test classes."""

    k: int
    mode: str
    development_classes: list[int] = Field(default_factory=list)
    test_classes: list[int]
    folds: list[StoredFold] = Field(default_factory=list)


class StoredDataset(_Stored):
    name: str
    content_hash: str


class AnalysisChange(_Stored):
    """An analysis change accepted with ``--accept-analysis-change``: when, which keys, the analysis now in force."""

    time: str
    changed: list[str]
    analysis: StoredAnalysis


class PluginChange(_Stored):
    """A plugin code change accepted with ``--accept-plugin-changes``: when, what changed, the plugins' identities."""

    time: str
    changes: list[str]
    plugins: list[dict[str, Any]]


class BenchmarkRecord(_Stored):
    """The contents of ``benchmark.json``, in the order they are written."""

    format: StrictInt = Field(BENCHMARK_FORMAT, ge=1)
    spec: StoredSpec = Field(default_factory=StoredSpec)  # absent from the first benchmarks
    overrides: list[str] = Field(default_factory=list)
    protocol: StoredProtocol
    methods: list[str]
    metrics: list[str] = Field(default_factory=list)
    fold_layout: StoredFoldLayout | None = None  # absent from the first benchmarks
    fold_layout_hash: str = ""
    dataset: StoredDataset
    plugins: list[dict[str, Any]] = Field(default_factory=list)  # ``plugins.identity``; absent: none
    # ``trunks.pretrained_weights`` of the methods' trunks (absent: random weights, or recorded before it existed)
    pretrained_weights: list[dict[str, Any]] | None = None
    analysis: StoredAnalysis | None = None  # the declared analysis
    analysis_in_hash: bool = False  # absent: started before the analysis entered the config hash
    storage: str
    config_hash: str | None = None
    git_commit: str | None = None
    created: str | None = None
    environment: dict[str, Any] | None = None  # the machine of the worker that started it
    # torch threads of a run (``training.num_threads``; ``auto`` fixed when it started; absent: started before it was)
    threads_per_worker: int | None = None
    # ``prepare.data_source``: test images, images per domain, licences (absent: recorded before it existed)
    data_source: dict[str, Any] | None = None
    # The command that started it: ``BenchmarkSpec.config_file`` (the YAML, or ``built-in``) and every override as
    # given; a report prints commands that run as printed from them (absent: not known)
    config_file: str | None = None
    command_overrides: list[str] = Field(default_factory=list)
    analysis_changes_accepted: list[AnalysisChange] = Field(default_factory=list)
    plugin_changes_accepted: list[PluginChange] = Field(default_factory=list)

    def stored(self) -> dict[str, Any]:
        """The record as JSON values, with only the keys the file holds (or was created with)."""
        return self.model_dump(mode="json", exclude_unset=True)

    def declared_analysis(self) -> dict[str, Any]:
        """The analysis declared when the benchmark started, as stored (``{}``: none recorded)."""
        return {} if self.analysis is None else self.analysis.model_dump(mode="json", exclude_unset=True)

    def analysis_in_force(self) -> dict[str, Any]:
        """The analysis the benchmark is read with, as stored: the last change accepted with
        ``--accept-analysis-change``, else the declared one (``{}``: none recorded)."""
        if self.analysis_changes_accepted:
            return self.analysis_changes_accepted[-1].analysis.model_dump(mode="json", exclude_unset=True)
        return self.declared_analysis()

    def analysis_spec(self) -> AnalysisSpec:
        """``analysis_in_force`` typed, as the judging functions of ``analysis`` take it."""
        return AnalysisSpec.in_force(self.analysis_in_force())

    @property
    def references(self) -> list[str]:
        """The declared analysis's reference methods (none: ``[]``)."""
        return [] if self.analysis is None else list(self.analysis.references)


def benchmark_path(output_dir: Path) -> Path:
    return Path(output_dir) / BENCHMARK_FILE


def read_benchmark(output_dir: Path) -> BenchmarkRecord:
    """The record of the benchmark in ``output_dir``; a one-line ``UserInputError`` when there is none,
    or when its file is of a newer format, not JSON, or not a benchmark record."""
    record = read_benchmark_if_any(output_dir)
    if record is None:
        raise UserInputError(f"{output_dir} holds no benchmark study (no {BENCHMARK_FILE})")
    return record


def read_benchmark_if_any(output_dir: Path) -> BenchmarkRecord | None:
    """As ``read_benchmark``, ``None`` where ``output_dir`` holds no ``benchmark.json``. Its ``storage`` is
    where the studies are now (``_storage_in``: a moved or copied directory's own file)."""
    path = benchmark_path(output_dir)
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError) as error:
        raise UserInputError(f"{path} is not valid JSON ({error}); restore it from a copy, or use a new output "
                             "directory") from None
    except OSError as error:
        raise UserInputError(f"{path} cannot be read: {error.strerror or error}") from None
    if isinstance(raw, dict):
        written = raw.get("format", BENCHMARK_FORMAT)
        if isinstance(written, int) and not isinstance(written, bool) and written > BENCHMARK_FORMAT:
            raise UserInputError(f"{path} was written by a newer dmlbench (format {written}; this one reads format "
                                 f"{BENCHMARK_FORMAT} and older): upgrade dmlbench to continue or report on it")
    try:
        record = BenchmarkRecord.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(map(str, first["loc"]))
        where = f"key {key!r}: " if key else ""
        raise UserInputError(f"{path} is not a benchmark record ({where}{first['msg']}); restore it from a copy, "
                             "or use a new output directory") from None
    record.storage = _storage_in(output_dir, record.storage)
    return record


def _storage_in(output_dir: Path, url: str) -> str:
    """``url`` as the benchmark now in ``output_dir`` reads it. A default file storage (``study.db`` or
    ``study.journal``, recorded with the absolute path of the directory the benchmark started in) is
    the file of that name in ``output_dir`` where there is one: a benchmark directory moved, or copied
    to another path or machine, keeps its own studies, and a copy never writes to the original's."""
    storage = storage_module.storage_for(url)
    if not isinstance(storage, storage_module.FileStorage) or storage.path.name not in (SQLITE_FILE, JOURNAL_FILE):
        return url
    local = Path(output_dir).resolve() / storage.path.name
    return storage.prefix + str(local) if local.is_file() and local != storage.path else url


def new_benchmark(contents: dict[str, Any]) -> BenchmarkRecord:
    """The record of a benchmark starting now, from what it describes and records (``record.write_benchmark_file``)."""
    return BenchmarkRecord.model_validate({"format": BENCHMARK_FORMAT, **contents})


def write_benchmark(output_dir: Path, record: BenchmarkRecord) -> Path:
    """Write ``record`` as ``benchmark.json`` in ``output_dir`` (atomically), in the current format."""
    record.format = BENCHMARK_FORMAT  # assigned, so that a file that had no format is written with one
    path = benchmark_path(output_dir)
    files.write_json(path, record.stored())
    return path
