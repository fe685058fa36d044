"""The search luck a comparison assumes (``analysis.search_sd``): one SD for every method or one per method, the SD
a comparison of two methods then carries, and the paired test with it added to the seeds' standard error
(``statistics.paired_comparison``; ``analysis.search_luck`` holds the model)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from dmlbench.errors import UserInputError

# A search-luck SD assumed for every method alike, or one per method (``analysis.search_sd``); ``None``: none.
SearchSD = float | Mapping[str, float] | None


def pair_search_sd(search_sd: SearchSD, a: str, b: str) -> float:
    """The search SD that, taken for both methods, gives comparison ``a - b`` its search variance ``sigma_a² +
    sigma_b²``: ``sqrt((sigma_a² + sigma_b²) / 2)``; ``search_sd`` is one SD for every method, or one per method
    (``analysis.search_sd``); ``None``: none assumed. A method a mapping lacks is a ``UserInputError``."""
    if search_sd is None:
        return 0.0
    if not isinstance(search_sd, Mapping):
        return float(search_sd)
    missing = [name for name in (a, b) if name not in search_sd]
    if missing:
        raise UserInputError(f"analysis.search_sd gives no search SD for method {missing[0]!r}")
    return math.sqrt((search_sd[a] ** 2 + search_sd[b] ** 2) / 2.0)


def search_sd_words(search_sd: float | Mapping[str, float]) -> str:
    """A search SD (``analysis.search_sd``) in words: "1.46 points per method", or "a 1.31, b 0.75 points (each method
    its own)"."""
    if isinstance(search_sd, Mapping):
        return ", ".join(f"{name} {100 * sd:.2f}" for name, sd in search_sd.items()) + " points (each method its own)"
    return f"{100 * search_sd:.2f} points per method"


def se_with_search_luck(differences: np.ndarray, search_sd: float) -> float:
    """The standard error of the mean paired difference with both methods' search luck (SD ``search_sd`` each)
    added to the seeds': ``sqrt(2 search_sd² + s_d²/n)`` (``statistics.paired_comparison``)."""
    return math.sqrt(2 * search_sd**2 + float(differences.var(ddof=1)) / differences.size)
