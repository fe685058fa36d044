"""The frozen-trunk feature cache of the search stage (``protocol.frozen_trunk: true``).

Per fold, one trunk: the pre-trained one as is (``model.pretrained``), or on a dataset without one
(``glyphs``) an ordinary ``train()`` run of the base config on the fold's training classes, selected
on its validation classes, in ``OUTPUT_DIR/trunks/fold_K`` (``run.json``: ``stage`` ``trunk``). Its
features of the fold's train and validation items (never the test split) are computed once, in
evaluation mode, into ``OUTPUT_DIR/features/fold_K.pt``, keyed by the trunk's sha256 and the
dataset's content hash (recomputed when either differs), under a file lock so that local workers
sharing the directory do this once. Every trial then trains only heads on them
(``training.train(..., features=...)``). The reproductions train full models.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from dmlbench import config as config_module
from dmlbench import files
from dmlbench.files import file_sha256
from dmlbench.protocol.design.folds import ClassFold
from dmlbench.protocol.layout import TRUNK_STAGE, feature_file, feature_lock, fold_dir, trunks_dir
from dmlbench.training import records, train_or_resume
from dmlbench.training.features import FoldFeatures, trunk_features
from dmlbench.training.placement import STANDALONE, Placement
from dmlbench.training.setup import build_model, load_dataset, make_splits, training_view


class FeatureCache:
    """The folds' trunk features of one benchmark output directory, trained and extracted on first use.

    ``trunk_raw``: the raw config the trunks are trained (or loaded) with: the first method's config
    with the protocol budget; ``dataset_hash``: the content hash of the benchmark's dataset."""

    def __init__(self, trunk_raw: Mapping[str, Any], output_dir: Path, dataset_hash: str, progress: bool = False,
                 placement: Placement = STANDALONE) -> None:
        self.trunk_raw, self.output_dir = dict(trunk_raw), Path(output_dir)
        self.dataset_hash, self.progress, self.placement = dataset_hash, progress, placement
        self._loaded: dict[int, tuple[dict[str, str], FoldFeatures]] = {}

    def trunk_config(self, fold: ClassFold) -> config_module.Config:
        return config_module.from_dict(config_module.assign(self.trunk_raw, {
            "data.train_classes": list(fold.train_classes), "data.val_classes": list(fold.val_classes)}))

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Workers sharing this output directory train and extract each fold once: the others wait."""
        path = feature_lock(self.output_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def features(self, fold: ClassFold) -> FoldFeatures:
        """The fold's cached features, after training its trunk if it has none yet."""
        with self._locked():
            return self._features(fold)

    def _features(self, fold: ClassFold) -> FoldFeatures:
        config = self.trunk_config(fold)
        trunk_run, trunk_sha, state = self._trunk(config, fold)
        key = {"trunk_sha256": trunk_sha, "dataset_hash": self.dataset_hash}
        loaded = self._loaded.get(fold.index)
        if loaded is not None and loaded[0] == key:
            return loaded[1]
        path = feature_file(self.output_dir, fold.index)
        payload = torch.load(path, map_location="cpu", weights_only=True) if path.is_file() else None
        if payload is None or payload.get("key") != key:
            payload = self._extract(config, state() if state is not None else None, key)
            path.parent.mkdir(parents=True, exist_ok=True)
            files.atomic_torch_save(path, payload)
        source = {"trunk_run": trunk_run, "features": str(path), "trunk_sha256": trunk_sha}
        features = FoldFeatures(payload["train"], payload["train_labels"], payload["validation"],
                                payload["validation_labels"], source, key["dataset_hash"],
                                payload.get("unreadable_images"))
        self._loaded[fold.index] = (key, features)
        return features

    def _trunk(self, config: config_module.Config, fold: ClassFold) -> tuple[str | None, str, Any]:
        """``(trunk run directory or None, trunk sha256, loader of the model state or None)``."""
        pretrained = config.model.pretrained
        if pretrained:
            if isinstance(pretrained, str):
                return None, file_sha256(Path(pretrained)), None
            buffer = io.BytesIO()
            torch.save(build_model(config).trunk.state_dict(), buffer)  # type: ignore[union-attr]
            return None, hashlib.sha256(buffer.getvalue()).hexdigest(), None
        run_dir = fold_dir(trunks_dir(self.output_dir), fold.index)
        if self.progress:
            print(f"== frozen trunk of fold {fold.index}: {run_dir}", flush=True)
        train_or_resume(config, run_dir, progress=self.progress, record={"stage": TRUNK_STAGE, "fold": fold.index},
                        placement=self.placement)
        checkpoint = run_dir / records.BEST_CHECKPOINT
        remedy = f"delete {run_dir} to train this fold's trunk again"
        return str(run_dir), file_sha256(checkpoint), lambda: files.load_checkpoint(checkpoint, remedy)["model"]

    def _extract(self, config: config_module.Config, state: Mapping[str, torch.Tensor] | None, key: dict[str, str]) -> dict[str, Any]:
        dataset = load_dataset(config)
        view, splits = training_view(dataset, make_splits(config, dataset, test=False))
        train, validation = view.subset(splits.train), view.subset(splits.validation)
        device = self.placement.device(config.training.device)
        return {
            "key": key,
            "train": trunk_features(config, state, train, device), "train_labels": torch.as_tensor(train.labels),
            "validation": trunk_features(config, state, validation, device), "validation_labels": torch.as_tensor(validation.labels),
            # Left out of both splits by make_splits; each head run records it as a full run does.
            "unreadable_images": len(dataset.metadata.get("unreadable_items", [])),
        }
