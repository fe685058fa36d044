"""Test-wide settings: a private dataset cache and one torch thread per test process (run the suite
with ``-n 2`` to use both cores; small tensor operations are slower, not faster, with more threads)."""

import os

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["DMLBENCH_CACHE"] = str(tmp_path_factory.mktemp("dmlbench-cache"))


torch.set_num_threads(1)
# training.num_threads: auto reads OMP_NUM_THREADS first: runs in the tests, and the command-line
# subprocesses they start, keep one thread each beside the other pytest worker.
os.environ["OMP_NUM_THREADS"] = "1"
