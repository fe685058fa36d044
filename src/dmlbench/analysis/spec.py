"""The analysis a benchmark declares before its data (``AnalysisSpec``): the primary endpoint, the declared
comparisons, the equivalence margin and the spreads its planning and tests assume. The protocol reads it from
the benchmark's YAML; a committed study's ``benchmark.json`` gives the one in force (``AnalysisSpec.in_force``);
every judging function of this package takes it typed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dmlbench.analysis.group_sequential import Spending
from dmlbench.analysis.sequential import FUTILITY_POWER, SequentialDesign
from dmlbench.analysis.statistics import DEFAULT_EQUIVALENCE_MARGIN


# One method's search-luck SD, in score units.
SearchSDValue = Annotated[float, Field(ge=0.0, lt=1.0)]


class PrimaryEndpoint(BaseModel):
    """The one mode and metric whose comparisons are the benchmark's confirmatory result (the report's headline)."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["concatenated", "separated"] = "concatenated"
    metric: str = "map_at_r"


class AnalysisSpec(BaseModel):
    """The analysis, fixed before the data: it enters the config hash, so changing it once runs exist
    is refused unless ``--accept-analysis-change`` records the change (``benchmark.json``, the report).

    ``primary``: the endpoint (mode and metric) of the confirmatory comparisons, the report's headline;
    the other modes and metrics are secondary. The declared comparisons are every other method
    against each method of ``references`` (e.g. the classic losses of seed 001's claim) and the
    ``[treated, control]`` ``pairs`` (e.g. a rho-regularised loss against the same loss, seed 003
    §5.1); none declared: every pair of methods. ``correction``: one Holm family per mode and metric
    holding every declared comparison, so a pair has one verdict per endpoint. ``equivalence_margin``:
    two methods are *equivalent* when TOST puts their mean paired difference within ``±margin`` (score
    units: 0.01 is one percentage point), and ``margin_reason`` says why that difference is the one that
    matters. ``planning_sd``: the standard deviation of paired differences assumed by the power planning
    of ``benchmark --dry-run`` (``dmlbench plan --pilot`` measures it); ``planning_search_sd``: the SD of a
    method's search luck (``analysis.search_luck``) with which the dry run also plans searches and seeds;
    ``search_sd``: the search-luck SD every method's one search is assumed to carry, measured beforehand by
    a study that repeated its searches: the paired tests of one search per method then include it
    (``analysis.statistics.paired_comparison``), and the rows say so (``assumed_search_sd``). Both search SDs are
    one number for every method or a mapping ``method -> SD``: a comparison then carries ``sigma_a² + sigma_b²``
    (``statistics.pair_search_sd``; a method whose search is noisier than another's is planned and tested so).
    ``spending`` and ``futility_power``: a sequential study's (``protocol.sequential``) alpha-spending function,
    Pocock-type (spends early: for differences expected to be large) or O'Brien-Fleming-type (keeps the level for
    the last look), and the conditional power below which an open comparison is futile (``analysis.sequential``)."""

    model_config = ConfigDict(extra="forbid")
    primary: PrimaryEndpoint = Field(default_factory=PrimaryEndpoint)
    references: list[str] = Field(default_factory=list)
    pairs: list[tuple[str, str]] = Field(default_factory=list)
    correction: Literal["holm"] = "holm"
    equivalence_margin: float = Field(DEFAULT_EQUIVALENCE_MARGIN, gt=0.0, lt=1.0)
    margin_reason: str = ""
    planning_sd: float | None = Field(None, gt=0.0, lt=1.0)
    planning_search_sd: SearchSDValue | dict[str, SearchSDValue] | None = None
    search_sd: SearchSDValue | dict[str, SearchSDValue] | None = None
    spending: Spending = "pocock"
    futility_power: float = Field(FUTILITY_POWER, ge=0.0, lt=1.0)

    def sequential_design(self, max_searches: int, round_searches: int) -> SequentialDesign:
        """The design of a sequential study (``protocol.sequential``) judged under this analysis."""
        return SequentialDesign(max_searches, round_searches, margin=self.equivalence_margin, spending=self.spending,
                                futility_power=self.futility_power)

    @classmethod
    def in_force(cls, stored: Mapping[str, Any]) -> AnalysisSpec:
        """The analysis a stored mapping (``benchmark.json``'s) declares: a key it lacks at its default, a key
        this version does not know (written by another version) left out."""
        return cls.model_validate({key: value for key, value in stored.items() if key in cls.model_fields})
