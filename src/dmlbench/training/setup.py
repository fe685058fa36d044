"""Turning a ``Config`` into the objects of a run: data splits, model, loss, miner, sampler, optimiser."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Sampler

from dmlbench import data, losses, mining, models, plugins, sampling
from dmlbench.config import Config
from dmlbench.data.base import ImageDataset
from dmlbench.data.files import FileDataset
from dmlbench.data.splits import Splits, standard_splits, train_test_split
from dmlbench.errors import PluginFailed, UserInputError
from dmlbench.losses.base import MetricLoss, loss_parameters
from dmlbench.mining.base import Miner
from dmlbench.models.bninception import BNInception
from dmlbench.registry import accepted_parameters


@dataclass
class Components:
    model: models.EmbeddingModel | models.EnsembleModel
    loss: MetricLoss
    miner: Miner | None
    optimizer: torch.optim.Optimizer


def make_splits(config: Config, dataset: ImageDataset, *, test: bool = True) -> Splits:
    """The run's splits of the full dataset: the standard ones, or the explicit classes of a fold.

    With ``data.train_classes`` / ``data.val_classes`` (a cross-validation fold of the development
    classes, Musgrave et al. 2020 §3.3) train and validation hold exactly those classes; a class that
    is not in the dataset or that belongs to the standard test split is a ``UserInputError``. ``test``
    is the standard test split in both cases (only ``evaluate_run`` reads it). Files that cannot be
    decoded are dropped with a warning: from train and validation always, from the test split only
    with ``test`` (training passes ``False``: it never decodes a test image, and leaves that split as
    the dataset declares it).
    """
    splits = _class_splits(config, dataset)
    development = np.concatenate([splits.train, splits.validation])
    dropped = unreadable_items(config, dataset, development, "training and validation images")
    if test:
        dropped = np.concatenate([dropped, unreadable_items(config, dataset, splits.test, "test images")])
    if len(dropped):
        splits = Splits(**{name: np.setdiff1d(indices, dropped, assume_unique=True) if len(indices) else indices
                           for name, indices in splits.as_dict().items()})
    dataset.metadata["unreadable_items"] = sorted(set(dataset.metadata.get("unreadable_items", [])) | set(dropped.tolist()))
    _check_enough_classes(config, dataset, splits)
    return splits


def unreadable_items(config: Config, dataset: ImageDataset, indices: np.ndarray, what: str) -> np.ndarray:
    """The items among ``indices`` whose file is missing, truncated or not an image (a file
    dataset's scan of the part these items belong to), warned about; none readable is a ``UserInputError``."""
    if not hasattr(dataset, "find_unreadable") or not len(indices):
        return np.empty(0, dtype=np.int64)
    found = np.asarray(dataset.subset(indices).find_unreadable(), dtype=np.int64)
    settings = config.data
    listing = f"dmlbench data check {settings.name} --root {settings.root} lists them"
    if len(found) == len(indices):
        raise UserInputError(f"dataset {settings.name!r} at {settings.root}: none of its {len(indices)} {what} can be read "
                             f"(missing, truncated or not images; {listing})")
    if len(found):
        warnings.warn(f"dataset {settings.name!r}: skipping {len(found)} unreadable {what} ({listing})", stacklevel=2)
    return np.asarray(indices, dtype=np.int64)[found]


def _check_enough_classes(config: Config, dataset: ImageDataset, splits: Splits) -> None:
    """Checkpoint selection ranks validation items against other classes: one class cannot be
    scored. Said here, before a run directory exists, with the numbers that cause it."""
    labels = np.asarray(dataset.labels)
    train_classes = len(np.unique(labels[splits.train])) if len(splits.train) else 0
    validation_classes = len(np.unique(labels[splits.validation])) if len(splits.validation) else 0
    if validation_classes < 2:
        raise UserInputError(
            f"the validation split has {validation_classes} class(es) ({train_classes} training classes, "
            f"data.validation_fraction={config.data.validation_fraction}); selecting a checkpoint needs at least 2: "
            "raise data.validation_fraction or use a dataset with more classes"
        )


def _class_splits(config: Config, dataset: ImageDataset) -> Splits:
    if config.data.train_classes is None or config.data.val_classes is None:
        return standard_splits(dataset, config.data.validation_fraction, config.seed)
    labels = np.asarray(dataset.labels)
    pool, test = train_test_split(dataset)
    development = set(np.unique(labels[pool]).tolist())
    test_classes = set(np.unique(labels[test]).tolist())
    for key, classes in (("train_classes", config.data.train_classes), ("val_classes", config.data.val_classes)):
        for class_id in classes:
            if class_id in test_classes:
                raise UserInputError(f"data.{key}: class {class_id} is a test class (never trained or validated on)")
            if class_id not in development:
                raise UserInputError(f"data.{key}: class {class_id} is not a class of dataset {config.data.name!r}")
    train = np.flatnonzero(np.isin(labels, config.data.train_classes)).astype(np.int64)
    validation = np.flatnonzero(np.isin(labels, config.data.val_classes)).astype(np.int64)
    return Splits(train=train, validation=validation, test=test)


def training_view(dataset: ImageDataset, splits: Splits) -> tuple[ImageDataset, Splits]:
    """The dataset without its test split, and the train/validation splits re-indexed into it.

    The training loop only ever holds this view, so no test image can reach training or model
    selection (the test split is read by ``evaluate_run`` alone); the view's ``test`` is empty.
    """
    keep = np.concatenate([splits.train, splits.validation])
    view = dataset.subset(keep)
    positions = np.arange(len(keep), dtype=np.int64)
    return view, Splits(
        train=positions[: len(splits.train)],
        validation=positions[len(splits.train):],
        test=np.empty(0, dtype=np.int64),
    )


def class_index(labels: np.ndarray) -> torch.Tensor:
    """A lookup table from the training classes' ids to ``0 .. C-1`` (losses with class weights need it)."""
    classes = np.unique(labels)
    table = torch.full((int(classes.max()) + 1,), -1, dtype=torch.long)
    table[torch.as_tensor(classes)] = torch.arange(len(classes))
    return table


def load_dataset(config: Config) -> ImageDataset:
    """The configured dataset. Nothing is decoded here: ``make_splits`` scans the files of the items
    a run uses for unreadable images (``unreadable_items``) and drops them."""
    settings = config.data
    source = data.dataset_source(settings.name)
    if source.kind != "files":
        options = dict(settings.options)
        if settings.root is not None:
            if not source.takes_root:
                raise UserInputError(f"data.root is for the datasets read from files ({', '.join(data.rooted_datasets())}), "
                                     f"not {settings.name!r}")
            options["root"] = settings.root
        dataset = data.build(settings.name, **options)
        return dataset.with_augmentation(settings.augmentation, config.seed) if settings.augmentation != "none" else dataset
    # For file formats these are settings of data itself; given in data.options too they reached the
    # reader twice (a TypeError with a traceback). The glyphs and emoji options are not.
    doubled = sorted(set(settings.options) & {"root", "image_size", "augmentation", "seed", "cache_dir"})
    if doubled:
        raise UserInputError(f"data.options.{doubled[0]} is data.{doubled[0]} for the {settings.name!r} format: "
                             f"set data.{doubled[0]}=... and leave it out of data.options")
    return data.build(
        settings.name, root=settings.root, image_size=settings.image_size, augmentation=settings.augmentation,
        seed=config.seed, cache_dir=settings.cache_dir, **settings.options,
    )


def build_model(config: Config) -> models.EmbeddingModel | models.EnsembleModel:
    settings = config.model
    return models.build(
        settings.trunk,
        embedding_dim=settings.embedding_dim,
        layer_norm=settings.layer_norm,
        normalize=settings.normalize,
        bias=settings.bias,
        freeze_bn=settings.freeze_bn,
        binarize_output=settings.binarize,
        ensemble=settings.ensemble,
        seed=config.seed,
        pooling=settings.pooling,
        pretrained=settings.pretrained,
        **settings.options,
    )


def check_input_channels(config: Config, model: nn.Module, dataset: ImageDataset) -> None:
    """Refuse, before any step, a trunk whose first convolution takes another number of channels than
    the dataset's images have (a grey trunk on RGB emoji would fail every step with a shape error)."""
    first = next((module for module in model.modules() if isinstance(module, nn.Conv2d)), None)
    if first is None or first.in_channels == dataset.num_channels:
        return
    raise UserInputError(
        f"model.trunk {config.model.trunk!r} takes {first.in_channels}-channel images but data {config.data.name!r} "
        f"has {dataset.num_channels}-channel images: set model.options.in_channels={dataset.num_channels}")


def check_input_size(model: nn.Module, dataset: ImageDataset) -> None:
    """Refuse, before any step, an image size the trunk cannot take: BN-Inception pooling as the Caffe
    release, for its ImageNet weights, needs even maps at its stride-2 modules (every step would fail)."""
    for module in model.modules():
        if isinstance(module, BNInception) and (error := module.input_size_error(*dataset.image_size)) is not None:
            raise error


def build_sampler(config: Config, train_labels: np.ndarray) -> Sampler[list[int]]:
    return sampling.build(
        config.sampler.name,
        labels=train_labels,
        batch_size=config.training.batch_size,
        seed=config.seed,
        **config.sampler.params,
    )


@dataclass
class TrainingSetup:
    """What a run trains with: the dataset without its test split (``training_view``) and its
    splits, the full dataset's splits and content hash (for the record), the class lookup, the
    train and validation subsets, the seeded batch sampler and the components."""

    dataset: ImageDataset
    splits: Splits
    full_splits: Splits
    dataset_hash: str
    to_class_index: torch.Tensor
    train_set: ImageDataset
    validation_set: ImageDataset
    sampler: Sampler[list[int]]
    components: Components


def set_up_training(config: Config, device: torch.device) -> TrainingSetup:
    """The one set-up of a training run (``training.train`` and ``protocol.dry_run.cost``)."""
    full_dataset = load_dataset(config)
    if config.evaluation.cross_domain and getattr(full_dataset, "domains", None) is None:
        # Said before training, not after it, when the test split would be scored.
        raise UserInputError(f"evaluation.cross_domain needs a dataset whose images carry a domain; {config.data.name!r} has none")
    full_splits = make_splits(config, full_dataset, test=False)
    dataset, splits = training_view(full_dataset, full_splits)
    labels = torch.as_tensor(dataset.labels)
    to_class_index = class_index(labels[splits.train].numpy())
    try:
        sampler = build_sampler(config, to_class_index[labels[splits.train]].numpy())
        components = build_components(config, int((to_class_index >= 0).sum()), device)
        check_input_channels(config, components.model, full_dataset)
        check_input_size(components.model, full_dataset)
    except Exception as error:
        # A plugin's constructor that raises: one line naming it and its frame (no run directory exists yet).
        in_plugin = plugins.failure(error)
        if in_plugin is None or isinstance(error, UserInputError):
            raise
        raise PluginFailed(in_plugin) from error
    return TrainingSetup(dataset, splits, full_splits, full_dataset.content_hash, to_class_index,
                         held_on(dataset.subset(splits.train), device), held_on(dataset.subset(splits.validation), device),
                         sampler, components)


# The share of a GPU's free memory a run's training or validation images may take there.
_DEVICE_DATA_SHARE = 0.25


def held_on(dataset: ImageDataset | FileDataset, device: torch.device) -> ImageDataset | FileDataset:
    """``dataset`` with its uint8 images on ``device`` when that spares a host copy per step (a CUDA
    device, and images within a quarter of the device's free memory: an in-memory dataset's, or the
    decoded base images of a file dataset's parts); else ``dataset`` itself. The training views are
    then cut there, with the random draws of the host path (``data.transforms``)."""
    if device.type != "cuda":
        return dataset
    free, _ = torch.cuda.mem_get_info(device)
    if dataset.held_bytes() > _DEVICE_DATA_SHARE * free:
        return dataset
    return dataset.on_device(device)


def build_components(config: Config, num_classes: int, device: torch.device) -> Components:
    model = build_model(config).to(device)
    loss, miner = build_loss_and_miner(config, num_classes, device)
    optimizer = build_optimizer(config, model, loss)
    return Components(model=model, loss=loss, miner=miner, optimizer=optimizer)


def build_loss_and_miner(config: Config, num_classes: int, device: torch.device) -> tuple[MetricLoss, Miner | None]:
    """The seeded loss (on ``device``) and miner of ``config`` (shared by the loop and ``training.features``)."""
    loss_params = dict(config.loss.params)
    if "seed" in (accepted_parameters(losses.LOSSES.get(config.loss.name)) or set()):
        loss_params["seed"] = config.seed
    loss = losses.build(
        config.loss.name, num_classes=num_classes, embedding_dim=config.model.embedding_dim, **loss_params
    ).to(device)
    miner = None
    if config.miner.name is not None:
        generator = torch.Generator().manual_seed(config.seed + 1)
        miner = mining.build(config.miner.name, generator=generator, p_switch=config.miner.p_switch, **miner_params(config))
    return loss, miner


def miner_params(config: Config) -> dict[str, Any]:
    """The miner's parameters as built (recorded in ``run.json``): the config's, and the loss's margin for a
    miner whose window is that margin when the config sets the loss's margin but not the miner's; a miner
    kept at its own default window while the loss's margin is searched would make every larger margin
    train the same model."""
    params = dict(config.miner.params)
    if config.miner.name is None or config.miner.name not in mining.MINERS:
        return params
    constructor = mining.MINERS.get(config.miner.name)
    if getattr(constructor, "WINDOW_IS_LOSS_MARGIN", False) and "margin" not in params and "margin" in config.loss.params:
        params["margin"] = config.loss.params["margin"]
    return params


def build_optimizer(config: Config, model: Any, loss: nn.Module) -> torch.optim.Optimizer:
    """Parameter groups ``trunk`` (``trunk_lr``), ``head`` (``head_lr``) and, if the loss has its own
    parameters, ``loss`` (``loss_lr``); each keeps its ``base_lr`` for the schedule."""
    settings = config.optimizer
    rates = {
        "trunk": settings.trunk_lr or settings.lr,
        "head": settings.head_lr or settings.lr,
        "loss": settings.loss_lr,
    }
    parameters = {"trunk": model.trunk_parameters(), "head": model.head_parameters(), "loss": loss_parameters(loss)}
    groups = [
        {"params": parameters[name], "lr": rates[name], "base_lr": rates[name], "name": name}
        for name in ("trunk", "head", "loss")
        if parameters[name]
    ]
    if settings.name == "adam":
        return torch.optim.Adam(groups, weight_decay=settings.weight_decay)
    if settings.name == "adamw":
        return torch.optim.AdamW(groups, weight_decay=settings.weight_decay)
    if settings.name == "rmsprop":
        return torch.optim.RMSprop(groups, weight_decay=settings.weight_decay, momentum=settings.momentum)
    return torch.optim.SGD(groups, weight_decay=settings.weight_decay, momentum=settings.momentum)
