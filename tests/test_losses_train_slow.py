"""Every registered loss trains the default model on glyphs without NaN and beats the untrained model
on validation MAP@R (issue 3). Slow: run with ``python -m pytest -m slow``."""

from pathlib import Path

import pytest

from dmlbench import config as config_module
from dmlbench.losses import LOSSES
from dmlbench.registry import accepted_parameters
from dmlbench.training import records, train

ALIASES = {"nt_xent", "info_nce"}
SETUP = [
    "data.options={max_classes: 120, augmentations_per_font: 1, image_size: 24}",
    "model.embedding_dim=32",
    "model.options={width: 16}",
    "training.epochs=5",
    "training.batch_size=64",
    "sampler.params={samples_per_class: 4}",
    "optimizer.loss_lr=0.01",
    "evaluation.metrics=[precision_at_1, map_at_r]",
]
TUPLE_MINER = {"triplet": "semihard", "margin": "distance_weighted", "contrastive": "distance_weighted",
               "quadruplet": "distance_weighted", "snr": "distance_weighted"}


@pytest.mark.slow
@pytest.mark.parametrize("loss_name", [name for name in LOSSES.names() if name not in ALIASES])
def test_loss_trains_and_improves_validation_map_at_r(loss_name: str, tmp_path: Path) -> None:
    overrides = [*SETUP, f"loss.name={loss_name}"]
    if loss_name in TUPLE_MINER:
        overrides.append(f"miner.name={TUPLE_MINER[loss_name]}")
    if "num_learners" in (accepted_parameters(LOSSES.get(loss_name)) or set()):
        overrides.append("loss.params={num_learners: 4, num_meta_classes: 8}")
    result = train(config_module.load(None, overrides), tmp_path / loss_name, progress=False)
    history = records.read_metrics(result.run_dir)
    assert all(entry.get("loss") is None or entry["loss"] == entry["loss"] for entry in history)
    untrained = history[0]["validation"]["map_at_r"]
    assert result.best_validation is not None
    assert result.best_validation["map_at_r"] > untrained, history
