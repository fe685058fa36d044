"""The benchmark YAML: a shared ``base`` config, the methods (each its overrides and search space) and
the ``protocol`` budget (seed 001 §3: folds, trials, epochs, reproductions). ``protocol.design.prepare``
checks it and ``protocol.run.schedule`` runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, ValidationError, field_validator, model_validator

from dmlbench import config as config_module
from dmlbench import plugins
from dmlbench.analysis.endpoints import declared_comparisons
from dmlbench.analysis.planning import Family
from dmlbench.analysis.sequential import FUTILITY_POWER
from dmlbench.analysis.spec import AnalysisSpec
from dmlbench.errors import UserInputError
from dmlbench.protocol import layout
from dmlbench.validation import duration_seconds

DEFAULT_BENCHMARK = Path(__file__).resolve().parents[2] / "configs" / "benchmark.yaml"
# A 95% interval and a paired test need two reproductions (seeds) per method at least.
MIN_REPRODUCTIONS = 2
DEFAULT_CLASS_BOOTSTRAP = 1000
# ``protocol.search_seeds``: every repeated search draws its own training seeds (``fresh``), or reuses search 0's
# (``shared``, every study before the key existed; its method-level verdicts use ``analysis.crossed``).
FRESH_SEEDS, SHARED_SEEDS = "fresh", "shared"
# How far apart the seeds of two searches lie under fresh seeds (``plan.search_seed_offset``); reproductions fit below it.
SEARCH_SEED_STRIDE = 100_000
# Protocol keys left out of a benchmark's description (and config hash) while they keep these values, so
# that benchmarks started before the keys existed keep their hash.
# Analysis keys added after benchmarks were first run: at their defaults they stay out of the description
# (and the config hash), so a benchmark started before them keeps its hash.
LATER_ANALYSIS_DEFAULTS: dict[str, Any] = {"planning_search_sd": None, "search_sd": None, "spending": "pocock",
                                           "futility_power": FUTILITY_POWER}
# A sequential study's searches per round, unless ``protocol.round_searches`` says otherwise: the fewest whose
# t statistic has two degrees of freedom at the first look.
DEFAULT_ROUND_SEARCHES = 3
LATER_PROTOCOL_DEFAULTS = {"search_repeats": 1, "search_repeat_methods": [], "class_bootstrap": DEFAULT_CLASS_BOOTSTRAP,
                           "baselines": [layout.UNTRAINED], "fold_units": False, "sequential": False,
                           "max_searches": None, "round_searches": DEFAULT_ROUND_SEARCHES}


class MethodSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    overrides: dict[str, Any] = Field(default_factory=dict)
    # The method's hyper-parameter search space (``dmlbench.protocol.design.search_space``); empty: nothing searched.
    search: dict[str, Any] = Field(default_factory=dict)


class ProtocolSpec(BaseModel):
    """The budget and machinery of the protocol, the same for every method.

    ``startup_trials``: trials drawn at random before the sampler models the objective (``None``:
    Optuna's default, 10; with a budget of 10 trials or fewer the search would otherwise be random);
    ``epochs``: every run's maximum epochs (``None``: the methods' common ``training.epochs``);
    ``patience``: early stopping after this many evaluations without improvement; reproduction
    ``r`` trains with seed ``first_seed + r`` (never the search's seed); ``pruner``: ``none`` or
    ``median`` (a trial is stopped after a fold whose running fold-mean falls below the median);
    ``parallel_trials``: trials of one method suggested from the same history, so that many workers
    can run them at once (1: every suggestion sees every earlier trial, sequential as in seed 001);
    ``fold_units``: every fold run of a search trial is its own unit of work that any worker may take
    (``protocol.fold_units``), so the search keeps methods x folds x ``parallel_trials`` workers busy
    rather than methods x ``parallel_trials``; the results are the same either way, and ``pruner:
    median`` is refused with it (pruning decides after each fold, so it needs them one after another);
    ``frozen_trunk``: the search trains only heads on cached trunk features (``protocol.units.feature_cache``);
    the reproductions still train full models; ``search_repeats``: the whole search (and the
    reproductions of its best trial) run this many times, repeat ``k`` with search seed
    ``search_seed + k``, for ``search_repeat_methods`` (empty: every method), so the report shows how
    much the search's luck moves a method; ``search_seeds``: ``fresh`` (search ``k`` trains its trials
    with the method's seed + ``k * SEARCH_SEED_STRIDE`` and reproduction ``r`` with ``first_seed + k *
    SEARCH_SEED_STRIDE + r``: no seed of one search is another's, and every method uses the same ones, so
    methods stay paired) or ``shared`` (every search reuses search 0's seeds, as before the key existed);
    ``resplit_per_search``: search ``k`` >= 1 cuts the development classes into folds afresh
    (``folds.resplit``; ``None``: whenever searches repeat; the test classes never change);
    ``class_bootstrap``: replicates of the paired bootstrap over
    test classes of the report (0: none); ``baselines``: the rows scored beside the methods without
    training, ``untrained`` (the reference method's models as initialised) and ``raw_pixels`` (each
    test image's pixels, as the models see them, as its embedding); ``sequential``: the searches run in
    rounds of ``round_searches`` (each with its reproductions, fresh seeds and folds) up to ``max_searches``,
    the primary comparisons judged after every round with group-sequential boundaries
    (``analysis.sequential``), each stopping once decided or futile, a method once none of its comparisons
    is open; ``search_repeats`` is then ``max_searches``, the most the study may run; ``budget``: the wall time
    the study spends by default (``--budget``, which overrides it; a view of the study, outside its config hash)."""

    model_config = ConfigDict(extra="forbid")
    folds: int = Field(4, ge=2)
    fold_mode: Literal["contiguous", "interleaved"] = "contiguous"
    trials: int = Field(10, ge=1)
    epochs: int | None = Field(None, ge=1)
    patience: int | None = Field(None, ge=1)
    sampler: Literal["gp", "tpe"] = "gp"
    startup_trials: int | None = Field(None, ge=1)
    pruner: Literal["none", "median"] = "none"
    search_seed: int = Field(0, ge=0)
    reproductions: int = 3
    first_seed: int = Field(1000, ge=0)
    parallel_trials: int = Field(1, ge=1)
    fold_units: StrictBool = False
    frozen_trunk: StrictBool = False
    search_repeats: int = Field(1, ge=1)
    search_repeat_methods: list[str] = Field(default_factory=list)
    search_seeds: Literal["fresh", "shared"] = FRESH_SEEDS
    resplit_per_search: StrictBool | None = None
    class_bootstrap: int = Field(DEFAULT_CLASS_BOOTSTRAP, ge=0)
    baselines: list[Literal["untrained", "raw_pixels"]] = Field(default_factory=lambda: [layout.UNTRAINED])
    sequential: StrictBool = False
    max_searches: int | None = Field(None, ge=2)
    round_searches: int = Field(DEFAULT_ROUND_SEARCHES, ge=2)
    budget: str | None = None

    @field_validator("budget")
    @classmethod
    def _a_duration(cls, value: str | None) -> str | None:
        if value is not None:
            duration_seconds(value)
        return value

    @field_validator("reproductions")
    @classmethod
    def _enough_reproductions(cls, value: int) -> int:
        # With one reproduction the report would silently lose its intervals, paired tests and summary.
        if value < MIN_REPRODUCTIONS:
            raise ValueError(f"{value} is too few: intervals and paired tests need at least {MIN_REPRODUCTIONS} "
                             "reproductions")
        if value > SEARCH_SEED_STRIDE:
            raise ValueError(f"{value} is more than the {SEARCH_SEED_STRIDE} seeds one search may use")
        return value

    @property
    def resplits(self) -> bool:
        """Whether searches after the first cut their own folds (``resplit_per_search``; unset: when searches repeat)."""
        return self.search_repeats > 1 if self.resplit_per_search is None else self.resplit_per_search

    @property
    def fresh_draws(self) -> bool:
        """Whether the repeated searches draw anything afresh (seeds or folds): ``False`` for a design that
        repeats only the search's sampler (every study before ``search_seeds`` existed)."""
        return self.search_repeats > 1 and (self.search_seeds == FRESH_SEEDS or self.resplits)

    def search_concurrency(self, searches: int) -> int:
        """The most units of work ``searches`` searches can run at once: a trial's folds hold one
        worker, ``parallel_trials`` trials of a search at a time; with ``fold_units`` each fold is a unit."""
        return searches * self.parallel_trials * (self.folds if self.fold_units else 1)

    @model_validator(mode="after")
    def _sequential_design(self) -> ProtocolSpec:
        if not self.sequential:
            if self.max_searches is not None:
                raise ValueError("max_searches is the most searches of a sequential study; set sequential: true or "
                                 "use search_repeats for a fixed number of searches")
            return self
        if self.max_searches is None:
            raise ValueError("sequential: true needs max_searches, the most searches any method may run")
        if self.max_searches < self.round_searches:
            raise ValueError(f"max_searches ({self.max_searches}) must be at least round_searches ({self.round_searches})")
        if self.search_repeats not in (1, self.max_searches) or self.search_repeat_methods:
            raise ValueError("a sequential study runs its searches in rounds up to max_searches: leave out search_repeats "
                             "and search_repeat_methods")
        if self.search_seeds != FRESH_SEEDS:
            raise ValueError("a sequential study needs independent searches: search_seeds: fresh")
        self.search_repeats = self.max_searches
        return self

    @model_validator(mode="after")
    def _fold_units_without_pruning(self) -> ProtocolSpec:
        if self.fold_units and self.pruner == "median":
            raise ValueError("fold_units: true runs a trial's folds at once, but pruner: median decides after each "
                             "fold from the folds before it; set pruner: none or fold_units: false")
        if self.frozen_trunk and self.search_repeats > 1 and self.resplits:
            raise ValueError("frozen_trunk caches one trunk per fold of one fold layout, but resplit_per_search gives "
                             "every repeated search its own folds; set resplit_per_search: false")
        return self

    @field_validator("baselines")
    @classmethod
    def _distinct_baselines(cls, value: list[str]) -> list[str]:
        if len(set(value)) < len(value):
            raise ValueError(f"each baseline once, got {value}")
        return value


# ``BenchmarkSpec.config_file`` of the benchmark that ships with dmlbench (``dmlbench benchmark`` without CONFIG).
BUILT_IN = "built-in"


class BenchmarkSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Where ``load_spec`` read it: a YAML path as given, ``BUILT_IN``, or ``None`` (a spec made in code); recorded in
    # benchmark.json so that a report prints commands that run as printed. Not part of the spec or its hash.
    _config_file: str | None = PrivateAttr(default=None)
    plugins: list[str] = Field(default_factory=list)  # modules or .py files that register components
    base: dict[str, Any] = Field(default_factory=dict)
    methods: list[MethodSpec] = Field(min_length=1)
    protocol: ProtocolSpec = Field(default_factory=ProtocolSpec)
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)

    @property
    def config_file(self) -> str | None:
        return self._config_file

    def planned_family(self) -> Family:
        """The declared comparisons of the primary endpoint as ``analysis.planning`` plans them."""
        methods = [method.name for method in self.methods]
        primary = self.analysis.primary
        return Family(declared_comparisons(self.analysis.references, self.analysis.pairs, methods),
                      self.protocol.reproductions, self.analysis.equivalence_margin, (primary.mode, primary.metric),
                      self.protocol.search_repeats, self.protocol.trials, self.protocol.folds)


def load_spec(path: Path | None) -> BenchmarkSpec:
    """The benchmark in the YAML ``path`` (``None``: the built-in one), checked."""
    config_file = BUILT_IN if path is None else str(path)
    path = path or DEFAULT_BENCHMARK
    raw = config_module.read_yaml(path, "benchmark config") or {}
    if not isinstance(raw, dict):
        raise UserInputError(f"benchmark config {path} must be a mapping with the sections base, protocol and "
                             f"methods, not a {type(raw).__name__}")
    raw = config_module.with_plugin_paths(raw, path.parent)
    if isinstance(raw.get("base"), dict):
        raw = {**raw, "base": config_module.with_plugin_paths(raw["base"], path.parent)}
    spec = _validated(raw, f"benchmark config {path}")
    plugins.load(spec.plugins)
    names = [method.name for method in spec.methods]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise UserInputError(f"benchmark method names must be unique; repeated: {', '.join(duplicates)}")
    marked = [name for name in names if layout.SEARCH_REPEAT_MARK in name]
    if marked:
        raise UserInputError(f"benchmark method name {marked[0]!r} contains {layout.SEARCH_REPEAT_MARK!r}, which names "
                             "the repeats of a search")
    reserved = [name for name in layout.RESERVED_METHOD_NAMES if name in names]
    if reserved:
        what = ("a baseline row" if reserved[0] in layout.BASELINES else "the SLURM jobs' folder"
                if reserved[0] == layout.SLURM_DIR else "the frozen-trunk feature cache")
        raise UserInputError(f"benchmark method name {reserved[0]!r} is reserved for {what}")
    _check_analysis(spec.analysis, names)
    _check_repeats(spec.protocol, names)
    spec._config_file = config_file
    return spec


def _validated(raw: dict[str, Any], what: str) -> BenchmarkSpec:
    try:
        return BenchmarkSpec.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(map(str, first["loc"]))
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            raise UserInputError(f"{what}: unknown key {key!r}{config_module.did_you_mean(BenchmarkSpec, first['loc'])}") from None
        raise UserInputError(f"{what}: key {key!r}: {message}" if key else f"{what}: {message}") from None


SPEC_SECTIONS = ("protocol", "analysis")


def apply_spec_overrides(spec: BenchmarkSpec, overrides: list[str]) -> tuple[BenchmarkSpec, list[str]]:
    """Command-line overrides of the benchmark itself (``protocol.trials=8``, ``analysis.references=[...]``)
    applied to ``spec`` and validated like the YAML; the others are every method's run overrides."""
    own = [item for item in overrides if item.split("=", 1)[0].split(".", 1)[0] in SPEC_SECTIONS]
    if not own:
        return spec, list(overrides)
    raw = spec.model_dump(mode="json")
    if spec.protocol.sequential:  # its search_repeats is max_searches, derived: an override of that moves both
        del raw["protocol"]["search_repeats"]
    raw = config_module.apply_overrides(raw, own)
    changed = _validated(raw, "benchmark override")
    _check_analysis(changed.analysis, [method.name for method in changed.methods])
    _check_repeats(changed.protocol, [method.name for method in changed.methods])
    changed._config_file = spec.config_file
    return changed, [item for item in overrides if item not in own]


def _check_repeats(protocol: ProtocolSpec, names: list[str]) -> None:
    unknown = [name for name in protocol.search_repeat_methods if name not in names]
    if unknown:
        raise UserInputError(f"protocol.search_repeat_methods names {unknown[0]!r}, which is not a method; "
                             f"methods: {', '.join(names)}")


def _check_analysis(analysis: AnalysisSpec, names: list[str]) -> None:
    mentioned = [*analysis.references, *(name for pair in analysis.pairs for name in pair)]
    unknown = [name for name in mentioned if name not in names]
    if unknown:
        raise UserInputError(f"benchmark analysis names {unknown[0]!r}, which is not a method; methods: {', '.join(names)}")
    for key in ("search_sd", "planning_search_sd"):
        per_method = getattr(analysis, key)
        if isinstance(per_method, dict):
            strangers = [name for name in per_method if name not in names]
            if strangers:
                raise UserInputError(f"benchmark analysis.{key} names {strangers[0]!r}, which is not a method; methods: "
                                     f"{', '.join(names)}")
            lacking = [name for name in names if name not in per_method]
            if lacking:
                raise UserInputError(f"benchmark analysis.{key} gives no search SD for method {lacking[0]!r}: give every "
                                     "method one, or one number for all")
    same = [pair for pair in analysis.pairs if pair[0] == pair[1]]
    if same:
        raise UserInputError(f"benchmark analysis pair [{same[0][0]}, {same[0][1]}] compares a method with itself")


def load_search_spec(path: Path) -> BenchmarkSpec:
    """``dmlbench search CONFIG``: a benchmark YAML, or a run config with a ``search:`` space (and an
    optional ``protocol:`` section), which becomes a one-method benchmark named after its loss."""
    raw = config_module.read_yaml(path, "config") or {}
    if not isinstance(raw, dict):
        raise UserInputError(f"config {path} is not a mapping")
    if "methods" in raw:
        return load_spec(path)
    search = raw.pop("search", None)
    if not search:
        raise UserInputError(f"config {path} declares no search space (a `search:` mapping of dotted keys)")
    protocol = raw.pop("protocol", {})
    name = str((raw.get("loss") or {}).get("name", "method"))
    try:
        return BenchmarkSpec.model_validate({"base": raw, "methods": [{"name": name, "search": search}], "protocol": protocol})
    except ValidationError as error:
        first = error.errors()[0]
        raise UserInputError(f"config key {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
