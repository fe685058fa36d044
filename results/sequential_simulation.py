"""Error rates, power and cost of the sequential design against the fixed design of the same maximum, by simulation
of the two-level model as a study runs it (the numbers docs/protocol.md "Sequential studies" quotes):

    python results/sequential_simulation.py -o results/sequential_simulation.csv

The built-in benchmark's design (4 methods, references contrastive and triplet + semihard: 5 comparisons; looks
after 3, 6, 9 and 12 searches; Pocock-type spending; 2 reproductions per search) at the search and seed SDs measured
with fresh seeds and folds on glyphs (results/search_luck_fresh_method_glyphs/search_variance.csv) and on emoji
(results/search_luck_fresh_emoji/search_variance.csv). Truths: ``null`` (every method equal: any better/worse is an
error), ``margin`` (differences of one margin or more everywhere: any equivalent is an error) and ``glyphs`` (the
method means of the glyphs study: power and cost). Per row: the family-wise error rates of the sequential and the
fixed design, the mean share of comparisons decided, the mean searches all methods ran (fixed: 4 x 12 = 48) and
the Monte Carlo standard error of an error rate, over ``STUDIES`` studies each.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from dmlbench.analysis.endpoints import declared_comparisons
from dmlbench.analysis.sequential import SequentialDesign
from dmlbench.analysis.sequential_simulation import TwoLevelModel, simulate

STUDIES = 2000
METHODS = ("contrastive", "triplet_semihard", "multi_similarity", "normalized_softmax")
SPREADS = {
    "glyphs": ({"contrastive": 0.00549, "triplet_semihard": 0.00550, "multi_similarity": 0.0, "normalized_softmax": 0.00109},
               {"contrastive": 0.01445, "triplet_semihard": 0.00832, "multi_similarity": 0.01019, "normalized_softmax": 0.01066}),
    "emoji": ({"contrastive": 0.0, "triplet_semihard": 0.0, "multi_similarity": 0.0, "normalized_softmax": 0.02331},
              {"contrastive": 0.01791, "triplet_semihard": 0.02010, "multi_similarity": 0.01621, "normalized_softmax": 0.00989}),
}
MARGIN = 0.01
TRUTHS = {
    "null": dict.fromkeys(METHODS, 0.40),
    "margin": {"contrastive": 0.40, "triplet_semihard": 0.40 + MARGIN, "multi_similarity": 0.40 + 2 * MARGIN,
               "normalized_softmax": 0.40 - MARGIN},
    # results/search_luck_fresh_method_glyphs: differences against contrastive, concatenated MAP@R.
    "glyphs": {"contrastive": 0.40, "triplet_semihard": 0.40 - 0.0191, "multi_similarity": 0.40 - 0.0368,
               "normalized_softmax": 0.40 - 0.0211},
}
COLUMNS = ("spreads", "truth", "studies", "wrong_difference", "wrong_equivalence", "fixed_wrong_difference",
           "fixed_wrong_equivalence", "error_se", "decided_share", "fixed_decided_share", "method_searches",
           "method_searches_p10", "method_searches_p90", "fixed_method_searches")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--studies", type=int, default=STUDIES)
    options = parser.parse_args(argv)
    comparisons = declared_comparisons(["contrastive", "triplet_semihard"], [], list(METHODS))
    design = SequentialDesign(12, 3, margin=MARGIN)
    rows = []
    for spread_name, (search_sd, seed_sd) in SPREADS.items():
        for truth_name, means in TRUTHS.items():
            s = simulate(TwoLevelModel(means, search_sd, seed_sd, 2), comparisons, design, options.studies, seed=62)
            rows.append([spread_name, truth_name, s.studies, s.wrong_difference, s.wrong_equivalence,
                         s.fixed_wrong_difference, s.fixed_wrong_equivalence, s.monte_carlo_error(0.05),
                         sum(s.decided.values()) / len(comparisons), sum(s.fixed_decided.values()) / len(comparisons),
                         s.method_searches, s.method_searches_quantiles[0], s.method_searches_quantiles[2],
                         s.fixed_method_searches])
            print(*rows[-1], flush=True)
    with options.output.open("w", newline="") as stream:
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(COLUMNS)
        writer.writerows([[repr(cell) if isinstance(cell, float) else cell for cell in row] for row in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
