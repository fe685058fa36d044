"""Many workers on one benchmark: PostgreSQL (real server, from ``.ci/run``), ``--jobs``, ``status``,
the dashboard, credentials and bad storage input."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from cli_runner import cli_exit_code, run_cli, run_in_process
from test_cli_process import console_script

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "configs" / "smoke.yaml"
POSTGRES_ENV = "DMLBENCH_TEST_POSTGRES_URL"


def run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([console_script(), *args], capture_output=True, text=True, timeout=300, cwd=REPO, **kwargs)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke benchmark run by one worker on the default SQLite storage (this test process)."""
    output = tmp_path_factory.mktemp("reference") / "out"
    assert cli_exit_code(["benchmark", str(SMOKE), "-o", str(output), "-q"]) == 0
    return output


@pytest.fixture
def new_database() -> Iterator[Callable[[], str]]:
    """Makes fresh, empty databases on the test server (``.ci/run`` starts one and exports its URL);
    all are dropped afterwards."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"no PostgreSQL server: {POSTGRES_ENV} is not set (.ci/run starts one)")
    import sqlalchemy

    admin = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        connection = admin.connect()
    except sqlalchemy.exc.OperationalError as error:
        pytest.skip(f"PostgreSQL server at {url} is not reachable: {str(error.orig).strip().splitlines()[-1]}")
    names: list[str] = []

    def create() -> str:
        names.append(f"dmlbench_{uuid.uuid4().hex[:10]}")
        connection.execute(sqlalchemy.text(f"CREATE DATABASE {names[-1]}"))
        return f"{url.rsplit('/', 1)[0]}/{names[-1]}"

    yield create
    for name in names:
        connection.execute(sqlalchemy.text(f"DROP DATABASE {name} WITH (FORCE)"))
    connection.close()
    admin.dispose()


@pytest.fixture
def postgres_url(new_database: Callable[[], str]) -> str:
    """A fresh, empty database on the test server."""
    return new_database()


def studies(url: str) -> dict[str, optuna.Study]:
    storage = optuna.storages.RDBStorage(url)
    return {s.study_name: optuna.load_study(study_name=s.study_name, storage=storage)
            for s in optuna.get_all_study_summaries(storage)}


def worker_pids(url: str) -> set[int]:
    """The processes that have claimed a unit of work on ``url``."""
    try:
        found = studies(url)
    except Exception:  # tables not created yet
        return set()
    return {(t.user_attrs.get("worker") or {}).get("pid") for study in found.values()
            for t in study.get_trials(deepcopy=False)}


def _collect_lines(stream: IO[str], lines: list[str]) -> None:
    """Each line of ``stream`` appended to ``lines`` as it comes (read while the process runs)."""
    for line in stream:
        lines.append(line)


def _communicate(worker: subprocess.Popen, timeout: float = 300) -> tuple[str, str]:
    try:
        return worker.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        worker.kill()
        out, err = worker.communicate()
        pytest.fail(f"worker {worker.pid} did not finish in {timeout} s: {err[-3000:]}")


def running_pids(url: str) -> set[int]:
    """The processes that hold a RUNNING trial on ``url`` now."""
    try:
        found = studies(url)
    except Exception:  # tables not created yet
        return set()
    return {(t.user_attrs.get("worker") or {}).get("pid") for study in found.values()
            for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING}


def running_trial_of(url: str, pid: int) -> bool:
    return pid in running_pids(url)


def test_three_workers_on_postgres_one_killed_mid_trial_give_the_single_worker_results(
    reference: Path, postgres_url: str, tmp_path: Path
) -> None:
    output = tmp_path / "out"
    command = [console_script(), "benchmark", str(SMOKE), "-o", str(output), "-q", "--storage", postgres_url,
               "--heartbeat", "1"]
    workers = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
               for _ in range(3)]
    # The victim is the first worker seen inside a trial: which of the three starts first (and may take
    # every unit before a slower one has imported torch) is up to the scheduler.
    deadline = time.monotonic() + 120
    while not (running := running_pids(postgres_url) & {worker.pid for worker in workers if worker.poll() is None}):
        assert any(worker.poll() is None for worker in workers), "every worker finished before one could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    victim = next(worker for worker in workers if worker.pid == min(running))
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    survivors = [worker for worker in workers if worker is not victim]
    outputs = [worker.communicate(timeout=300) for worker in survivors]
    for worker, (_, err) in zip(survivors, outputs):
        assert worker.returncode == 0, err[-3000:]
    # Exactly one survivor wrote the report; the other found nothing left.
    assert sorted("wrote the report" in err for _, err in outputs) == [False, True]

    found = studies(postgres_url)
    interrupted = 0
    for name, study in found.items():
        trials = study.get_trials(deepcopy=False)
        finished = [t for t in trials if t.state == TrialState.COMPLETE]
        wanted = 2  # smoke: 2 trials per method, 2 reproductions per method and baseline
        assert len(finished) == wanted, name
        assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)], name
        stale = [t for t in trials if t.state == TrialState.FAIL]
        assert all("fail_reason" not in t.user_attrs for t in stale), name  # only the killed worker's trial failed
        interrupted += len(stale)
        # Nothing evaluated twice but the retried slot: each slot has one finished trial.
        assert sorted(t.user_attrs["slot"] for t in finished) == list(range(wanted)), name
        for retry in (t for t in trials if t.system_attrs.get("failed_trial") is not None or "retry_of" in t.user_attrs):
            origin = retry.system_attrs.get("failed_trial", retry.user_attrs.get("retry_of"))
            original = next(t for t in trials if t.number == origin)
            assert original.state == TrialState.FAIL and original.user_attrs["slot"] == retry.user_attrs["slot"]
            assert not original.params or original.params == retry.params
    assert interrupted == 1
    # The report equals the single worker's: the same numbers, the same structure.
    for name in ("results.csv", "runs.csv", "comparisons.csv"):
        assert (output / name).read_bytes() == (reference / name).read_bytes(), name
    structure = lambda text: [line if line.startswith("#") else line.count("|") for line in text.splitlines()]  # noqa: E731
    assert structure((output / "report.md").read_text()) == structure((reference / "report.md").read_text())
    assert "## Cost" in (output / "report.md").read_text()


# Slow (minutes on 2 cores): two workers started together on an empty journal file stay in the default
# suite (test_jobs_2_on_the_journal_file_gives_the_single_worker_results).
@pytest.mark.slow
def test_four_workers_started_together_on_an_empty_database_all_run(
    reference: Path, new_database: Callable[[], str], tmp_path: Path
) -> None:
    """A SLURM array or a Kubernetes Job with parallelism: every worker starts in the same second on
    a database that has no tables yet (three times, a new database each time)."""
    for attempt in range(3):
        url = new_database()
        output = tmp_path / f"out{attempt}"
        command = [console_script(), "benchmark", str(SMOKE), "-o", str(output), "-q", "--storage", url]
        workers = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
                   for _ in range(4)]
        outputs = [worker.communicate(timeout=300) for worker in workers]
        for worker, (_, err) in zip(workers, outputs):
            assert worker.returncode == 0 and "Traceback" not in err, f"attempt {attempt}: {err[-3000:]}"
        assert sum("wrote the report" not in err for _, err in outputs) == 1, f"attempt {attempt}"
        for name, study in studies(url).items():
            finished = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
            assert sorted(t.user_attrs["slot"] for t in finished) == [0, 1], f"attempt {attempt}: {name}"
        assert (output / "results.csv").read_bytes() == (reference / "results.csv").read_bytes(), attempt


def test_a_database_that_does_not_exist_is_one_line_exit_2(postgres_url: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    missing = postgres_url.rsplit("/", 1)[0] + "/no_such_database_here"
    result = run_in_process(["benchmark", str(SMOKE), "-o", str(tmp_path / "out"), "-q", "--storage", missing], capsys)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "no_such_database_here" in result.stderr and "does not exist" in result.stderr
    assert not (tmp_path / "out").exists()


class PrivateServer:
    """A PostgreSQL server of one test's own (trust authentication on 127.0.0.1), to stop and start."""

    def __init__(self, binaries: Path) -> None:
        self.binaries = binaries
        self.directory = Path(tempfile.mkdtemp(prefix="dmlbench-private-postgres-"))
        shutil.chown(self.directory, "postgres")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._as_postgres("initdb", "-D", str(self.directory / "data"), "-U", "postgres", "--auth=trust")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, program: str, *arguments: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", str(self.binaries / program), *arguments],
                       check=True, capture_output=True, timeout=120)

    def control(self, action: str) -> None:
        options = f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.directory}"
        self._as_postgres("pg_ctl", "-D", str(self.directory / "data"), "-w", "-m", "fast",
                          "-l", str(self.directory / "log"), "-o", options, action)


