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
    handlers, a pending signal): the next test in the process would see Ctrl-C swallowed.

    The SIGINT handler is compared with the one the test started with, not with Python's default: a
    suite started in the background by a non-interactive shell inherits SIGINT ignored, and
    ``signals_deferred`` leaves an ignored SIGINT alone (only Python's default is swapped for the stop
    handler, which stays)."""
    import signal

    from dmlbench import files

    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    left = {"deferred": files._deferred, "one_stop": files._one_stop, "pending": files._pending,
            "SIGINT handler": after, "SIGINT handler before": before}
    handler_kept = after is before or (before is signal.default_int_handler and after is files._on_signal)
    assert (files._deferred == 0 and not files._one_stop and files._pending is None
            and handler_kept), f"stop state left: {left}"
