"""The 2-D rho-regularisation toy example of Roth et al. 2020 (Fig. 6; supp. G, Fig. 12): ``dmlbench toy``.

``run(output, variants=..., seeds=10, p_switches=(0.001,))`` trains, for every variant and seed, the
plain model (p_switch = 0) and one rho-regularised model per p_switch, then writes

* ``toy.png``: one row per variant in the layout of Fig. 6 (``dmlbench.toy.plot``);
* ``toy.json``::

    {"experiment": str,
     "settings": {"variants": [...], "seeds": [0, ..., N-1], "p_switch": [0.0, ...], "iterations": 200, ...},
     "variants": {VARIANT: {
        "models": [{"name": "plain" | "rho_p<p>", "p_switch": float,
                    "rho": STATS, "recall_at_1": STATS,
                    "switched_tuples": [int] * N,          # triplets whose negative was switched
                    "singular_values": [[s1, s2]] * N}],   # of the training embeddings
        "differences": [{"name": "rho_p<p> - plain", "p_switch": float,
                         "rho": STATS, "recall_at_1": STATS}]}}}   # paired by seed

  with ``STATS = {"per_seed": [float] * N, "mean": float, "ci95": [low, high]}`` (95% Student-t
  interval over the N seeds). rho is ``dmlbench.evaluation.embedding_space.analyze(...)["rho"]`` of
  the embedded training data (``drop=0``), Recall@1 is ``dmlbench.evaluation.evaluate`` on the
  embedded test data.

The fixed choices (network, optimiser, batches, pairs, data layout) are listed in
``dmlbench.toy.experiment`` and ``dmlbench.toy.lines``.
"""

from dmlbench.toy.experiment import (
    FIGURE_FILE,
    JSON_FILE,
    SWEEP,
    format_summary,
    parse_p_switches,
    parse_variants,
    run,
    train_model,
)
from dmlbench.toy.lines import VARIANTS, LineData, make_lines
from dmlbench.toy.results import DEFAULT_P_SWITCH, DEFAULT_SEEDS, ModelRun, ToyResult, ToySettings

__all__ = [
    "DEFAULT_P_SWITCH", "DEFAULT_SEEDS", "FIGURE_FILE", "JSON_FILE", "SWEEP", "VARIANTS",
    "LineData", "ModelRun", "ToyResult", "ToySettings",
    "format_summary", "make_lines", "parse_p_switches", "parse_variants", "run", "train_model",
]
