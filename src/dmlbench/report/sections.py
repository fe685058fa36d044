"""The report as one ordered list of sections, rendered alike as Markdown and as HTML (``report.render``)."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dmlbench.analysis.correlations import Correlation, RankAgreement
from dmlbench.analysis.crossed import CROSSED_MODEL
from dmlbench.analysis.power import MAX_REPRODUCTIONS, TARGET_POWER
from dmlbench.analysis.search_luck import cheapest_family_design
from dmlbench.analysis.search_sd import pair_search_sd, search_sd_words
from dmlbench.analysis.statistics import OUTCOMES, PairedComparison
from dmlbench.evaluation.metrics import metric_title
from dmlbench.protocol.design.benchmark import BUILT_IN, MIN_REPRODUCTIONS
from dmlbench.protocol.layout import (
    CLAIM_COMPARISONS_CSV,
    COMPARISONS_CSV,
    METHOD_COMPARISONS_CSV,
    RAW_PIXELS,
    UNTRAINED,
    VALIDATION_CURVES_CSV,
)
from dmlbench.protocol.units.results import result_rows
from dmlbench.report import plots, sequential, tables, uncertainty
from dmlbench.report.analysis import ALPHA, Claims, ReferenceSummary, scored_methods
from dmlbench.report.data import ReportData
from dmlbench.report.tables import pvalue_text

TITLE = "dmlbench benchmark report"
Table = tuple[list[str], list[list[str]]]  # header, rows


@dataclass
class Section:
    """A titled part of the report (``title`` None: the part under the page title); paragraphs, bullets
    and table cells may hold Markdown's inline code spans and ``*emphasis*``, which both renderers understand."""

    title: str | None
    paragraphs: list[str] = field(default_factory=list)
    bullets: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[plots.Figure] = field(default_factory=list)
    after: list[str] = field(default_factory=list)  # paragraphs under the tables (definitions a reader needs second)


def sections(data: ReportData, figures: list[plots.Figure]) -> list[Section]:
    """The report's sections in the order every rendering shows them."""
    summary = summary_section(data)
    top = Section(None, [provenance(data)])
    board = Section("Results" if summary else None, after=[(
        "Test classes, mean ± 95% Student-t interval half-width over reproductions (in %); "
        "con. = concatenated fold models, sep. = separated (seed 001 §3.3). "
        f"Sorted by the primary endpoint, {uncertainty.endpoint_title(data.claims.primary)}; *best* marks its highest mean "
        "only where its paired tests decided that method better than every other one. "
        "`untrained` is the baseline: the same models before any training step.")])
    if data.results:
        board.tables.append(tables.leaderboard(data, data.claims.primary))
    else:
        board.paragraphs.append("No reproduction has been scored yet (search stage only).")
    parts = [top, summary, board] if summary else [top, board]
    if data.failed:
        parts.append(Section("Failed methods", bullets=[f"{name}: {reason}" for name, reason in data.failed.items()]))
    if data.claims.reranking:
        parts.append(Section("Re-ranking", [tables.RERANK_NOTE], tables=[(tables.RERANK_HEADER, tables.rerank_rows(data))]))
    # The figures right under the numbers they show, before the long tables of the claims.
    parts.append(Section("Plots", figures=figures))
    parts.append(setup_section(data))
    parts += _claim_sections(data.claims)
    # Uncertainty beyond the seeds: the test classes resampled, the search repeated.
    uncertain = [sequential.sequential_part(data), *uncertainty.class_bootstrap_parts(data),
                 uncertainty.method_verdict_part(data), uncertainty.search_repeat_part(data)]
    parts += [Section(title, paragraphs, tables=tables) for title, paragraphs, tables in filter(None, uncertain)]
    change = analysis_change_section(data)
    if change:
        parts.append(change)
    if data.comparisons:
        comparisons = Section("Paired comparisons", [tables.COMPARISON_NOTE])
        if tables.all_pairs_shown(data):
            comparisons.tables.append((tables.COMPARISON_HEADER, tables.comparison_rows(data)))
        else:
            comparisons.paragraphs.append(tables.pairs_in_csv(data))
        parts.append(comparisons)
    parts.append(Section("Budget and search", tables=[(tables.BUDGET_HEADER, tables.budget_rows(data))],
                         after=[text for text in (uncertainty.range_edge_text(data), uncertainty.budget_text(data),
                                                  uncertainty.identical_trials_text(data)) if text]))
    costs = tables.cost_rows(data)
    if costs:
        running = tables.running_time_text(data)
        parts.append(Section("Cost", [tables.COST_NOTE], tables=[(tables.COST_HEADER, costs)],
                             after=[running] if running else []))
    parts.append(Section("Protocol", tables=[(["parameter", "value"], [list(p) for p in tables.parameters(data)])]))
    return parts


