"""What the reproductions and the untrained baseline share when they score the test split: the
fold models' embeddings scored per mode (``score_modes``), the value Optuna shows for a reproduction
(``objective``) and the log of every opening of the test data (``record_test_access``, read by
``protocol.inspection.audit``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dmlbench import files, provenance
from dmlbench.analysis.endpoints import MODES, cross_domain_mode, reranked_mode
from dmlbench.evaluation import COUNT_KEYS, evaluate_many
from dmlbench.protocol import layout


def score_modes(embeddings: Mapping[str, Any], labels: Any, metrics: list[str], seed: int,
                query_mask: Any, domains: Any = None, rerank: Any = None, device: Any = None) -> dict[str, dict[str, float]]:
    """The fold models' test embeddings scored concatenated and separated (seed 001 §3.3), their
    neighbours searched on ``device`` (the runs' training device; the same numbers on any); with
    ``domains`` (``evaluation.cross_domain``) also each mode with every query's gallery restricted
    to the other domains (``<mode>_cross_domain``); with ``rerank`` (``evaluation.rerank``'s method)
    also each mode with every query's list re-ranked (``<mode>_reranked``)."""
    scores = {}
    for mode in MODES:
        values = evaluate_many(embeddings, labels, mode=mode, metrics=metrics, seed=seed, query_mask=query_mask,
                               device=device)
        scores[mode] = {name: float(value) for name, value in values.items() if name not in COUNT_KEYS}
    if domains is not None:
        for mode in MODES:
            values = evaluate_many(embeddings, labels, mode=mode, metrics=metrics, seed=seed, query_mask=query_mask,
                                   domains=domains, device=device)
            scores[cross_domain_mode(mode)] = {name: float(value) for name, value in values.items() if name not in COUNT_KEYS}
    if rerank is not None:
        for mode in MODES:
            values = evaluate_many(embeddings, labels, mode=mode, metrics=metrics, seed=seed, query_mask=query_mask,
                                   rerank=rerank)
            scores[reranked_mode(mode)] = {name: float(value) for name, value in values.items() if name not in COUNT_KEYS}
    return scores


def objective(scores: Mapping[str, Mapping[str, float]]) -> float:
    """The value Optuna shows for a reproduction: concatenated MAP@R (or the first metric)."""
    concatenated = scores["concatenated"]
    return float(concatenated.get("map_at_r", next(iter(concatenated.values()))))


def record_test_access(output_dir: Path, entry: Mapping[str, Any]) -> None:
    """Append one opening of the test data to ``OUTPUT_DIR/test_access.jsonl`` (read by ``protocol.inspection.audit``)."""
    line = json.dumps({"time": provenance.now(), **entry}) + "\n"
    path = Path(output_dir) / layout.TEST_ACCESS_FILE
    if files.ends_inside_a_line(path):
        # A write cut short (a killed worker, a full disk): this record starts a line of its own, so that
        # the audit names the damaged line alone. Two workers doing this at once leave an empty line.
        line = "\n" + line
    with open(path, "a") as stream:
        stream.write(line)
        stream.flush()
        os.fsync(stream.fileno())
