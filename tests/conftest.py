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


@pytest.fixture(autouse=True)
def _no_stop_state_left_behind() -> None:
    """A test may not leave ``files``' stop-signal state behind (an open deferral, the command line's
    handlers, a pending signal): the next test in the process would see Ctrl-C swallowed."""
    import signal

    from dmlbench import files

    yield
    left = {"deferred": files._deferred, "one_stop": files._one_stop, "pending": files._pending,
            "SIGINT handler": signal.getsignal(signal.SIGINT)}
    assert (files._deferred == 0 and not files._one_stop and files._pending is None
            and left["SIGINT handler"] in (signal.default_int_handler, files._on_signal)), f"stop state left: {left}"