def setup_section(data: ReportData) -> Section:
    """What the methods were trained with: the test set's size, why the untrained row does not depend
    on the mode, the shared base config and each method's settings and search ranges."""
    part = Section("Set-up", [tables.held_out_text(data)])
    if (source := tables.data_source_text(data)) is not None:
        part.paragraphs.append(source)
    if UNTRAINED in data.results:
        k = data.benchmark.protocol.folds
        part.paragraphs.append(
            f"The `untrained` row is the same in both modes: the {k} fold models of an untrained reproduction are "
            "built with the same seed (the reproduction's), and the folds differ only in their training and "
            f"validation classes, which an untrained model has not seen, so they are {k} copies of one network. "
            f"Concatenating {k} copies of one L2-normalised embedding scales every distance by the same factor "
            f"(√{k}) and changes no ranking of neighbours, and the mean of {k} equal scores is that score.")
    if RAW_PIXELS in data.results:
        part.paragraphs.append(
            "The `raw_pixels` row embeds each test image as its pixels, after the same resizing and "
            "normalisation the models' inputs get, and involves no model: it is the same for every seed "
            "and mode, so its interval has no width; a method whose interval lies below it retrieves worse than the pixels do.")
    base = tables.base_rows(data)
    if base:
        overrides = " ".join(f"`{o}`" for o in data.benchmark.overrides)
        part.paragraphs.append("The configuration every method starts from (`spec.base`); a method's settings in the "
                               "second table replace its keys, and the protocol sets each run's seed, epochs, patience "
                               "and classes. Keys not listed take the config defaults of the benchmark's git commit."
                               + (f" Command-line overrides for every method: {overrides}." if overrides else ""))
        part.tables.append((["setting", "config key", "value"], base))
    methods = tables.method_rows(data)
    if methods:
        part.tables.append((["method", "set for the method", "searched (range)"], methods))
    return part


def provenance(data: ReportData) -> str:
    b = data.benchmark
    return (f"Benchmark started at git commit `{b.git_commit}` on dataset `{b.dataset.name}` "
            f"(content hash `{b.dataset.content_hash}`); this report was written by git commit "
            f"`{data.report_commit}` from the stored studies.")


# ---------------------------------------------------------------- the seeds' claims

def _claim_sections(claims: Claims) -> list[Section]:
    parts = []
    if claims.sensitivity:
        parts.append(_sensitivity_section(claims))
    if claims.power:
        parts.append(_power_section(claims))
    if claims.references:
        parts.append(_saturation_section(claims))
    if claims.pairs:
        parts.append(_pairs_section(claims))
    if claims.correlations:
        parts.append(_space_section(claims))
    if any(claims.autocorrelation.values()):
        parts.append(_autocorrelation_section(claims))
    if claims.rankings:
        parts.append(_ranking_section("Concatenated against separated (seed 001 §3.3)", claims.rankings, ("con.", "sep.")))
    if claims.domain_rankings:
        parts.append(_ranking_section("All-versus-all against cross-domain (concatenated)", claims.domain_rankings,
                                      ("all", "cross-domain")))
    if claims.notes and parts:
        parts.append(Section("Analysis notes", bullets=list(claims.notes)))
    return parts


def _difference(c: PairedComparison) -> str:
    interval = "" if math.isnan(c.difference_low) else f" [{100 * c.difference_low:+.2f}, {100 * c.difference_high:+.2f}]"
    return f"{100 * c.mean_difference:+.2f}{interval}"


