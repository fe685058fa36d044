"""A finished run opened once (``Run.open``): its record, config, dataset, splits and models
(``training.run_evaluation`` evaluates it in one pass)."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from dmlbench import config as config_module
from dmlbench import files, plugins
from dmlbench.data.base import ImageDataset
from dmlbench.data.splits import Splits
from dmlbench.errors import UserInputError
from dmlbench.training import records
from dmlbench.training.embed import embed
from dmlbench.training.placement import STANDALONE, Placement
from dmlbench.training.setup import build_model, load_dataset, make_splits


def load_run_config(run_dir: Path, record: dict[str, Any]) -> config_module.Config:
    """The run's config, read after the plugins its ``record`` (its ``run.json``) names are imported (no
    ``--plugin`` needed)."""
    plugins.load_recorded(record.get("plugins") or [], f"run {run_dir}")
    return config_module.load(run_dir / records.CONFIG_FILE)


def embed_test_split(run: str | Path | Run, *, untrained: bool = False) -> tuple[Tensor, Tensor]:
    """Embeddings and labels of the standard test split under the run's best (validation-selected)
    checkpoint, or with ``untrained`` the run's model as initialised (the baseline). For the
    protocol's final stage only (``protocol.reproductions``, which combines the fold models of a
    reproduction with ``evaluation.evaluate_many``, Musgrave et al. 2020 §3.3)."""
    run = opened(run)
    model = run.untrained_model() if untrained else run.trained_model()
    return embed(model, run.split("test"), run.batch_size, run.device)


def test_query_mask(run: str | Path | Run) -> Tensor | None:
    """Bool mask over the rows of ``embed_test_split``: ``True`` for a query, ``False`` for a gallery
    item; ``None`` when the dataset has no roles (all-vs-all). Pass it as ``query_mask`` to
    ``evaluation.evaluate`` / ``evaluate_many``."""
    return opened(run).test_query_mask()


def test_domains(dataset: ImageDataset, indices: Any, config: config_module.Config) -> Any:
    """The domains of ``dataset``'s items at ``indices`` when ``evaluation.cross_domain`` is on, else ``None``;
    a dataset whose images carry no domain cannot be evaluated cross-domain."""
    if not config.evaluation.cross_domain:
        return None
    domains = getattr(dataset, "domains", None)
    if domains is None:
        raise UserInputError(f"evaluation.cross_domain needs a dataset whose images carry a domain; {config.data.name!r} has none")
    return domains[indices]


def run_test_domains(run: str | Path | Run) -> Any:
    """``test_domains`` of a finished run's test split (the rows of ``embed_test_split``)."""
    return opened(run).test_domains()


def query_mask(dataset: ImageDataset, indices: Any) -> Tensor | None:
    """``True`` for the queries among ``dataset``'s items at ``indices``, ``False`` for the gallery;
    ``None`` when the dataset declares no roles (every item queries all others)."""
    roles = getattr(dataset, "roles", None)
    if roles is None:
        return None
    return torch.from_numpy(roles[indices] == "query")


def embed_run(run: str | Path | Run, split: Literal["train", "validation"] = "train") -> tuple[Tensor, Tensor]:
    """Embeddings and labels of a non-test split under the run's best checkpoint (for the embedding-space
    analysis, which Roth et al. 2020 compute on the training data). The test split goes only through
    ``evaluate_run``."""
    if split not in ("train", "validation"):
        raise UserInputError(f"split must be 'train' or 'validation', got {split!r}")
    run = opened(run)
    return embed(run.trained_model(), run.split(split), run.batch_size, run.device)


class Run:
    """A finished run, opened once: its record and config (read by ``open``), and its dataset (checked
    against the content hash the run was trained on) and splits, loaded on first use and then kept,
    so that embedding its splits, its query mask, its test domains and its scores reuse one load.
    A stored evaluation (``evaluate_run``) needs no dataset, so none is loaded for it."""

    def __init__(self, run_dir: Path, record: dict[str, Any], config: config_module.Config,
                 placement: Placement = STANDALONE) -> None:
        self.run_dir, self.record, self.config, self.placement = run_dir, record, config, placement
        self.batch_size = config.evaluation.batch_size

    @classmethod
    def open(cls, run_dir: str | Path, placement: Placement = STANDALONE) -> Run:
        """The completed run in ``run_dir`` (one line naming what is missing otherwise), to be embedded
        where ``placement`` puts this worker."""
        run_dir = Path(run_dir)
        record = _completed_record(run_dir)
        return cls(run_dir, record, load_run_config(run_dir, record), placement)

    @cached_property
    def device(self) -> torch.device:
        """The run's device on this machine; resolved when first needed, so a stored evaluation of a GPU
        run reads back without one."""
        return self.placement.device(self.config.training.device)

    @cached_property
    def dataset(self) -> ImageDataset:
        return trained_dataset(self.run_dir, self.config, self.record)

    @cached_property
    def splits(self) -> Splits:
        return make_splits(self.config, self.dataset)

    def split(self, name: str) -> ImageDataset:
        return self.dataset.subset(getattr(self.splits, name))

    def test_query_mask(self) -> Tensor | None:
        return query_mask(self.dataset, self.splits.test)

    def test_domains(self) -> Any:
        return test_domains(self.dataset, self.splits.test, self.config)

    def untrained_model(self) -> nn.Module:
        """The model exactly as training started (same seed, same initialisation)."""
        return build_model(self.config).to(self.device)

    def trained_model(self) -> nn.Module:
        return best_model(self, self.device)[0]


def opened(run: str | Path | Run) -> Run:
    """``run`` itself when it is already open, else the run in that directory, opened."""
    return run if isinstance(run, Run) else Run.open(run)


def trained_dataset(run_dir: Path, config: config_module.Config, record: dict[str, Any]) -> ImageDataset:
    """The run's dataset, refused unless its content hash is the one the run was trained on."""
    dataset = load_dataset(config)
    if dataset.content_hash != record["dataset"]["content_hash"]:
        raise UserInputError(f"dataset {config.data.name!r} differs from the one run {run_dir} was trained on")
    return dataset


def best_model(run: Run, device: torch.device) -> tuple[nn.Module, int]:
    """The run's model on ``device`` with its validation-selected checkpoint loaded, and that checkpoint's epoch."""
    run_dir = run.run_dir
    if "frozen_trunk" in run.record:
        raise UserInputError(f"run {run_dir} trained only a head on cached trunk features (protocol.frozen_trunk): "
                             "its checkpoints hold no trunk to embed images with")
    model = build_model(run.config).to(device)
    state = files.load_checkpoint(
        run_dir / records.BEST_CHECKPOINT,
        f"train the run again (dmlbench train {run_dir / records.CONFIG_FILE} -o NEW_DIR) or restore the file from a backup",
        map_location=device)
    model.load_state_dict(state["model"])
    return model, int(state["epoch"])


def _completed_record(run_dir: Path) -> dict[str, Any]:
    record = records.require_run_dir(run_dir)
    if record.get("status") != "completed":
        raise UserInputError(f"run {run_dir} is not completed (status: {record.get('status')})")
    if not (run_dir / records.BEST_CHECKPOINT).is_file():
        raise UserInputError(f"run {run_dir} has no {records.BEST_CHECKPOINT}")
    return record
