"""Datasets built by name: in-memory ``ImageDataset``s (glyphs, emoji) and file-backed ``FileDataset``s
(cub200, cars196, sop, inshop, folder, csv; ``data/formats.py``), and their class-disjoint splits.

``build("glyphs", seed=0)`` returns the built-in dataset; ``splits`` cuts index arrays by class;
``check.summarize`` reports on a dataset and its splits.
"""

from dmlbench.data import emoji as emoji  # noqa: F401  (importing registers "emoji")
from dmlbench.data import formats as formats  # noqa: F401  (importing registers the file formats)
from dmlbench.data import glyphs as glyphs  # noqa: F401  (importing registers "glyphs")
from dmlbench.data.base import (
    DATASETS,
    DatasetSource,
    ImageDataset,
    build,
    content_hash,
    dataset_source,
    register_dataset,
    rooted_datasets,
)
from dmlbench.data.splits import Fold, carve_validation, class_disjoint_folds, train_test_split

__all__ = [
    "DATASETS",
    "DatasetSource",
    "Fold",
    "ImageDataset",
    "build",
    "carve_validation",
    "class_disjoint_folds",
    "content_hash",
    "dataset_source",
    "register_dataset",
    "rooted_datasets",
    "train_test_split",
]