def _outcome_rule(claims: Claims, searches: int | None = None, crossed: bool = False) -> str:
    """How a verdict is reached and what it is about: with ``searches`` (repeated searches), the methods over
    that many searches each (``crossed``: searches that shared their seeds, judged by ``analysis.crossed``);
    without, the one search per method the reproductions belong to."""
    points = f"{100 * claims.margin:g} percentage point{'s' if claims.margin != 0.01 else ''}"
    rule = (f"*better* / *worse*: Holm-adjusted paired t-test p < {ALPHA}; *equivalent*: not better or worse and the "
            f"two one-sided tests (TOST) put the mean difference within ±{points} (`analysis.equivalence_margin`), "
            f"Holm-adjusted p < {ALPHA}; *inconclusive*: neither, so the data can tell the methods neither apart "
            "nor alike. Equivalence is read off the 90% interval (what TOST at 5% tests), a difference off the 95% one. ")
    if searches is not None:
        how = (f"the crossed search x seed model over their {searches} searches (the searches shared their reproduction "
               "seeds, so the test's degrees of freedom are those of the fewer of searches and seeds)" if crossed else
               f"each pairs two methods' means over their {searches} searches by search index")
        return rule + (f"These verdicts are about the methods, their search included: {how} (`{METHOD_COMPARISONS_CSV}`, "
                       "`conditional_on_search` false). The sections below that pair reproductions by seed judge search 0 alone, conditional on "
                       f"that one search (`{COMPARISONS_CSV}`, `{CLAIM_COMPARISONS_CSV}`).")
    return (rule +
            "Each verdict rests on one search per method (`conditional_on_search` in the CSV files): another search "
            "may move a method more than the seeds do; `search_sd_allowance` is the largest search SD that would leave "
            "the verdict standing, and repeated searches (`protocol.search_repeats`) give verdicts about the methods."
            + (f" These tests include search luck of SD {search_sd_words(claims.search_sd)} "
               "(`analysis.search_sd`, measured beforehand with repeated searches; `assumed_search_sd` in the CSV "
               "files): each verdict allows for another search of either method moving it by luck of that size." if claims.search_sd else ""))


def _saturation_section(claims: Claims) -> Section:
    references = list(dict.fromkeys(r.reference for r in claims.references))
    paragraphs = [
        f"Every method against {' and '.join(f'`{r}`' for r in references)}, paired by reproduction seed; "
        "differences in percentage points with their 95% interval. " + _outcome_rule(claims) + " Holm's correction "
        "runs over one family per mode and metric holding every declared comparison (t-test and TOST separately), "
        "so a pair has one verdict per endpoint; no statement here pools endpoints. With 5 or fewer pairs "
        f"the Wilcoxon test cannot go below p = 0.0625, so it is reported in `{CLAIM_COMPARISONS_CSV}` but does not decide."]
    header = ["mode", "metric", "reference", "methods", *OUTCOMES, "the other references", "largest difference", "most negative difference"]
    rows = []
    for r in claims.references:
        others = [c.a for c in r.comparisons if c.a not in references]
        rows.append([r.mode, metric_title(r.metric), r.reference, str(len(others)),
                     *(str(len(r.methods(outcome, among=others))) for outcome in OUTCOMES),
                     ", ".join(f"{c.a}: {c.verdict(ALPHA)}" for c in r.comparisons if c.a in references) or "-",
                     _gap(r, max), _gap(r, min)])
    detail_header = ["method"] + [f"{metric_title(metric)} (con.) − {reference}" for reference in references
                                  for metric in ("precision_at_1", "map_at_r")]
    detail: dict[str, dict[tuple[str, str], str]] = {}
    for r in claims.references:
        if r.mode != "concatenated":
            continue
        for c in r.comparisons:
            detail.setdefault(c.a, {})[(r.reference, r.metric)] = f"{_difference(c)} {c.verdict(ALPHA)}"
    detail_rows = [[name] + [cells.get((reference, metric), "-") for reference in references
                             for metric in ("precision_at_1", "map_at_r")] for name, cells in detail.items()]
    return Section("Every method against the references", paragraphs,
                   tables=[(header, rows), (detail_header, detail_rows)])


def _gap(summary: ReferenceSummary, pick: Any) -> str:
    if not summary.comparisons:
        return "-"
    c = pick(summary.comparisons, key=lambda comparison: comparison.mean_difference)
    return f"{c.a} {_difference(c)}"


