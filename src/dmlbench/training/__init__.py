"""Training: the loop, optimiser groups, checkpoints and resumption, run records."""

from dmlbench.training.loop import train, train_or_resume
from dmlbench.training.run_evaluation import evaluate_run
from dmlbench.training.step import TrainingDiverged, TrainResult

__all__ = ["TrainResult", "TrainingDiverged", "evaluate_run", "train", "train_or_resume"]
