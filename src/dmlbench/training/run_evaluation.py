"""A finished run evaluated in one pass (``RunEvaluation``): opened once, its best checkpoint loaded once,
each split embedded once per model (trained, untrained), and every evaluation served from those
embeddings: the test scores (raw, re-ranked, cross-domain) here, per-query results, verification, open-set
identification and the embedding-space analysis of the training split by ``dmlbench evaluate``'s report
(``report.evaluation``) from ``embedded`` and ``test_split``."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from dmlbench import config as config_module
from dmlbench import evaluation, files, provenance
from dmlbench.data.base import ImageDataset
from dmlbench.errors import UserInputError
from dmlbench.evaluation.rerank import build as build_rerank
from dmlbench.training import records
from dmlbench.training.embed import embed
from dmlbench.training.runs import Run, opened

SPLITS = ("train", "validation", "test")


@dataclass
class TestSplit:
    """A run's test split under its best checkpoint: items, their names, embeddings and labels."""

    items: ImageDataset
    names: list[str]
    embeddings: Tensor
    labels: Tensor
    query_mask: Tensor | None


def item_names(dataset: ImageDataset, subset: ImageDataset) -> list[str]:
    """File paths where the dataset has them, else ``<dataset>:<index in the full dataset>``."""
    sources = subset.source_indices.tolist() if subset.source_indices is not None else range(len(subset))
    paths = getattr(dataset, "paths", None)
    return [str(paths[i]) if paths is not None else f"{dataset.name}:{i}" for i in sources]


class RunEvaluation:
    """Every evaluation of one finished run, each split embedded at most once per model.

    ``embedded(split, untrained=...)`` embeds a split on first use and keeps it; ``scores`` and
    ``test_split`` read only those embeddings, so together (and with what is computed from the test
    split) they embed the test split once with the trained model (and once with the untrained one, for
    the scores). ``embeddings_made`` counts the embeddings computed."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self._embedded: dict[tuple[str, bool], tuple[Tensor, Tensor]] = {}
        self.embeddings_made = 0

    @classmethod
    def open(cls, run: str | Path | Run) -> RunEvaluation:
        """The evaluation of the completed run in ``run`` (or of a run already opened)."""
        return cls(opened(run))

    @cached_property
    def trained_model(self) -> nn.Module:
        """The validation-selected checkpoint, loaded once, in evaluation mode."""
        return self.run.trained_model().eval()

    def embedded(self, split: str, *, untrained: bool = False) -> tuple[Tensor, Tensor]:
        """Embeddings and labels of ``split`` under the trained (or the untrained) model, made once."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        key = (split, untrained)
        if key not in self._embedded:
            model = self.run.untrained_model() if untrained else self.trained_model
            self._embedded[key] = embed(model, self.run.split(split), self.run.batch_size, self.run.device)
            self.embeddings_made += 1
        return self._embedded[key]

    def scores(self, *, rerank: Mapping[str, Any] | None = None, **evaluate_kwargs: Any) -> dict[str, Any]:
        """Test metrics of the trained and the untrained model (``training.runs.evaluate_run``): stored in the
        run directory and read back, without embedding anything, on a later call with the same options."""
        run = self.run
        stored_path = run.run_dir / records.TEST_METRICS_FILE
        settings = run.config.evaluation.rerank if rerank is None else _rerank_settings(rerank)
        method = settings.method()
        # Only when re-ranking, so that the stored results of runs without it keep their options. An option
        # given at ``evaluation.evaluate``'s own default is the same evaluation, stored under the same options.
        options = {key: _jsonable(value) for key, value in sorted(
            {**_not_default(evaluate_kwargs), **({} if method is None else {"rerank": settings.model_dump(mode="json")})}.items())}
        if stored_path.exists():
            stored = files.read_json(stored_path)
            if stored.get("options") == options:
                return stored["results"]
        evaluate_kwargs.setdefault("seed", run.config.seed)
        # After the stored options: where the search runs changes no number (the device kNN equals the CPU's).
        evaluate_kwargs.setdefault("device", run.device)
        if (query_mask := run.test_query_mask()) is not None:
            evaluate_kwargs["query_mask"] = query_mask
        trained, labels = self.embedded("test")
        untrained, _ = self.embedded("test", untrained=True)

        def both(name: str, **extra: Any) -> dict[str, Any]:
            return {name: dict(evaluation.evaluate(trained, labels, **evaluate_kwargs, **extra)),
                    f"untrained_{name}": dict(evaluation.evaluate(untrained, labels, **evaluate_kwargs, **extra))}

        results = dict(evaluation.evaluate(trained, labels, **evaluate_kwargs))
        results["untrained"] = dict(evaluation.evaluate(untrained, labels, **evaluate_kwargs))
        if method is not None:
            results.update(both("reranked", rerank=method))
        if (domains := run.test_domains()) is not None:  # beside all-vs-all: each query answered from the other domains
            results.update(both("cross_domain", domains=domains))
        files.write_json(stored_path, {"evaluated": provenance.now(), "options": options, "results": results})
        return results

    def test_split(self) -> TestSplit:
        """The test split's items, names, trained embeddings and labels, and its query/gallery roles."""
        embeddings, labels = self.embedded("test")
        test = self.run.split("test")
        return TestSplit(test, item_names(self.run.dataset, test), embeddings, labels, self.run.test_query_mask())


def evaluate_run(run: str | Path | Run, *, rerank: Mapping[str, Any] | None = None, **evaluate_kwargs: Any) -> dict[str, Any]:
    """Test metrics of the run's best (validation-selected) checkpoint and of the untrained model.

    A dataset with query/gallery roles (In-Shop, a CSV with ``role``) is evaluated queries against
    the gallery (``test_query_mask``), every other one all-vs-all. With re-ranking (``rerank``:
    ``{"kind": ..., "params": {...}}``, default the run config's ``evaluation.rerank``) the metrics
    are also computed re-ranked, under ``reranked`` and ``untrained_reranked`` beside the raw ones.

    The test split is embedded once: the result is stored in the run directory and returned as
    stored on later calls with the same options (without loading the dataset).
    """
    return RunEvaluation.open(run).scores(rerank=rerank, **evaluate_kwargs)


def _rerank_settings(rerank: Mapping[str, Any]) -> config_module.RerankConfig:
    """``{"kind": ..., "params": {...}}`` as the config section, validated (one line on an error)."""
    unknown = sorted(set(rerank) - {"kind", "params"})
    if unknown:
        raise UserInputError(f"rerank takes kind and params, not {unknown[0]!r}")
    kind, params = str(rerank.get("kind", "none")), dict(rerank.get("params") or {})
    build_rerank(kind, **params)  # the one-line error, before pydantic wraps it
    return config_module.RerankConfig(kind=kind, params=params)


def _not_default(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` less those equal to ``evaluation.evaluate``'s defaults (they change no number); not the
    seed, whose default here is the run's own."""
    defaults = {name: parameter.default for name, parameter in inspect.signature(evaluation.evaluate).parameters.items()
                if name != "seed"}
    return {name: value for name, value in options.items()
            if name not in defaults or _jsonable(defaults[name]) != _jsonable(value)}


def _jsonable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