def summary_section(data: ReportData) -> Section | None:
    """The page's first words: the firmest conclusion (every method against the untrained baseline), then
    the primary endpoint's family: who is ahead of, level with and behind each reference."""
    claims = data.claims
    scored = scored_methods(data.results)
    if not scored:
        return None
    if data.benchmark.protocol.reproductions < MIN_REPRODUCTIONS:
        # Only a benchmark started before fewer were refused gets here: say why the usual verdicts are missing.
        return Section("Summary", [
            f"One reproduction per method: no 95% intervals, paired tests, verdicts or power (they need at least "
            f"{MIN_REPRODUCTIONS} reproductions; this benchmark was started before dmlbench refused fewer). Each mean "
            "below is a single run's score; run a new benchmark with `protocol.reproductions` of 2 or more to "
            "compare methods."])
    references = list(dict.fromkeys(x.reference for x in claims.references))
    about_methods = uncertainty.primary_method_family(data)
    judged = sequential.sequential_judgement(data)
    if judged is not None:
        sentences = (_baseline_sentence(data), sequential.sequential_summary(data, judged), None)
        against = []  # the sequential verdicts' own lines, below
    elif about_methods:
        # Searches repeated: the headline is the verdicts about the methods, not search 0's.
        sentences = (_baseline_sentence(data), _method_primary_sentence(data, about_methods),
                     _method_design_sentence(data, about_methods))
        against = [(reference, [c for c in about_methods if c.b == reference and c.a not in references])
                   for reference in references]
    else:
        sentences = (_baseline_sentence(data), _primary_sentence(data), _design_sentence(data))
        against = [(r.reference, [c for c in r.comparisons if c.a not in references])
                   for r in claims.references if (r.mode, r.metric) == claims.primary and r.comparisons]
    paragraphs = [sentence for sentence in sentences if sentence]
    bullets = [_against_sentence(reference, compared) for reference, compared in against if compared]
    if judged is not None:
        bullets = sequential.against_lines(judged, references)
    leaders = [f"{metric_title(metric)}: `{name}` {100 * mean:.2f}%" for metric, name, mean in _leaders(data)]
    searches = min(c.n for c in about_methods) if about_methods else None
    crossed = bool(about_methods) and about_methods[0].model == CROSSED_MODEL
    rule = sequential.SEQUENTIAL_RULE if judged is not None else _outcome_rule(claims, searches, crossed)
    paragraphs.append(f"Highest mean (concatenated) — {'; '.join(leaders)}. " + rule
                      + " The other modes and metrics, the treated-control pairs and every p-value follow below and in "
                      f"`{CLAIM_COMPARISONS_CSV}`; they are secondary endpoints, each its own Holm family, not corrected "
                      "across endpoints.")
    return Section("Summary", paragraphs, bullets=bullets)


def _against_sentence(reference: str, compared: list[PairedComparison]) -> str:
    """One reference's line of the summary: the methods compared with it, by outcome."""
    def named(outcome: str) -> str:
        return ", ".join(c.a for c in compared if c.outcome(ALPHA) == outcome) or "none"

    verdicts = "; ".join(f"{outcome}: {named(outcome)}" for outcome in ("better", "equivalent", "worse", "inconclusive"))
    return f"Against `{reference}`: {verdicts}."


def _tally(family: list[PairedComparison]) -> str:
    """A family's verdicts counted, decided first: a newcomer reads the first verdict line as the answer."""
    counts = {outcome: sum(c.outcome(ALPHA) == outcome for c in family) for outcome in OUTCOMES}
    decided = ", ".join(f"{counts[outcome]} {outcome}" for outcome in OUTCOMES[:3])
    withheld = sum(bool(c.no_verdict) for c in family)
    why = (f" ({withheld} of them without a verdict: too few or identical paired differences)" if withheld else "")
    return f"decided: {decided}; undecided: {counts['inconclusive']} inconclusive{why}"


