"""The baseline rows of the leaderboard (``protocol.baselines``), scored on the test classes like every
method and needing no run directory: ``untrained`` is reproduction ``r`` of the reference method (the
first method of the benchmark with best parameters) with its models as initialised (same seeds, no
training step); ``raw_pixels`` embeds each test image as its pixels, after the reference's
preprocessing, so it shows what retrieval gets without any model (the same for every seed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from dmlbench import files, provenance
from dmlbench.protocol import layout
from dmlbench.protocol.design.plan import Context, MethodPlan, ReproductionSettings
from dmlbench.protocol.queue import work
from dmlbench.protocol.units.results import MethodReproductions, read_reproductions
from dmlbench.protocol.units.scoring import objective, record_test_access, score_modes
from dmlbench.protocol.units.unit import Attempt, Unit, claim_reproduction, open_unit_study
from dmlbench.training import records


def recorded_reference(context: Context, kinds: list[str]) -> str | None:
    """The reference method a baseline of the benchmark was started with, if one was: it stays the
    reference when a method before it in the config comes back (``benchmark --retry-failed``)."""
    for kind in kinds:
        try:
            study = optuna.load_study(study_name=layout.reproduction_study(kind), storage=context.worker.storage)
        except KeyError:  # Optuna's answer for a study that does not exist
            continue
        return study.user_attrs.get("reference")
    return None


class Baseline(Unit):
    """One baseline's reproductions (``kind``: ``untrained`` or ``raw_pixels``) as units of work, shared
    by any number of workers."""

    def __init__(self, kind: str, reference: MethodPlan, params: Mapping[str, Any], settings: ReproductionSettings,
                 context: Context) -> None:
        if kind not in layout.BASELINES:
            raise ValueError(f"unknown baseline {kind!r}; known: {', '.join(layout.BASELINES)}")
        self.kind = kind
        self.reference, self.params, self.settings, self.context = reference, dict(params), settings, context
        self.done = False
        self.study = open_unit_study(context.worker, layout.reproduction_study(kind), {
            "method": kind, "reference": reference.name, "params": self.params,
            "reproductions": settings.reproductions, "first_seed": settings.first_seed,
            "fold_layout_hash": context.layout.hash, "config_hash": context.config_hash,
        })

    def claim(self) -> work.Claim | str:
        return claim_reproduction(self.study, self.context.worker, self.settings)

    def attempt(self, claimed: work.Claim) -> Attempt:
        seed = self.settings.first_seed + claimed.slot

        def body(attributes: dict[str, Any]) -> float:
            attributes["seed"] = seed
            scores = self._scores(claimed.slot, seed)
            attributes.update(scores=scores, run_dirs=[])
            return objective(scores)

        return Attempt(body, lambda: 0)  # nothing trains

    def _scores(self, reproduction: int, seed: int) -> dict[str, dict[str, float]]:
        from torch import nn

        from dmlbench.training.embed import embed
        from dmlbench.training.runs import query_mask, test_domains
        from dmlbench.training.setup import build_model, load_dataset, make_splits

        output_dir = self.context.output_dir
        directory = layout.reproduction_dir(output_dir, self.kind, reproduction)
        record_test_access(output_dir, {
            "stage": layout.REPRODUCTION_STAGE, "method": self.kind, "reproduction": directory.name,
            "model": self.kind, "reference": self.reference.name, "runs": [],
        })
        # The test split and the model are the same in every fold (the folds split the development classes
        # only, and the model is built from the reproduction's seed), so it is embedded once and shared.
        config = self.reference.run_config(self.params, self.context.layout.folds[0], seed)
        dataset = load_dataset(config)
        device = self.context.placement.device(config.training.device)
        # The model exactly as reproduction ``r`` of the reference started training it (same seed),
        # or no model: the pixels of the images as the reference's data pipeline hands them over.
        model = (build_model(config) if self.kind == layout.UNTRAINED else nn.Flatten()).to(device)
        test = make_splits(config, dataset).test
        embedded, labels = embed(model, dataset.subset(test), config.evaluation.batch_size, device)
        mask = query_mask(dataset, test)  # queries against the gallery for a dataset with roles
        domains = test_domains(dataset, test, config)
        # Named as a reproduction names its fold models: after the fold's run directory.
        embeddings = {layout.fold_dir(directory, fold.index).name: embedded for fold in self.context.layout.folds}
        # Re-ranked (when evaluation.rerank is set) with the reference's best parameters, like its reproductions.
        scores = score_modes(embeddings, labels, self.reference.config.evaluation.metrics, seed, mask, domains,
                             config.evaluation.rerank.method(), device)
        directory.mkdir(parents=True, exist_ok=True)
        files.write_json(directory / records.TEST_METRICS_FILE, {"evaluated": provenance.now(), "scores": scores})
        return scores

    def result(self) -> MethodReproductions:
        return read_reproductions(self.study, self.kind, {}, self.context.layout.hash, self.context.output_dir)
