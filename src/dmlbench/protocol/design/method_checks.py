"""What the methods of one benchmark must agree on, checked by ``protocol.design.prepare`` before anything
is written: epochs, data, metrics (the analysis's primary one among them), re-ranking and seeds (and with
a frozen trunk, the trunk itself); then, once the data is loaded, every method's batch sampler against a
fold's training classes and every model against the images.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dmlbench.data.base import ImageDataset
from dmlbench.errors import UserInputError
from dmlbench.protocol.design.benchmark import FRESH_SEEDS, BenchmarkSpec
from dmlbench.protocol.design.folds import FoldLayout
from dmlbench.protocol.design.plan import MethodPlan, search_seed_offset


def check_shared(spec: BenchmarkSpec, plans: Mapping[str, MethodPlan]) -> None:
    """What the protocol shares between methods: epochs, data, metrics (the analysis's primary metric
    among them), seeds (and with a frozen trunk, the trunk itself)."""
    epochs = {name: plan.config.training.epochs for name, plan in plans.items()}
    if len(set(epochs.values())) > 1:
        raise UserInputError(f"methods train for different numbers of epochs {epochs}: set protocol.epochs")
    (first_name, first), *others = plans.items()
    for name, plan in others:
        if plan.config.data != first.config.data:
            raise UserInputError(f"method {name!r} uses other data than {first_name!r}: every method must use the same data")
        if plan.config.evaluation.metrics != first.config.evaluation.metrics:
            raise UserInputError(f"method {name!r} computes other metrics than {first_name!r}")
        if plan.config.evaluation.rerank.kind != first.config.evaluation.rerank.kind:
            raise UserInputError(f"method {name!r} re-ranks with another evaluation.rerank.kind than {first_name!r}: "
                                 "the re-ranked modes compare methods re-ranked alike (search only its params)")
    if spec.analysis.primary.metric not in first.config.evaluation.metrics:
        raise UserInputError(f"analysis.primary.metric {spec.analysis.primary.metric!r} is not computed; "
                             f"evaluation.metrics: {', '.join(first.config.evaluation.metrics)}")
    for name, plan in plans.items():
        if {"evaluation.rerank", "evaluation.rerank.kind"} & set(plan.space.keys()):
            raise UserInputError(f"method {name!r}: evaluation.rerank.kind is fixed for the benchmark; search "
                                 "evaluation.rerank.params.* instead")
    protocol = spec.protocol
    for search in range(protocol.search_repeats):
        offset = search_seed_offset(protocol, search)
        first = protocol.first_seed + offset
        reproduction_seeds = set(range(first, first + protocol.reproductions))
        search_seeds = {plan.config.seed + offset for plan in plans.values()}
        clash = search_seeds & reproduction_seeds
        if clash:
            raise UserInputError(f"reproduction seeds {first}..{first + protocol.reproductions - 1} of search {search} "
                                 f"include the search's training seed {min(clash)}: set protocol.first_seed")
        later = {plan.config.seed + search_seed_offset(protocol, other) for plan in plans.values()
                 for other in range(search + 1, protocol.search_repeats)}
        if protocol.search_seeds == FRESH_SEEDS and later & reproduction_seeds:
            raise UserInputError(f"reproduction seeds {first}..{first + protocol.reproductions - 1} of search {search} "
                                 f"include a later search's training seed {min(later & reproduction_seeds)}: set "
                                 "protocol.first_seed so that no two searches share a seed")
    if protocol.frozen_trunk:
        _check_one_trunk(plans)


def _check_one_trunk(plans: Mapping[str, MethodPlan]) -> None:
    """With a frozen trunk every method trains its head on the same trunk: their trunk settings must agree."""
    def trunk_of(plan: MethodPlan) -> tuple[Any, ...]:
        model = plan.config.model
        return model.trunk, model.options, model.pretrained, model.pooling, model.freeze_bn
    (first, first_plan), *others = plans.items()
    for name, plan in plans.items():
        if plan.config.model.ensemble != 1:
            raise UserInputError(f"method {name!r}: protocol.frozen_trunk needs a single trunk (model.ensemble=1)")
    for name, plan in others:
        if trunk_of(plan) != trunk_of(first_plan):
            raise UserInputError(f"protocol.frozen_trunk: method {name!r} uses another trunk than {first!r} "
                                 "(model.trunk, options, pretrained, pooling and freeze_bn must agree)")


def check_against_data(plans: Mapping[str, MethodPlan], dataset: ImageDataset, layout: FoldLayout) -> None:
    """Before anything trains (a mismatch would fail every trial, in storage an hour later): every method's
    batch sampler can fill its batches from a fold's training classes (the check ``train`` makes), and every
    model takes the dataset's images (channels and size), each distinct model built once."""
    import numpy as np

    from dmlbench.training.setup import build_model, build_sampler, check_input_channels, check_input_size

    labels = np.asarray(dataset.labels)
    train_labels = labels[np.isin(labels, list(layout.folds[0].train_classes))]
    for name, plan in plans.items():
        try:
            build_sampler(plan.config, train_labels)
        except UserInputError as error:
            raise UserInputError(f"method {name!r}: {error}") from None
    checked = set()
    for plan in plans.values():
        if (model := plan.config.model.model_dump_json()) not in checked:
            checked.add(model)
            network = build_model(plan.config)
            check_input_channels(plan.config, network, dataset)
            check_input_size(network, dataset)