@pytest.fixture
def private_server() -> Iterator[PrivateServer]:
    control = os.environ.get("DMLBENCH_TEST_POSTGRES_CTL")
    if not control:
        pytest.skip("no PostgreSQL binaries: DMLBENCH_TEST_POSTGRES_CTL is not set (.ci/run sets it)")
    if os.geteuid() != 0:
        pytest.skip("starting a private PostgreSQL server needs root (to run it as the postgres user)")
    server = PrivateServer(Path(control).parent)
    server.control("start")
    yield server
    subprocess.run(["runuser", "-u", "postgres", "--", control, "-D", str(server.directory / "data"), "-m", "immediate",
                    "stop"], capture_output=True, timeout=60)
    shutil.rmtree(server.directory, ignore_errors=True)


def test_workers_wait_for_a_restarting_database_and_give_the_undisturbed_results(
    reference: Path, private_server: PrivateServer, tmp_path: Path
) -> None:
    postgres_url = private_server.url
    output = tmp_path / "out"
    command = [console_script(), "benchmark", str(SMOKE), "-o", str(output), "-q", "--storage", postgres_url,
               "--heartbeat", "1"]
    workers = [subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
               for _ in range(2)]
    errors: list[list[str]] = [[], []]
    readers = [threading.Thread(target=_collect_lines, args=(worker.stderr, lines), daemon=True)
               for worker, lines in zip(workers, errors)]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + 120
    # Both workers at work (a worker still starting when the server goes away stops with exit 2,
    # like any worker that cannot reach its database), one of them in the middle of a trial.
    while not (any(running_trial_of(postgres_url, worker.pid) for worker in workers)
               and all(worker.pid in worker_pids(postgres_url) for worker in workers)):
        assert all(worker.poll() is None for worker in workers) and time.monotonic() < deadline
        time.sleep(0.05)
    private_server.control("stop")
    # The outage lasts until a worker has met it and is waiting: a fixed short outage could fall
    # entirely inside a stretch of training in which neither worker's main thread touches the
    # database (the heartbeat thread only beats again), and then nothing would have been waited for.
    deadline = time.monotonic() + 240
    try:
        while not any("unreachable" in line and "retrying" in line for lines in errors for line in list(lines)):
            assert all(worker.poll() is None for worker in workers), errors
            assert time.monotonic() < deadline, "no worker met the outage in 240 s"
            time.sleep(0.05)
    finally:
        private_server.control("start")
    for worker, reader in zip(workers, readers):
        try:
            worker.wait(timeout=300)
        except subprocess.TimeoutExpired:
            worker.kill()
            pytest.fail(f"worker {worker.pid} did not finish in 300 s")
        reader.join(timeout=60)
    for worker, lines in zip(workers, errors):
        err = "".join(lines)
        assert worker.returncode == 0 and "Traceback" not in err, err[-3000:]
    for name in ("results.csv", "runs.csv"):
        assert (output / name).read_bytes() == (reference / name).read_bytes(), name


