"""Training: the loop, optimiser groups, checkpoints and resumption, run records."""

from dmlbench.training.loop import TrainingDiverged, TrainResult, train
from dmlbench.training.runs import evaluate_run

__all__ = ["TrainResult", "TrainingDiverged", "evaluate_run", "train"]