def _method_primary_sentence(data: ReportData, family: list[PairedComparison]) -> str:
    """``_primary_sentence`` for verdicts about the methods: counted over the searches, then what search 0
    alone decided (its reproductions paired by seed, conditional on that search)."""
    one_search = data.claims.families.get(data.claims.primary)
    search_zero = (f" Search 0 alone, conditional on its one search ({one_search[0].n} reproductions paired by seed, "
                   f"`{COMPARISONS_CSV}`), decided {sum(c.outcome(ALPHA) != 'inconclusive' for c in one_search)} of them."
                   if one_search and not isinstance(one_search, str) else "")
    return (f"Primary endpoint {uncertainty.endpoint_title(data.claims.primary)}: {len(family)} declared comparison(s) in "
            f"one Holm family, judged about the methods over {min(c.n for c in family)} searches per method ("
            + ("the crossed search x seed model: the searches shared their seeds" if family[0].model == CROSSED_MODEL else
               "each search's mean over its reproductions, paired by search index")
            + f") — {_tally(family)}.{search_zero}")


def _method_design_sentence(data: ReportData, family: list[PairedComparison]) -> str | None:
    """``_design_sentence`` for verdicts about the methods: the planner's cheapest searches x reproductions at
    each undecided comparison's own search luck (the two methods' search SDs these searches measured,
    ``statistics.pair_search_sd``) and seed spread."""
    undecided = {(c.a, c.b) for c in family if c.outcome(ALPHA) == "inconclusive"}
    variances = uncertainty.repeated_variances(data)
    measured = {method: components.search_sd for method, components in variances.items()}
    spreads = [(pair_search_sd(measured, p.a, p.b), p.sd) for p in data.claims.power
               if (p.a, p.b) in undecided and p.a in measured and p.b in measured]
    if not spreads:
        return None
    return _search_design_sentence(data, len(undecided), spreads, "the search luck these searches measured, each method its own")


def _baseline_sentence(data: ReportData) -> str | None:
    """Every method against the untrained baseline on the primary endpoint: usually the firmest result."""
    means = {(row["method"], row["mode"], row["metric"]): row for row in result_rows(data.results)}
    baseline = means.get((UNTRAINED, *data.claims.primary))
    scored = [name for name in scored_methods(data.results) if (name, *data.claims.primary) in means]
    if baseline is None or not scored:
        return None
    gaps = [100 * (means[(name, *data.claims.primary)]["mean"] - baseline["mean"]) for name in scored]
    above = [name for name in scored if means[(name, *data.claims.primary)]["ci_low"] > baseline["ci_high"]]
    endpoint = uncertainty.endpoint_title(data.claims.primary)
    if len(above) == len(scored):
        return (f"Every one of the {len(scored)} methods scores above the untrained baseline on {endpoint}, "
                f"by {min(gaps):.1f} to {max(gaps):.1f} points, each 95% interval clear of the baseline's.")
    return (f"{len(above)} of the {len(scored)} methods have a 95% interval above the untrained baseline's on "
            f"{endpoint} (differences {min(gaps):+.1f} to {max(gaps):+.1f} points).")


def _primary_sentence(data: ReportData) -> str | None:
    claims = data.claims
    family = claims.families.get(claims.primary)
    if not family or isinstance(family, str):
        return None
    likely = sum(p.tost_holm >= TARGET_POWER or p.ttest_holm >= TARGET_POWER for p in claims.power)
    endpoint = uncertainty.endpoint_title(claims.primary)
    return (f"Primary endpoint {endpoint}: {len(family)} declared comparison(s) in one Holm family, "
            f"{family[0].n} reproductions paired by seed — {_tally(family)}"
            + f". At the observed spread {likely} of {len(claims.power)} comparisons had 80% power at the strictest Holm "
            "threshold (section Power)" + (", so an inconclusive verdict is mostly what this design could give." if likely < len(claims.power) else "."))


