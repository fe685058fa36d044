"""Test-wide settings: a private dataset cache, two threads, no progress bars."""

import os

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["DMLBENCH_CACHE"] = str(tmp_path_factory.mktemp("dmlbench-cache"))


torch.set_num_threads(min(2, torch.get_num_threads()))
