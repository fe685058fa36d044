"""Many workers on one benchmark: PostgreSQL (real server, from ``.ci/run``), ``--jobs``, ``status``,
the dashboard, credentials and bad storage input."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from cli_runner import run_cli
from test_cli_process import console_script

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "configs" / "smoke.yaml"
POSTGRES_ENV = "DMLBENCH_TEST_POSTGRES_URL"


def run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([console_script(), *args], capture_output=True, text=True, timeout=300, cwd=REPO, **kwargs)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke benchmark run by one worker on the default SQLite storage."""
    output = tmp_path_factory.mktemp("reference") / "out"
    result = run(["benchmark", str(SMOKE), "-o", str(output), "-q"])
    assert result.returncode == 0, result.stderr[-3000:]
    return output


@pytest.fixture
def postgres_url() -> str:
    """A fresh database on the test server (``.ci/run`` starts one and exports its URL), dropped afterwards."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"no PostgreSQL server: {POSTGRES_ENV} is not set (.ci/run starts one)")
    import sqlalchemy

    admin = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        connection = admin.connect()
    except sqlalchemy.exc.OperationalError as error:
        pytest.skip(f"PostgreSQL server at {url} is not reachable: {str(error.orig).strip().splitlines()[-1]}")
    name = f"dmlbench_{uuid.uuid4().hex[:10]}"
    connection.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    base = url.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    connection.execute(sqlalchemy.text(f"DROP DATABASE {name} WITH (FORCE)"))
    connection.close()
    admin.dispose()


def studies(url: str) -> dict[str, optuna.Study]:
    storage = optuna.storages.RDBStorage(url)
    return {s.study_name: optuna.load_study(study_name=s.study_name, storage=storage)
            for s in optuna.get_all_study_summaries(storage)}


def running_trial_of(url: str, pid: int) -> bool:
    try:
        found = studies(url)
    except Exception:  # tables not created yet
        return False
    return any(t.state == TrialState.RUNNING and (t.user_attrs.get("worker") or {}).get("pid") == pid
               for study in found.values() for t in study.get_trials(deepcopy=False))


def test_three_workers_on_postgres_one_killed_mid_trial_give_the_single_worker_results(
    reference: Path, postgres_url: str, tmp_path: Path
) -> None:
    output = tmp_path / "out"
    command = [console_script(), "benchmark", str(SMOKE), "-o", str(output), "-q", "--storage", postgres_url,
               "--heartbeat", "1"]
    workers = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
               for _ in range(3)]
    victim = workers[0]
    deadline = time.monotonic() + 120
    while not running_trial_of(postgres_url, victim.pid):
        assert victim.poll() is None, "the worker finished before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    outputs = [worker.communicate(timeout=300) for worker in workers[1:]]
    for worker, (_, err) in zip(workers[1:], outputs):
        assert worker.returncode == 0, err[-3000:]
    # Exactly one survivor wrote the report; the other found nothing left.
    assert sorted("nothing left to do" in err for _, err in outputs) == [False, True]

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
    late = run(["benchmark", str(SMOKE), "-o", str(output), "-q"])
    assert late.returncode == 0 and "nothing left to do" in late.stderr + late.stdout


def test_status_counts_every_method(reference: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["status", str(reference)], capsys)
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] in (["triplet_semihard"], ["normalized_softmax"])}
    assert rows["triplet_semihard"][1:] == ["2", "0", "0", "0", "2/2"]
    assert rows["normalized_softmax"][1:] == ["2", "0", "0", "0", "2/2"]
    assert "untrained baseline: 2/2 scored" in out


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


def test_a_password_is_never_stored_and_another_config_is_refused(postgres_url: str, tmp_path: Path) -> None:
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
    spec["protocol"].update(trials=1, reproductions=1)
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
    other = run(["benchmark", str(small), "training.max_steps_per_epoch=3", "-o", str(tmp_path / "other"),
                 "--storage", with_password])
    assert other.returncode == 2 and len(other.stderr.strip().splitlines()) == 1, other.stderr
    assert "another config" in other.stderr and secret not in other.stderr
    assert {name: len(study.trials) for name, study in studies(with_password).items()} == before
    assert not (tmp_path / "other").exists()
    # A wrong password: one line naming the reason, without either password.
    wrong = run(["benchmark", str(small), "-o", str(tmp_path / "wrong"), "--storage",
                 f"postgresql://{role}:not-{secret}@{host}"], env={**os.environ, "PGPASSWORD": ""})
    assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr
    assert "password authentication failed" in wrong.stderr and secret not in wrong.stderr
    assert not (tmp_path / "wrong").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--storage", "mysql://user@host/db"], "unsupported kind of storage URL"),
        (["--jobs", "0"], "--jobs must be a positive integer"),
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