def _design_sentence(data: ReportData) -> str | None:
    """For the undecided comparisons of the primary family: the reproductions the planner says would
    decide them (80% power for both tests at the strictest Holm threshold, at the observed SDs), the
    time that takes at this benchmark's measured cost, and the command that runs it (``_benchmark_command``)."""
    claims = data.claims
    family = claims.families.get(claims.primary)
    if not family or isinstance(family, str):
        return None
    undecided = {(c.a, c.b) for c in family if c.outcome(ALPHA) == "inconclusive"}
    planned = [p.needed for p in claims.power if (p.a, p.b) in undecided]
    if not undecided or not planned:
        return None
    if claims.search_sd:
        spreads = [(pair_search_sd(claims.search_sd, p.a, p.b), p.sd) for p in claims.power if (p.a, p.b) in undecided]
        return _search_design_sentence(data, len(undecided), spreads, f"search luck of SD {search_sd_words(claims.search_sd)}")
    if any(needed is None for needed in planned):
        return (f"No number of reproductions up to {MAX_REPRODUCTIONS} gives the undecided comparisons 80% power at the "
                "observed spread: a wider `analysis.equivalence_margin` or a less noisy protocol (longer training, "
                "more test classes) must decide them.")
    needed = max(needed for needed in planned if needed is not None)
    duration = _duration(_seconds_at(data, needed))
    return (f"To decide the {len(undecided)} undecided comparison(s): {needed} reproductions per method (the planner at "
            f"the observed spread), about {duration} on this machine at this run's cost: "
            f"`{_benchmark_command(data, f'protocol.reproductions={needed}')}`.")


def _search_design_sentence(data: ReportData, undecided: int, spreads: list[tuple[float, float]], luck: str) -> str:
    """``_design_sentence`` when the verdicts are about the methods (searches repeated) or allow for declared
    search luck (``analysis.search_sd``): more reproductions cannot beat it, so the planner's cheapest searches x
    reproductions at which every undecided comparison, at its own search luck and seed spread (``spreads``),
    reaches 80% (``search_luck.cheapest_family_design``); ``luck`` says where the search luck comes from."""
    claims, protocol = data.claims, data.benchmark.protocol
    comparisons = len(claims.families[claims.primary])
    design = cheapest_family_design(spreads, claims.margin, comparisons, protocol.trials, protocol.folds, alpha=ALPHA)
    if design is None:
        return ("No design of searches and reproductions gives the undecided comparisons 80% power: the search luck "
                f"({luck}) exceeds what the ±{100 * claims.margin:g}-point margin allows.")
    duration = _duration(_seconds_at(data, design.reproductions, design.searches))
    return (f"To decide the {undecided} undecided comparison(s) about the methods, search luck included: "
            f"{design.searches} searches x {design.reproductions} reproductions per method (the planner at each "
            f"comparison's observed spread and {luck}), about {duration} on this machine at this "
            f"run's cost: `{_benchmark_command(data, f'protocol.search_repeats={design.searches}', f'protocol.reproductions={design.reproductions}')}`.")


def _benchmark_command(data: ReportData, *settings: str) -> str:
    """The command that started this benchmark with ``settings`` in place of its own values of those keys and a
    new output folder, so that it runs as printed: no config for the built-in benchmark; ``CONFIG`` (the
    CLI's summary names it) where ``benchmark.json`` does not record the command."""
    config_file = data.benchmark.config_file
    if config_file is None:
        return " ".join(["dmlbench benchmark CONFIG", *settings, "-o NEW_DIR"])
    replaced = {setting.split("=", 1)[0] for setting in settings}
    kept = [shlex.quote(item) for item in data.benchmark.command_overrides if item.split("=", 1)[0] not in replaced]
    config = [] if config_file == BUILT_IN else [shlex.quote(config_file)]
    return " ".join(["dmlbench benchmark", *config, *kept, *settings, "-o NEW_DIR"])


