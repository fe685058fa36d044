"""Does a study's verdict transfer to another study (another dataset, budget or search)? Both studies'
declared comparisons, re-judged from their committed scores by today's rules (``verdicts.judge``),
side by side, one row per comparison that both declare (either orientation, written as the first
study's), per endpoint:

- ``holds``: the first study's verdict is better, worse or equivalent and the second's is the same;
- ``reversed``: better in one and worse in the other;
- ``not confirmed``: the first study decided, the second did not reach that verdict (another or none);
- ``nothing to transfer``: the first study's verdict was inconclusive (the second's is shown, new)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from dmlbench.analysis.statistics import PairedComparison
from dmlbench.analysis.verdicts import Families

STUDY_COLUMNS = ("n", "mean_difference", "ci_low", "ci_high", "t_pvalue_holm", "tost_pvalue_holm", "outcome")
COLUMNS = ("mode", "metric", "a", "b", *(f"first_{name}" for name in STUDY_COLUMNS),
           *(f"second_{name}" for name in STUDY_COLUMNS), "family_size_first", "family_size_second", "transfer")
DECIDED = ("better", "worse", "equivalent")


def oriented(comparison: PairedComparison, a: str) -> list[object]:
    """``STUDY_COLUMNS`` of ``comparison`` written as ``a - other``."""
    c = comparison if comparison.a == a else comparison.swapped()
    return [c.n, c.mean_difference, c.difference_low, c.difference_high, c.t_pvalue_holm, c.tost_pvalue_holm, c.outcome()]


def transfer(first: str, second: str) -> str:
    """The transfer of the first study's verdict ``first`` to the second's ``second`` (module docstring)."""
    if first not in DECIDED:
        return "nothing to transfer"
    if first == second:
        return "holds"
    return "reversed" if {first, second} == {"better", "worse"} else "not confirmed"


def transfer_rows(first: Families, second: Families) -> list[list[object]]:
    """One ``COLUMNS`` row per comparison both studies' families hold, endpoint by endpoint."""
    rows = []
    for endpoint, first_family in first.items():
        second_family = {frozenset((c.a, c.b)): c for c in second.get(endpoint, [])}
        for comparison in first_family:
            other = second_family.get(frozenset((comparison.a, comparison.b)))
            if other is not None:
                left, right = oriented(comparison, comparison.a), oriented(other, comparison.a)
                rows.append([*endpoint, comparison.a, comparison.b, *left, *right, len(first_family),
                             len(second_family), transfer(str(left[-1]), str(right[-1]))])
    return rows


def transfer_counts(rows: list[list[object]]) -> Mapping[str, int]:
    """How many rows of each transfer kind, by name."""
    return dict(sorted(Counter(str(row[-1]) for row in rows).items()))


def decided_later(rows: list[list[object]]) -> str:
    """How many of the first study's inconclusive verdicts the second study decides, by verdict."""
    first, second = COLUMNS.index("first_outcome"), COLUMNS.index("second_outcome")
    undecided = [row for row in rows if row[first] == "inconclusive"]
    decided = Counter(str(row[second]) for row in undecided if row[second] in DECIDED)
    shown = "".join(f", {name} {decided[name]}" for name in DECIDED if decided[name])
    return f"of the first study's {len(undecided)} inconclusive verdicts, the second decides {sum(decided.values())}{shown}"
