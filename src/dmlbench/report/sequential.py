"""A sequential study's part of the report (``protocol.sequential``): its looks judged again from the stored scores
(``analysis.sequential``, as the rounds judged them), ``sequential.csv``, its figure, its section and its summary."""

from __future__ import annotations

from dmlbench.analysis.sequential import CONTINUE, DECIDED, SequentialJudgement, sequential_csv
from dmlbench.protocol.layout import COMPARISONS_CSV, SEQUENTIAL_CSV
from dmlbench.protocol.run.rounds import judge_study
from dmlbench.report import uncertainty
from dmlbench.report.data import ReportData

# What the summary says the sequential verdicts mean (in place of the fixed design's rule).
SEQUENTIAL_RULE = ("*better* / *worse*: the comparison's group-sequential t-test over the per-search differences crossed "
                   "its boundary at a look (Holm across the family); *equivalent*: the two one-sided tests on the same "
                   "boundaries put the difference within ±`analysis.equivalence_margin`; *futile*: stopped undecided "
                   "once deciding by the last look had become unlikely, which is not \"no difference\". "
                   f"`{COMPARISONS_CSV}` keeps search 0's verdicts, conditional on that one search.")
# How a row's decision reads in the report.
DECISION_WORDS = {"better": "better", "worse": "worse", "equivalent": "equivalent", "futile": "futile (stopped)",
                  CONTINUE: "open", "inconclusive": "inconclusive at the last look"}


def sequential_judgement(data: ReportData) -> SequentialJudgement | None:
    """The primary family judged look by look on the searches stored (``rounds.judge_study``, as the rounds judged
    it); ``None`` unless the study is sequential."""
    if not data.benchmark.protocol.sequential:
        return None
    return judge_study(data.benchmark.protocol, data.benchmark.analysis_spec(), data.methods,
                       uncertainty.search_table(data).get(data.claims.primary, {}))


def sequential_csvs(data: ReportData) -> dict[str, str]:
    """``sequential.csv`` of a sequential study; nothing otherwise."""
    judgement = sequential_judgement(data)
    return {} if judgement is None else {SEQUENTIAL_CSV: sequential_csv(judgement, data.claims.primary)}


def sequential_part(data: ReportData) -> uncertainty.Part | None:
    """The section "Sequential verdicts": the design, then each comparison's last look."""
    judgement = sequential_judgement(data)
    if judgement is None:
        return None
    design = judgement.design
    text = (f"A sequential study (`protocol.sequential`): every method ran its searches in rounds of {design.round_searches}, "
            f"each search with fresh seeds and folds, up to {design.max_searches}; after each round the primary family was "
            "judged on the per-search differences (each search's mean over its reproductions, paired by search index) "
            f"with group-sequential t-tests whose boundaries spend alpha = {design.alpha:g} over the looks "
            f"({design.spending.replace('_', ' ')}-type spending, Lan-DeMets), Holm across the family passing a decided "
            "comparison's share to the others, and TOST within "
            f"±{100 * design.margin:g} points on the same boundaries. A comparison stops once decided; one whose "
            f"conditional power of deciding by {design.max_searches} searches falls below {design.futility_power:g} is "
            "futile (it stopped undecided: that is not \"no difference\"). The intervals are repeated confidence "
            f"intervals, valid at every look. Every look is in `{SEQUENTIAL_CSV}`.")
    rows = [[f"{a} − {b}", str(row.look), str(row.searches), f"{100 * row.estimate:+.2f}",
             f"[{100 * row.ci_low:+.2f}, {100 * row.ci_high:+.2f}]",
             f"[{100 * row.equivalence_ci_low:+.2f}, {100 * row.equivalence_ci_high:+.2f}]",
             DECISION_WORDS.get(row.decision, row.decision),
             "" if row.searches_to_decide is None or row.decision in DECIDED else str(row.searches_to_decide)]
            for (a, b), row in judgement.latest.items()]
    waiting = [f"{a} − {b}" for a, b in judgement.comparisons if (a, b) not in judgement.latest]
    if waiting:
        text += " Not yet judged (the first round is not complete): " + ", ".join(waiting) + "."
    return ("Sequential verdicts", [text], [
        (["comparison", "look", "searches", f"estimate {uncertainty.endpoint_title(data.claims.primary)}",
          "repeated interval", "equivalence interval", "decision", "searches to decide (80%)"], rows)])


def sequential_summary(data: ReportData, judgement: SequentialJudgement) -> str:
    """The summary's sentence on a sequential study: what its looks decided, with how many searches."""
    latest = judgement.latest
    counts = {word: sum(row.decision == decision for row in latest.values()) for decision, word in DECISION_WORDS.items()}
    searches = sorted({row.searches for row in latest.values()})
    spent = ", ".join(f"{count} {word}" for word, count in counts.items() if count)
    return (f"Primary endpoint {uncertainty.endpoint_title(data.claims.primary)}, judged about the methods by a sequential "
            f"study: {len(judgement.comparisons)} declared comparison(s), {judgement.looks_taken()} look(s) taken, "
            f"stopping at {', '.join(map(str, searches)) or 'no'} searches — {spent or 'nothing judged yet'} "
            "(section \"Sequential verdicts\").")


def against_lines(judgement: SequentialJudgement, references: list[str]) -> list[str]:
    """The summary's line per reference: the methods compared with it, by their last look's decision."""
    lines = []
    for reference in references:
        rows = [row for (a, b), row in judgement.latest.items() if b == reference and a not in references]
        if rows:
            words = {word: [row.a for row in rows if DECISION_WORDS.get(row.decision) == word] for word in DECISION_WORDS.values()}
            lines.append(f"Against `{reference}`: " + "; ".join(f"{word}: {', '.join(names)}" for word, names in words.items()
                                                                 if names) + ".")
    return lines