def _duration(seconds: float) -> str:
    """A planned design's time in the unit a reader plans with."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} minutes" if seconds < 2 * 3600 else f"{seconds / 3600:.0f} hours"


def _seconds_at(data: ReportData, reproductions: int, searches: int | None = None) -> float:
    """This benchmark's own wall time with ``reproductions`` per method and ``searches`` per method (default:
    as many as it ran): its searches as they ran, scaled to that many, its reproductions and baselines scaled
    from the ones it ran (one worker; the baselines are scored once, whatever the searches)."""
    searches_run = 1 + max((len(names) for names in data.repeats.values()), default=0)
    scale = 1.0 if searches is None else searches / searches_run
    search = sum(t["cost"]["wall_seconds"] for trials in data.trials.values() for t in trials if t.get("cost"))
    trained = baselines = 0.0
    for name, costs in data.reproduction_costs.items():
        ran = [cost["wall_seconds"] for cost in costs if cost]
        if not ran:
            continue
        seconds = sum(ran) / len(ran) * reproductions
        if name in (UNTRAINED, RAW_PIXELS):
            baselines += seconds
        else:
            trained += seconds
    return scale * (search + trained) + baselines


def _leaders(data: ReportData) -> list[tuple[str, str, float]]:
    means: dict[str, dict[str, float]] = {}
    for row in result_rows(scored_methods(data.results)):
        if row["mode"] == "concatenated" and row["metric"] in ("precision_at_1", "map_at_r"):
            means.setdefault(row["metric"], {})[row["method"]] = row["mean"]
    return [(metric, *max(values.items(), key=lambda item: item[1])) for metric, values in means.items()]


def _pairs_section(claims: Claims) -> Section:
    rows = [[f"{c.a} − {c.b}", mode, metric_title(metric), str(c.n), _difference(c), pvalue_text(c.t_pvalue),
             pvalue_text(c.t_pvalue_holm), pvalue_text(c.tost_pvalue_holm), c.verdict(ALPHA), f"{c.cohen_dz:.2f}"]
            for mode, metric, comparisons in claims.pairs for c in comparisons]
    return Section("Treated against control",
                   ["Paired by reproduction seed; differences in percentage points with their 95% interval; "
                    "Holm across the declared comparisons of each mode and metric (one family). " + _outcome_rule(claims)],
                   tables=[(["pair", "mode", "metric", "n", "difference (%)", "paired t p", "paired t p (Holm)",
                             "TOST p (Holm)", "outcome", "Cohen's d_z"], rows)])


def _correlation_cell(c: Correlation) -> str:
    test = "" if math.isnan(c.pvalue) else f" p={pvalue_text(c.pvalue)}"
    return f"{c.estimate:+.2f} [{c.low:+.2f}, {c.high:+.2f}]{test}"


def _space_section(claims: Claims) -> Section:
    rows = [[c.quantity, c.mode, c.level, str(c.pearson.n), _correlation_cell(c.pearson), _correlation_cell(c.spearman)]
            for c in claims.correlations]
    return Section("Embedding space against test P@1 (seed 003 §5, Fig. 5)",
                   ["rho (spectral decay, drop 1, no centring) and pi_ratio of each fold model's best checkpoint on its "
                    "own training classes, averaged over the reproduction's fold models, against the reproduction's "
                    "test P@1 (separated: the mean of the same fold models' P@1). Correlation with its 95% percentile "
                    "bootstrap interval (9,999 resamples, seed 0) at three levels: *method means* (one point per "
                    "method, as seed 003's Fig. 5), *within methods* (each reproduction centred on its method's mean: "
                    "the seed-to-seed relation, p-value with n − methods − 1 degrees of freedom) and all "
                    "*reproductions* pooled. The pooled points mix the two relations and share their method's "
                    "hyper-parameters, so they are not independent: that row is a description and has no p-value."],
                   tables=[(["quantity", "test P@1 mode", "points", "n", "Pearson r [95% CI]", "Spearman rho_s [95% CI]"], rows)])


def _autocorrelation_section(claims: Claims) -> Section:
    rows = []
    for metric, values in claims.autocorrelation.items():
        if values:
            rows.append([metric_title(metric), str(len(values)), f"{np.mean(values):.2f}",
                         f"{min(values):.2f} .. {max(values):.2f}", {"precision_at_1": "0.73", "map_at_r": "0.81"}[metric]])
    return Section("Lag-one autocorrelation of the validation curves (seed 001 §3.2)",
                   ["Of each run's validation curve without evaluation 0 (the untrained model), around its "
                    "least-squares line: r1 = Σ_t (e_t − ē)(e_{t+1} − ē) / Σ_t (e_t − ē)², e the residuals of the line. "
                    "Seed 001 gives no formula; a correlation of the curve with itself shifted measures its rise (a "
                    "straight line gives 1), this one the fluctuation that makes choosing a checkpoint hard. A "
                    "curve that rises and levels off still leaves curvature in e, which raises r1 for every metric "
                    "alike, so compare the metrics, not the numbers with seed 001's. Per method the mean over its "
                    "search and reproduction runs, then the mean over the methods; every curve is in "
                    f"`{VALIDATION_CURVES_CSV}`."],
                   tables=[(["validation metric", "methods", "mean", "range over methods", "seed 001"], rows)])


def _ranking_section(title: str, rankings: list[tuple[str, RankAgreement]], labels: tuple[str, str]) -> Section:
    """Two rankings of the methods' means per metric (``labels``: short names of the two), and who moved."""
    rows = []
    for metric, agreement in rankings:
        order = lambda index: [n for n, _ in sorted(agreement.ranks.items(), key=lambda item: item[1][index])][:3]  # noqa: E731
        changed = ", ".join(f"{name} {first}→{second}" for name, (first, second) in agreement.ranks.items()
                            if first != second) or "none"
        rows.append([metric_title(metric), f"{agreement.tau:.2f} (p={pvalue_text(agreement.pvalue)})", changed,
                     ", ".join(order(0)), ", ".join(order(1))])
    first, second = labels
    return Section(title, ["Ranks of the methods' means (1 = best), Kendall's tau between the two rankings."],
                   tables=[(["metric", "Kendall tau", f"rank changes ({first}→{second})", f"top 3 {first}",
                             f"top 3 {second}"], rows)])


