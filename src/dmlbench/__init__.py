"""dmlbench: train and fairly compare deep metric learning methods."""

__version__ = "0.1.0"
