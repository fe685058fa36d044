"""A tiny but complete training setup shared by the training, CLI and benchmark tests."""

TINY = [
    "data.options={max_classes: 40, augmentations_per_font: 0, image_size: 16}",
    "model.embedding_dim=16",
    "model.options={width: 8}",
    "training.epochs=2",
    "training.batch_size=32",
    "evaluation.metrics=[precision_at_1, map_at_r]",
]