def _sensitivity_section(claims: Claims) -> Section:
    points = 100 * claims.margin
    rows = [[f"{a} vs {b}", low, chosen, high] for a, b, low, chosen, high in claims.sensitivity]
    return Section(f"Sensitivity to the margin ({uncertainty.endpoint_title(claims.primary)})",
                   [f"The primary family's verdicts with the equivalence margin halved, as chosen (±{points:g} points, "
                    "`analysis.equivalence_margin`) and doubled; better / worse do not depend on the margin."],
                   tables=[(["comparison", f"±{points / 2:g} points", f"±{points:g} points", f"±{2 * points:g} points"], rows)])


def _power_section(claims: Claims) -> Section:
    rows = [[f"{p.a} vs {p.b}", str(p.n), f"{100 * p.sd:.2f}", f"{p.ttest:.2f} / {p.ttest_holm:.2f}",
             f"{p.tost:.2f} / {p.tost_holm:.2f}", f"{100 * p.detectable:.2f}",
             f"more than {MAX_REPRODUCTIONS}" if p.needed is None else str(p.needed)] for p in claims.power]
    m = len(claims.power)
    return Section(f"Power ({uncertainty.endpoint_title(claims.primary)})",
                   [f"What each comparison of the primary family could show, at its observed SD of paired differences "
                    f"taken as the true one: the paired t-test's power to find a true difference of one margin "
                    f"(±{100 * claims.margin:g} points) and TOST's power to show equivalence when the true difference is 0, "
                    f"unadjusted / at the strictest Holm threshold ({ALPHA}/{m}); the minimal detectable difference "
                    "(80% t-test power at that threshold) and the reproductions both tests need for 80% there "
                    "(`dmlbench plan`). An inconclusive verdict with low power says little either way."
                    + (f" The tests include search luck of SD {search_sd_words(claims.search_sd)} "
                       "(`analysis.search_sd`), which more reproductions do not shrink; the power folds it into the SD "
                       "(an approximation, conservative like the tests)." if claims.search_sd else "")],
                   tables=[(["comparison", "n", "SD of differences (%)", "t-test power", "TOST power",
                             "detectable difference (%)", "reproductions for 80%"], rows)])


def analysis_change_section(data: ReportData) -> Section | None:
    """The analysis as declared before the runs and every change accepted after them (``--accept-analysis-change``)."""
    b = data.benchmark
    reason = b.analysis.margin_reason if b.analysis is not None else ""
    bullets = [f"`analysis.margin_reason`: {reason}"] if reason else []
    changes = b.analysis_changes_accepted
    bullets += [f"{change.time}: changed after the runs with --accept-analysis-change: "
                f"{', '.join(f'`analysis.{key}`' for key in change.changed)}" for change in changes]
    if not b.analysis_in_hash:
        bullets.append("This benchmark was started before the analysis entered the config hash: its analysis was not fixed "
                       "before the data.")
    if not bullets:
        return None
    text = ("The analysis this report applies is the declared one." if not changes else
            "The analysis this report applies is the last accepted change, not the one declared before the runs.")
    return Section("Analysis plan", [text], bullets=bullets)