# Slow: a database restarted within the retry bound stays in the default suite.
@pytest.mark.slow
def test_a_database_away_past_the_retry_bound_stops_with_one_line_and_the_command_resumes(
    reference: Path, private_server: PrivateServer, tmp_path: Path
) -> None:
    postgres_url = private_server.url
    output = tmp_path / "out"
    command = ["benchmark", str(SMOKE), "-o", str(output), "-q", "--storage", postgres_url, "--heartbeat", "1",
               "--db-retry", "3"]
    worker = subprocess.Popen([console_script(), *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=REPO)
    deadline = time.monotonic() + 120
    while not running_trial_of(postgres_url, worker.pid):
        assert worker.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    private_server.control("stop")
    try:
        _, err = worker.communicate(timeout=120)
    finally:
        private_server.control("start")
    assert worker.returncode == 1, err
    assert "Traceback" not in err and "unreachable for 3 s" in err and "run the same command again" in err
    assert err.strip().splitlines()[-1].startswith("dmlbench: error:")
    time.sleep(3.5)  # the stopped worker's trial turns stale (3 missed heartbeats) and is retried
    resumed = run(command)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for name in ("results.csv", "runs.csv"):
        assert (output / name).read_bytes() == (reference / name).read_bytes(), name


def test_jobs_2_on_the_journal_file_gives_the_single_worker_results(reference: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "out"
    result = run(["benchmark", str(SMOKE), "-o", str(output), "-q", "--jobs", "2"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((output / "benchmark.json").read_text())["storage"].startswith("journal:///")
    for name in ("results.csv", "runs.csv"):
        assert (output / name).read_bytes() == (reference / name).read_bytes(), name
    code, out, err = run_cli(["status", str(output)], capsys)
    assert code == 0, err
    assert "time left: none" in out
    # A worker is seen once it has run a unit; on a loaded machine the first can run every unit of
    # this small protocol before the second is up, so one or two workers are seen, never more.
    assert re.search(r"workers seen in the last 5 minutes: [12] ", out), out
    code, out, err = run_cli(["audit", str(output)], capsys)
    assert code == 0, err
    # A late worker finds nothing left, says so and exits 0.
    late = run_in_process(["benchmark", str(SMOKE), "-o", str(output), "-q"], capsys)
    assert late.returncode == 0 and "wrote the report" in late.stderr + late.stdout


def test_status_counts_every_method(reference: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["status", str(reference)], capsys)
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] in (["triplet_semihard"], ["normalized_softmax"])}
    assert rows["triplet_semihard"][1:] == ["2", "0", "0", "0", "2/2"]
    assert rows["normalized_softmax"][1:] == ["2", "0", "0", "0", "2/2"]
    assert "untrained baseline: 2/2 scored" in out


def test_status_counts_a_failed_reproduction_as_failed_not_done(reference: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A reproduction or baseline scoring that failed is finished without a score: status once showed it
    as 2/2 (and "2/2 scored") with "every ... reproduction is done"."""
    import sqlite3

    copy = tmp_path / "copy"
    shutil.copytree(reference, copy, ignore=shutil.ignore_patterns("*.pt"))
    with sqlite3.connect(copy / "study.db") as connection:
        for study in ("reproductions:triplet_semihard", "reproductions:untrained"):
            (trial_id,) = connection.execute(
                "SELECT trial_id FROM trials JOIN studies USING (study_id) WHERE study_name = ? AND number = 1",
                (study,)).fetchone()
            connection.execute("UPDATE trials SET state = 'FAIL' WHERE trial_id = ?", (trial_id,))
            connection.execute("INSERT INTO trial_user_attributes (trial_id, key, value_json) VALUES (?, 'fail_reason', ?)",
                               (trial_id, json.dumps("training diverged")))
    code, out, err = run_cli(["status", str(copy)], capsys)
    assert code == 0, err
    assert [line.split()[1:] for line in out.splitlines() if line.startswith("triplet_semihard ")] == [
        ["2", "0", "0", "0", "2/2", "(1", "failed)"]]
    assert "untrained baseline: 1/2 scored, 1 failed" in out
    assert out.splitlines()[-1] == ("time left: none, every search trial and reproduction is done; 2 reproduction(s) "
                                    "failed: once the cause is fixed, `dmlbench benchmark --retry-failed` runs them again")
    # A baseline scoring not yet done is work left (status once said "none" while a baseline was scoring).
    with sqlite3.connect(copy / "study.db") as connection:
        connection.execute("DELETE FROM trials WHERE number = 0 AND study_id = "
                           "(SELECT study_id FROM studies WHERE study_name = 'reproductions:untrained')")
    code, out, err = run_cli(["status", str(copy)], capsys)
    assert code == 0 and "untrained baseline: 0/2 scored, 1 failed" in out, err
    assert out.splitlines()[-1].startswith("time left: about") and "(estimate: 1 units left x mean" in out


def test_status_counts_the_reproductions_of_methods_still_searching(reference: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Before a method's search ends its reproduction stage is not stored; the time left must still
    count it (it once said "none, every search trial and reproduction is done")."""
    copy = tmp_path / "copy"
    shutil.copytree(reference, copy)
    storage = f"sqlite:///{copy.resolve() / 'study.db'}"
    optuna.delete_study(study_name="reproductions:triplet_semihard", storage=storage)
    code, out, err = run_cli(["status", str(copy)], capsys)
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] in (["triplet_semihard"], ["normalized_softmax"])}
    assert rows["triplet_semihard"][1:] == ["2", "0", "0", "0", "0/2"] and rows["normalized_softmax"][-1] == "2/2"
    assert "(estimate: 2 units left x mean" in out and "time left: none" not in out
    # --storage alone: the stages already started say how many reproductions every method gets.
    code, out, err = run_cli(["status", "--storage", storage], capsys)
    assert code == 0 and "0/2" in out and "(estimate: 2 units left x mean" in out, err
    for name in ("reproductions:normalized_softmax", "reproductions:untrained"):
        optuna.delete_study(study_name=name, storage=storage)
    code, out, err = run_cli(["status", "--storage", storage], capsys)
    assert code == 0 and "the reproductions of 2 method(s) not counted" in out and "time left: none" not in out, err


def test_a_copied_or_moved_benchmark_directory_keeps_its_own_studies(reference: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """benchmark.json records its default storage file with the path the benchmark started in: a copy
    once read and resumed into the original's studies, and a moved directory could not be read."""
    copy = tmp_path / "copy"
    shutil.copytree(reference, copy)
    original = (reference / "study.db").read_bytes()
    optuna.delete_study(study_name="reproductions:triplet_semihard", storage=f"sqlite:///{copy / 'study.db'}")
    code, out, err = run_cli(["status", str(copy)], capsys)
    assert code == 0, err
    assert out.splitlines()[0] == f"storage sqlite:///{copy.resolve() / 'study.db'}"
    assert [line.split()[1:] for line in out.splitlines() if line.startswith("triplet_semihard ")] == [["2", "0", "0", "0", "0/2"]]
    for name in ("report.md", "results.csv", "runs.csv"):  # written again once the reproductions are
        (copy / name).unlink()
    resumed = run_in_process(["benchmark", str(SMOKE), "-o", str(copy), "-q"], capsys)
    assert resumed.returncode == 0, resumed.stderr
    assert (reference / "study.db").read_bytes() == original
    rerun = optuna.load_study(study_name="reproductions:triplet_semihard", storage=f"sqlite:///{copy / 'study.db'}")
    assert [trial.state for trial in rerun.trials] == [TrialState.COMPLETE] * 2
    for name in ("results.csv", "runs.csv"):
        assert (copy / name).read_bytes() == (reference / name).read_bytes(), name
    # On another machine: the path it recorded does not exist there.
    record = json.loads((copy / "benchmark.json").read_text())
    record["storage"] = "sqlite:////no-such-machine/runs/out/study.db"
    (copy / "benchmark.json").write_text(json.dumps(record))
    moved = copy.rename(tmp_path / "moved")
    code, out, err = run_cli(["report", str(moved), "-o", str(tmp_path / "report"), "-q"], capsys)
    assert code == 0, err
    assert (tmp_path / "report" / "results.csv").read_bytes() == (reference / "results.csv").read_bytes()
    code, out, err = run_cli(["audit", str(moved)], capsys)
    assert code == 0, err


def test_a_damaged_run_record_fails_its_unit_in_one_line(reference: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A reproduction whose fold run.json is cut short fails with a line naming the file and what to do (it
    once ended the benchmark with a traceback); deleted, the run trains again under --retry-failed."""
    copy = tmp_path / "copy"
    shutil.copytree(reference, copy)
    optuna.delete_study(study_name="reproductions:triplet_semihard", storage=f"sqlite:///{copy / 'study.db'}")
    run_file = copy / "triplet_semihard" / "reproduction_00" / "fold_0" / "run.json"
    run_file.write_text(run_file.read_text()[:60])
    (copy / "report.md").unlink()
    failed = run_in_process(["benchmark", str(SMOKE), "-o", str(copy), "-q"], capsys)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr
    assert f"reproduction 0: UserInputError: {run_file} is damaged" in failed.stderr
    assert f"delete {run_file.parent} to train the run again" in failed.stderr
    shutil.rmtree(run_file.parent)
    retried = run_in_process(["benchmark", str(SMOKE), "-o", str(copy), "-q", "--retry-failed"], capsys)
    assert retried.returncode == 0, retried.stderr
    assert (copy / "results.csv").read_bytes() == (reference / "results.csv").read_bytes()


def _on_a_journal(reference: Path, copy: Path) -> Path:
    """A copy of the reference benchmark whose studies live in a journal file, as ``--jobs N`` keeps them."""
    shutil.copytree(reference, copy)
    journal = copy / "study.journal"
    target = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    for name in optuna.get_all_study_names(f"sqlite:///{copy / 'study.db'}"):
        optuna.copy_study(from_study_name=name, from_storage=f"sqlite:///{copy / 'study.db'}", to_storage=target)
    (copy / "study.db").unlink()
    record = json.loads((copy / "benchmark.json").read_text())
    record["storage"] = f"journal:///{journal}"
    (copy / "benchmark.json").write_text(json.dumps(record))
    return journal


def _garbage_line(path: Path) -> None:
    lines = path.read_bytes().split(b"\n")
    lines[len(lines) // 2] = b'{"op_code": 5, "worker_id'
    path.write_bytes(b"\n".join(lines))


def _cut_in_half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(("kind", "damage", "message"), [
    ("sqlite", _cut_in_half, "not a readable SQLite database (database disk image is malformed)"),
    ("sqlite", lambda path: path.write_bytes(b"not a database" * 100), "not a readable SQLite database (file is not a database)"),
    ("journal", _garbage_line, "is not a journal record, so the studies cannot be read past it; restore the file from a copy"),
], ids=["sqlite-cut", "sqlite-overwritten", "journal-garbage-line"])
def test_a_damaged_study_file_is_one_line_and_left_as_it_was(kind: str, damage: Callable[[Path], None], message: str,
                                                            reference: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A study file cut short or overwritten (a full disk, a bad copy) once ended status, report, audit and a
    resumed benchmark with SQLAlchemy's or Optuna's traceback."""
    copy = tmp_path / "copy"
    if kind == "sqlite":
        shutil.copytree(reference, copy)
        storage = copy / "study.db"
    else:
        storage = _on_a_journal(reference, copy)
    damage(storage)
    damaged = storage.read_bytes()
    for argv in (["status", str(copy)], ["audit", str(copy)], ["report", str(copy), "-o", str(tmp_path / "report"), "-q"],
                 ["benchmark", str(SMOKE), "-o", str(copy), "-q"]):
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
        assert f"storage {storage}: " in err and message in err, (argv, err)
        assert storage.read_bytes() == damaged, argv
    assert not (tmp_path / "report").exists()


def test_a_journal_whose_last_line_is_cut_short_is_one_line_and_resumes_once_cut(reference: Path, tmp_path: Path,
                                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A last record cut short (a full disk, a killed write) is skipped by Optuna's reader, but the next record
    appended would join it into a line that nothing can read past: nothing is written until it is cut off,
    and cut off as the message says, the benchmark finishes with the undamaged run's results."""
    copy = tmp_path / "copy"
    journal = _on_a_journal(reference, copy)
    code, whole_status, err = run_cli(["status", str(copy)], capsys)
    assert code == 0, err
    whole = journal.stat().st_size
    with open(journal, "ab") as handle:
        handle.write(b'{"op_code": 6, "worker_id": "vm:1", "trial_id": 3, "st')
    damaged = journal.read_bytes()
    for argv in (["status", str(copy)], ["benchmark", str(SMOKE), "-o", str(copy), "-q"]):
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
        assert f"cut it off with `truncate -s {whole} {journal}`" in err, err
        assert journal.read_bytes() == damaged
    assert subprocess.run(["truncate", "-s", str(whole), str(journal)]).returncode == 0
    code, out, err = run_cli(["status", str(copy)], capsys)
    assert (code, out) == (0, whole_status), err
    for name in ("report.md", "results.csv", "runs.csv"):
        (copy / name).unlink()
    resumed = run_in_process(["benchmark", str(SMOKE), "-o", str(copy), "-q"], capsys)
    assert resumed.returncode == 0, resumed.stderr
    for name in ("results.csv", "runs.csv"):
        assert (copy / name).read_bytes() == (reference / name).read_bytes(), name


def test_the_dashboard_serves_the_smoke_study(reference: Path) -> None:
    dashboard = Path(sys.executable).parent / "optuna-dashboard"
    if not dashboard.is_file():
        pytest.fail("optuna-dashboard is not installed: python -m pip install -e '.[test]'")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([str(dashboard), f"sqlite:///{reference / 'study.db'}", "--host", "127.0.0.1",
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/dashboard", timeout=5).read().decode()
                listing = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5).read())
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the dashboard did not start"
                time.sleep(0.3)
        assert "<html" in page.lower()
        names = {study["study_name"] for study in listing["study_summaries"]}
        assert {"triplet_semihard", "normalized_softmax", "reproductions:triplet_semihard"} <= names
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_password_is_never_stored_and_another_config_is_refused(postgres_url: str, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlalchemy

    secret = f"planted-{uuid.uuid4().hex[:12]}"
    role = f"worker_{uuid.uuid4().hex[:6]}"
    database = postgres_url.rsplit("/", 1)[1]
    engine = sqlalchemy.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(sqlalchemy.text(f"CREATE ROLE {role} LOGIN PASSWORD '{secret}'"))
        connection.execute(sqlalchemy.text(f"ALTER DATABASE {database} OWNER TO {role}"))
        connection.execute(sqlalchemy.text(f"GRANT ALL ON SCHEMA public TO {role}"))
    engine.dispose()
    host = postgres_url.split("@", 1)[1]
    with_password = f"postgresql://{role}:{secret}@{host}"
    spec = yaml.safe_load(SMOKE.read_text())
    spec["protocol"].update(trials=1, reproductions=2)
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump(spec))
    output = tmp_path / "out"
    result = run(["benchmark", str(small), "-o", str(output), "--storage", with_password, "--jobs", "2"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert secret not in result.stdout + result.stderr
    files = [path for path in output.rglob("*") if path.is_file()]
    assert len(files) > 20
    assert [path for path in files if secret.encode() in path.read_bytes()] == []
    assert json.loads((output / "benchmark.json").read_text())["storage"] == f"postgresql://{role}@{host}"
    dumped = json.dumps([[study.user_attrs, [(t.user_attrs, t.system_attrs) for t in study.get_trials()]]
                         for study in studies(with_password).values()], default=str)
    assert secret not in dumped and "workers" not in dumped  # no stray keys either
    # The same storage with another config: one line, exit 2, nothing stored changes.
    before = {name: len(study.trials) for name, study in studies(with_password).items()}
    other = run_in_process(["benchmark", str(small), "training.max_steps_per_epoch=3", "-o", str(tmp_path / "other"),
                            "--storage", with_password], capsys)
    assert other.returncode == 2 and len(other.stderr.strip().splitlines()) == 1, other.stderr
    assert "another config" in other.stderr and secret not in other.stderr
    assert {name: len(study.trials) for name, study in studies(with_password).items()} == before
    assert not (tmp_path / "other").exists()
    # A wrong password: one line naming the reason, without either password.
    monkeypatch.setenv("PGPASSWORD", "")  # the test server's password must not stand in for the wrong one
    wrong = run_in_process(["benchmark", str(small), "-o", str(tmp_path / "wrong"), "--storage",
                            f"postgresql://{role}:not-{secret}@{host}"], capsys)
    assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr
    assert "password authentication failed" in wrong.stderr and secret not in wrong.stderr
    assert not (tmp_path / "wrong").exists()


# Slow (a benchmark by two more processes): on a machine of two or more cores --jobs auto runs the
# journal workers that test_jobs_2_on_the_journal_file_gives_the_single_worker_results runs in the
# default suite, and test_auto_jobs_fills_the_cores_at_the_runs_thread_count checks the number it picks.
@pytest.mark.slow
def test_jobs_auto_gives_the_single_worker_results(reference: Path, tmp_path: Path) -> None:
    # The smoke config pins one thread per run, so any number of workers gives the reference's bytes.
    output = tmp_path / "out"
    result = run(["benchmark", str(SMOKE), "-o", str(output), "-q", "--jobs", "auto"])
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("results.csv", "runs.csv"):
        assert (output / name).read_bytes() == (reference / name).read_bytes(), name
    expected = "journal:///" if len(os.sched_getaffinity(0)) > 1 else "sqlite:///"
    assert json.loads((output / "benchmark.json").read_text())["storage"].startswith(expected)


def test_jobs_auto_on_a_sqlite_benchmark_goes_on_with_one_worker(reference: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # A benchmark stored in SQLite (one worker's default) goes on with one worker, not an error.
    stored = tmp_path / "sqlite"
    shutil.copytree(reference, stored)
    again = run_in_process(["benchmark", str(SMOKE), "-o", str(stored), "--jobs", "auto"], capsys)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "--jobs auto: 1 worker process(es)" in again.stderr


@pytest.mark.parametrize(
    ("cores", "omp", "threads_override", "expected"),
    [
        (16, None, [], 2),  # smoke pins 1 thread: capped by 2 methods, a trial's folds in one worker
        (3, None, [], 2),
        (1, None, [], 1),
        (16, None, ["training.num_threads=auto"], 2),
        (16, "8", ["training.num_threads=auto"], 2),  # OMP_NUM_THREADS pins the threads of an auto run
        (6, None, ["training.num_threads=3"], 2),
        (2, None, ["training.num_threads=4"], 1),
        (16, None, ["protocol.parallel_trials=2"], 4),
        (16, None, ["protocol.fold_units=true"], 4),  # 2 methods x 2 folds, each fold a unit
        (3, None, ["protocol.fold_units=true"], 3),
        (16, None, ["protocol.fold_units=true", "protocol.parallel_trials=2"], 8),
        (16, None, ["protocol.search_repeats=3"], 6),  # every repeated search is a study of its own
        (16, None, ["protocol.search_repeats=3", "protocol.search_repeat_methods=[triplet_semihard]"], 4),
    ],
)
def test_auto_jobs_fills_the_cores_at_the_runs_thread_count(cores: int, omp: str | None, threads_override: list[str],
                                                            expected: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from dmlbench.protocol.design.benchmark import apply_spec_overrides, load_spec
    from dmlbench.protocol.design.workers import auto_jobs
    from dmlbench.protocol.design.plan import MethodPlan
    from dmlbench.training import threads

    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    monkeypatch.setattr(threads, "available_cores", lambda: cores)
    spec, overrides = apply_spec_overrides(load_spec(SMOKE), threads_override)
    plans = {method.name: MethodPlan.build(spec, method.name, overrides) for method in spec.methods}
    assert auto_jobs(spec, plans) == expected


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--storage", "mysql://user@host/db"], "unsupported kind of storage URL"),
        (["--jobs", "0"], "--jobs must be a positive integer or auto"),
        (["--jobs", "many"], "--jobs must be a positive integer or auto, got 'many'"),
        (["--jobs", "2", "--storage", "sqlite:///{tmp}/x.db"], "SQLite is not safe for 2 concurrent workers"),
        (["--storage", "postgresql://someone:hunter2@127.0.0.1:1/none"], "cannot be reached"),
    ],
)
def test_bad_storage_input_is_one_line_exit_2(extra: list[str], message: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    extra = [part.replace("{tmp}", str(tmp_path)) for part in extra]
    code, _, err = run_cli(["benchmark", str(SMOKE), "-o", str(tmp_path / "out"), "-q", *extra], capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert "hunter2" not in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "x.db").exists()


def test_dry_run_counts_runs_and_epochs_and_stores_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["benchmark", str(SMOKE), "-o", str(tmp_path / "out"), "--dry-run"], capsys)
    assert code == 0, err
    assert "2 methods x (2 search trials + 2 reproductions) x 2 folds = 16 training runs" in out
    assert "16 epochs of 5 steps" in out and "estimate" in out
    assert not (tmp_path / "out").exists()


def test_a_resumed_benchmark_trains_with_the_threads_it_started_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A run's last digits depend on its torch thread count, and `auto` gives a worker its share of the
    cores: a benchmark started with one thread per worker and resumed where `auto` gives two (another
    --jobs, another OMP_NUM_THREADS) trains with the one recorded in benchmark.json; a new one with two."""
    from dmlbench.protocol.design.benchmark import apply_spec_overrides, load_spec
    from dmlbench.protocol.design.benchmark_file import read_benchmark
    from dmlbench.protocol.design.prepare import prepare
    from dmlbench.protocol.run.record import write_benchmark_file

    small = ["training.num_threads=auto", "protocol.trials=1"]

    def threads_of(output: Path) -> set[int]:
        return {json.loads(path.read_text())["num_threads"] for path in output.rglob("run.json")}

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    spec, overrides = apply_spec_overrides(load_spec(SMOKE), small)
    started = tmp_path / "started"
    assert write_benchmark_file(prepare(spec, started, overrides)).threads_per_worker == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    for output in (started, tmp_path / "new"):
        result = run_in_process(["benchmark", str(SMOKE), *small, "-o", str(output), "-q"], capsys)
        assert result.returncode == 0, result.stderr[-3000:]
    assert threads_of(started) == {1} and read_benchmark(started).threads_per_worker == 1
    assert threads_of(tmp_path / "new") == {2} and read_benchmark(tmp_path / "new").threads_per_worker == 2
    # a config that sets the count records it: auto's share would misstate what its runs train with
    assert write_benchmark_file(prepare(load_spec(SMOKE), tmp_path / "pinned")).threads_per_worker == 1
