"""A sequential study (``protocol.sequential``) run in rounds: every method runs ``round_searches`` searches
(each with its reproductions), the primary family is judged (``analysis.sequential``), the methods with a
comparison still open run the searches of the next look, and so on until every comparison is closed, the design's
``max_searches`` is reached or the user's budget (``RoundBudget``) cannot pay for the next round.

Every worker walks the same rounds: each round's units are the ordinary ones of ``schedule.Schedule`` (the searches
of ``METHOD@searchK`` within ``Prepared.search_limits``), and what a round needs next is judged from the stored
scores alone, so any number of workers, stopped and resumed at any moment, run the same searches and give the same
bytes. Only whether to start a round depends on time: the first worker to decide records it in the storage (under
the work lock) and every worker follows a recorded start. The study's time is the union of the wall-clock spans
of the commands that worked on it (a ``kill -9`` loses the span since its last round)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState

from dmlbench.analysis.endpoints import declared_comparisons
from dmlbench.analysis.sequential import (
    CONTINUE, DECIDED, EQUIVALENT, Pair, SequentialDesign, SequentialJudgement, judge_sequentially, method_search_means)
from dmlbench.analysis.spec import AnalysisSpec
from dmlbench.errors import ParameterError
from dmlbench.protocol import layout as output_layout
from dmlbench.protocol.design.benchmark import ProtocolSpec
from dmlbench.protocol.design.plan import Context
from dmlbench.protocol.design.prepare import Prepared
from dmlbench.protocol.queue import attempts
from dmlbench.protocol.units.reproductions import MethodReproduction
from dmlbench.protocol.units.search import MethodSearch

# The search study attributes of a sequential study: the last round any worker started, and each command's span.
ROUNDS_STARTED = "sequential_rounds_started"
COMMAND_SPANS = "sequential_time"


@dataclass(frozen=True)
class RoundBudget:
    """What one command may spend on a sequential study: ``seconds`` of the study's wall time, every command's
    together (``--budget``; ``None``: no limit), ``max_searches`` of any method (``--max-searches``; ``None``: the
    design's); ``command``: the id its workers share, ``started``: when it began (``time.time()``);
    ``estimator``: the seconds one worker needs for a prepared round, for a first round nothing has measured
    (the dry run's cost model)."""

    seconds: float | None = None
    max_searches: int | None = None
    command: str = ""
    started: float = 0.0
    estimator: Callable[[Prepared], float] | None = None


class RoundSchedule(Protocol):
    """What a round leaves behind: its searches and reproductions (``schedule.Schedule``)."""

    @property
    def searches(self) -> dict[str, MethodSearch]: ...

    @property
    def reproductions(self) -> dict[str, MethodReproduction]: ...


@dataclass(frozen=True)
class RoundsOutcome:
    """How the rounds ended: the judgement, the searches each method ran, the study's seconds and why it stopped."""

    judgement: SequentialJudgement
    searches: dict[str, int]
    seconds: float
    stopped: str

    def summary(self) -> str:
        """One paragraph for the terminal: what was decided, after how many searches and how long, what is open."""
        latest = self.judgement.latest
        decided = [f"{a} {row.decision} than {b} ({row.searches} searches)" if row.decision != EQUIVALENT
                   else f"{a} equivalent to {b} ({row.searches} searches)"
                   for (a, b), row in latest.items() if row.decision in DECIDED]
        closed = [f"{a} vs {b}: {row.decision} after {row.searches} searches" for (a, b), row in latest.items()
                  if row.decision not in DECIDED and row.decision != CONTINUE]
        total = sum(self.searches.values())
        per_search = self.seconds / total if total else 0.0  # a method's search, measured over this study
        still = [f"{a} vs {b}: open after {row.searches} searches"
                 + (f", about {row.searches_to_decide} searches to decide (about "
                    f"{2 * (row.searches_to_decide - row.searches) * per_search / 60:.0f} min more at this study's "
                    f"{per_search:.0f} s per search)" if row.searches_to_decide else "")
                 for (a, b), row in latest.items() if row.decision == CONTINUE]
        return "\n".join([f"sequential study: {len(decided)} of {len(self.judgement.comparisons)} primary comparisons "
                          f"decided after {self.judgement.looks_taken()} look(s), {total} searches in all, "
                          f"{self.seconds / 60:.1f} min ({self.stopped})",
                          *(f"  decided: {line}" for line in decided), *(f"  closed: {line}" for line in closed),
                          *(f"  {line}" for line in still)])


def declared_design(protocol: ProtocolSpec, analysis: AnalysisSpec,
                    methods: Sequence[str]) -> tuple[SequentialDesign, list[Pair]]:
    """A sequential study's design and its primary family: the declared comparisons among ``methods`` (the
    baselines left out), as ``protocol`` and ``analysis`` declare them."""
    assert protocol.max_searches is not None  # the protocol's validator requires it with sequential: true
    compared = [method for method in methods if method not in output_layout.BASELINES]
    return (analysis.sequential_design(protocol.max_searches, protocol.round_searches),
            declared_comparisons(analysis.references, analysis.pairs, compared))


def judge_study(protocol: ProtocolSpec, analysis: AnalysisSpec, methods: Sequence[str],
                scores: Mapping[str, Mapping[int, Mapping[int, float]]]) -> SequentialJudgement:
    """A sequential study's looks from its primary endpoint's scores (``method -> search -> reproduction -> score``,
    read from the storage or from ``runs.csv``): what the rounds, ``dmlbench status``, the report and ``rejudge``
    all judge by."""
    design, comparisons = declared_design(protocol, analysis, methods)
    return judge_sequentially(method_search_means(scores), comparisons, design)


def scores_by_search(studies: Mapping[str, optuna.Study], endpoint: tuple[str, str]) -> dict[str, dict[int, dict[int, float]]]:
    """``method -> search -> reproduction -> score`` on ``endpoint`` of the reproductions scored so far, from the
    reproduction studies of each search (``METHOD`` or ``METHOD@searchK -> study``)."""
    found: dict[str, dict[int, dict[int, float]]] = {}
    for name, study in studies.items():
        method, _, repeat = name.partition(output_layout.SEARCH_REPEAT_MARK)
        found.setdefault(method, {})[int(repeat or 0)] = {
            int(trial.user_attrs["slot"]): float(trial.user_attrs["scores"][endpoint[0]][endpoint[1]])
            for trial in attempts.counted(study) if trial.state == TrialState.COMPLETE and trial.user_attrs.get("scores")}
    return found


def status_lines(protocol: ProtocolSpec, analysis: AnalysisSpec, methods: list[str],
                 studies: Mapping[str, optuna.Study]) -> list[str]:
    """What ``dmlbench status`` says of a sequential study: the last round started and each comparison so far."""
    prefix = output_layout.reproduction_study("")
    reproductions = {name[len(prefix):]: study for name, study in studies.items()
                     if name.startswith(prefix) and name[len(prefix):] not in output_layout.BASELINES}
    endpoint = (analysis.primary.mode, analysis.primary.metric)
    judgement = judge_study(protocol, analysis, methods, scores_by_search(reproductions, endpoint))
    design = judgement.design
    marker = studies.get(methods[0])
    started = marker.user_attrs.get(ROUNDS_STARTED, 1) if marker is not None else 0
    lines = [f"sequential study: round {started} of at most {len(design.looks)} started (looks at "
             f"{', '.join(map(str, design.looks))} searches); {judgement.looks_taken()} look(s) judged"]
    lines += [f"  {a} vs {b}: {row.decision} at {row.searches} searches" for (a, b), row in judgement.latest.items()]
    waiting = [f"{a} vs {b}" for a, b in judgement.comparisons if (a, b) not in judgement.latest]
    if waiting:
        lines.append(f"  not judged yet (the first look needs {design.looks[0]} searches): {', '.join(waiting)}")
    return lines


def run_rounds(prepared: Prepared, context: Context, budget: RoundBudget,
               drive_round: Callable[[Prepared], RoundSchedule]) -> tuple[RoundSchedule, RoundsOutcome]:
    """Drive rounds (``drive_round``: run a round-limited ``Prepared`` to its end) until the study stops (module
    docstring); the last round's schedule, for the summaries and the report, and how the rounds ended."""
    spec = prepared.spec
    methods = [method.name for method in spec.methods]
    design, _ = declared_design(spec.protocol, spec.analysis, methods)
    endpoint = (spec.analysis.primary.mode, spec.analysis.primary.metric)
    limits = {name: design.looks[0] for name in prepared.plans}
    _check_first_round(prepared, budget, limits)
    round_number = 1
    while True:
        schedule = drive_round(replace(prepared, search_limits=dict(limits)))
        studies = {name: unit.study for name, unit in schedule.reproductions.items()}
        judgement = judge_study(spec.protocol, spec.analysis, methods, scores_by_search(studies, endpoint))
        marker = _marker(schedule)
        spent = _record_span(marker, budget)
        wanted = {name: max(count, judgement.next_searches.get(name, 0)) for name, count in limits.items()}
        stopped = _why_stop(judgement, wanted, limits, budget)
        if stopped is None and not _may_start(context, budget, round_number + 1, marker, spent, limits, wanted):
            stopped = f"the next round does not fit in the budget of {_minutes(budget.seconds)}"
        if stopped is not None:
            return schedule, RoundsOutcome(judgement, limits, spent, stopped)
        limits, round_number = wanted, round_number + 1


def _why_stop(judgement: SequentialJudgement, wanted: Mapping[str, int], limits: Mapping[str, int],
              budget: RoundBudget) -> str | None:
    if judgement.finished:
        return "every primary comparison is closed"
    if wanted == limits:  # a search whose reproductions failed: its comparisons cannot be judged
        return "a search needed for the next look has no scores (a failed unit)"
    if budget.max_searches is not None and max(wanted.values()) > budget.max_searches:
        return f"the next look needs more than --max-searches {budget.max_searches}"
    return None


def _check_first_round(prepared: Prepared, budget: RoundBudget, limits: Mapping[str, int]) -> None:
    """Refuse a budget smaller than the first round's estimate (``budget.estimator``) before anything runs; a
    study that has begun (a run directory exists) has measured its own cost instead."""
    if budget.seconds is None or budget.estimator is None or any(output_layout.fold_run_dirs(prepared.output_dir)):
        return
    needed = budget.estimator(replace(prepared, search_limits=dict(limits))) / prepared.jobs
    if needed > budget.seconds:
        raise ParameterError("budget", f"of {_minutes(budget.seconds)} is less than the first round needs here "
                             f"({min(limits.values())} searches of each method, about {_minutes(needed)}, measured now: other work on "
                             "the machine makes it longer); nothing was run; a larger `budget` runs it")


def _may_start(context: Context, budget: RoundBudget, round_number: int, marker: Any, spent: float,
               done: Mapping[str, int], limits: Mapping[str, int]) -> bool:
    """Whether round ``round_number`` (``limits``: the searches it brings each method to) runs: yes if any worker
    started it; else if the budget pays for it at the cost per search measured so far (``spent`` seconds for the
    searches ``done``), and then it is recorded in ``marker`` (the search study holding the records)."""
    with context.worker.lock.held():
        if marker.user_attrs.get(ROUNDS_STARTED, 1) >= round_number:
            return True
        if budget.seconds is not None:
            ran = sum(done.values())
            if spent + spent / ran * (sum(limits.values()) - ran) > budget.seconds:
                return False
        marker.set_user_attr(ROUNDS_STARTED, round_number)
        marker.set_user_attr("report", None)  # the round's last worker writes a new report
    return True


def _marker(schedule: RoundSchedule) -> Any:
    """The search study that holds the benchmark's records (the report's marker, the rounds')."""
    return next(iter(schedule.searches.values())).study


def _record_span(marker: Any, budget: RoundBudget) -> float:
    """Record this command's span so far and return the study's seconds: the union of every command's span."""
    spans, now, command = dict(marker.user_attrs.get(COMMAND_SPANS, {})), time.time(), budget.command or "command"
    spans[command] = [min(spans.get(command, [budget.started or now])[0], now), now]
    marker.set_user_attr(COMMAND_SPANS, spans)
    return union_seconds(list(spans.values()))


def union_seconds(spans: list[list[float]]) -> float:
    """The length of the union of the ``[start, end]`` spans."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "no limit"
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def say(outcome: RoundsOutcome) -> None:
    """The rounds' summary on stderr."""
    print(outcome.summary(), file=sys.stderr, flush=True)
