"""training.num_threads: a fixed number, or auto: a benchmark's recorded count, OMP_NUM_THREADS, else this worker's
share of the cores (``Placement.threads``)."""

import os
from pathlib import Path

import pytest

from dmlbench.training import threads
from dmlbench.training.placement import STANDALONE, Placement


@pytest.fixture
def eight_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(threads, "CGROUP_ROOT", Path("/nonexistent-cgroup"))


def test_a_number_is_used_as_given(eight_cores: None) -> None:
    assert STANDALONE.threads(3) == Placement(worker=0, workers=4, recorded_threads=2).threads("3") == 3


@pytest.mark.parametrize(("jobs", "expected"), [(1, 8), (2, 4), (3, 2), (16, 1)])
def test_auto_divides_the_cores_among_the_jobs(eight_cores: None, jobs: int, expected: int) -> None:
    assert Placement(worker=0, workers=jobs).threads("auto") == expected


def test_auto_is_the_count_a_benchmark_recorded_whatever_the_workers(eight_cores: None) -> None:
    assert Placement(worker=1, workers=4, recorded_threads=3).threads("auto") == 3
    assert Placement(worker=1, workers=4).with_recorded_threads(3) == Placement(worker=1, workers=4, recorded_threads=3)


def test_auto_honours_omp_num_threads(eight_cores: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert STANDALONE.threads("auto") == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # set but empty: ignored
    assert STANDALONE.threads("auto") == 8


@pytest.mark.parametrize(("files", "expected"), [
    ({"cpu.max": "250000 100000\n"}, 3),
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),
])
def test_cgroup_quota_v2_and_v1(tmp_path: Path, files: dict[str, str], expected: int | None) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert threads.cgroup_quota(tmp_path) == expected


def test_a_cgroup_quota_caps_the_affinity(eight_cores: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    monkeypatch.setattr(threads, "CGROUP_ROOT", tmp_path)
    assert threads.available_cores() == 2
    assert STANDALONE.threads("auto") == 2


@pytest.mark.parametrize(("chosen", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_commands_wait_passively_unless_the_user_chose_a_policy(
    monkeypatch: pytest.MonkeyPatch, chosen: str | None, expected: str
) -> None:
    """Spinning OpenMP waits took 5x longer per step beside another job (benchmarks/oversubscription.py)."""
    from dmlbench import cli

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    if chosen is not None:
        monkeypatch.setenv("OMP_WAIT_POLICY", chosen)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code in (0, None) and os.environ["OMP_WAIT_POLICY"] == expected

