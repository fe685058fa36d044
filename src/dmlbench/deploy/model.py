"""A finished run's embedding model and the inputs it expects."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from dmlbench.config import Config
from dmlbench.data.base import ImageDataset
from dmlbench.deploy.images import InputSpec
from dmlbench.errors import UserInputError
from dmlbench.training import records
from dmlbench.training.placement import resolve_device
from dmlbench.training.runs import Run, best_model, load_run_config
from dmlbench.training.setup import load_dataset


@dataclass
class RunModel:
    """The best checkpoint of a run in evaluation mode, with the opened run (its config, record and
    dataset, ``training.runs.Run``)."""

    run: Run
    model: nn.Module
    device: torch.device
    epoch: int

    @property
    def run_dir(self) -> Path:
        return self.run.run_dir

    @property
    def config(self) -> Config:
        return self.run.config

    @property
    def record(self) -> dict[str, Any]:
        return self.run.record

    @property
    def embedding_dim(self) -> int:
        return int(self.config.model.embedding_dim)

    def dataset(self) -> ImageDataset:
        """The run's dataset exactly as trained on (checked by content hash; loaded once per opened run)."""
        return self.run.dataset

    def other_dataset(self, name: str, root: Path | None) -> ImageDataset:
        """Dataset ``name``: the run's own (checked) when it is the run's and no other root is given;
        with the run's options when it is the run's dataset at another root."""
        if name == self.config.data.name and root is None:
            return self.dataset()
        options = dict(self.config.data.options) if name == self.config.data.name else {}
        settings = self.config.data.model_copy(
            update={"name": name, "root": None if root is None else str(root), "options": options}
        )
        return load_dataset(self.config.model_copy(update={"data": settings}))

    def input_spec(self, dataset: ImageDataset) -> InputSpec:
        return InputSpec.of(dataset, self.config)

    @torch.no_grad()
    def embed(self, images: Tensor) -> Tensor:
        """Embeddings (float32, CPU) of a batch of model inputs."""
        return self.model(images.to(self.device)).float().cpu()


def open_run(run: str | Path | Run) -> Run:
    """A run with a validation-selected checkpoint, opened (``Run``: itself); unlike ``Run.open`` it need
    not have completed: an interrupted run's best checkpoint can be deployed."""
    if isinstance(run, Run):
        return run
    run_dir = Path(run)
    record = records.require_run_dir(run_dir)
    if not (run_dir / records.BEST_CHECKPOINT).is_file():
        raise UserInputError(f"run {run_dir} has no checkpoint ({records.BEST_CHECKPOINT}); train it first")
    return Run(run_dir, record, load_run_config(run_dir, record))


def load_run_model(run: str | Path | Run, device: str | None = None) -> RunModel:
    """Load the validation-selected checkpoint of a run (``Run``: one already opened, whose dataset it
    shares); ``device`` defaults to the run's. A run directory needs its best checkpoint, not a
    completed status."""
    run = open_run(run)
    resolved = resolve_device(device or run.config.training.device)
    model, epoch = best_model(run, resolved)
    model.eval()
    return RunModel(run, model, resolved, epoch)
