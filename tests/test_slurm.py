"""``--slurm``: a benchmark's workers as a SLURM job array and a training run as a SLURM job, against a real
one-node SLURM started from Debian's packages (``slurm_cluster``), compared byte for byte with the same
work run here. The tests that wait for SLURM's requeue delay (121 s, fixed in slurmctld) are slow:
``pytest -m slow tests/test_slurm.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

import slurm_cluster
from cli_runner import run_cli
from dmlbench import slurm
from dmlbench.errors import UserInputError
from dmlbench.protocol.layout import BENCHMARK_FILE, JOURNAL_FILE, RESULTS_CSV, RUNS_CSV, SLURM_DIR, SLURM_FILE
from dmlbench.protocol.queue import storage as storage_module
from test_protocol_workers import new_database, postgres_url  # noqa: F401  fixtures: a fresh PostgreSQL database

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "configs" / "smoke.yaml"
COMPARED = (RESULTS_CSV, RUNS_CSV)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    reason = slurm_cluster.missing_reason()
    if reason is not None:
        if os.environ.get("DMLBENCH_REQUIRE_SLURM"):
            pytest.fail(f"DMLBENCH_REQUIRE_SLURM is set (as .ci/run sets it) but {reason}")
        pytest.skip(reason)
    with slurm_cluster.running_cluster(tmp_path_factory.mktemp("slurm")) as environment:
        yield environment


@pytest.fixture
def on_cluster(cluster: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This process (and what it submits) talks to the test cluster."""
    for key, value in cluster.items():
        monkeypatch.setenv(key, value)
    return cluster


@pytest.fixture(scope="module")
def local_jobs_2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke benchmark with two local workers: what the SLURM arrays must give byte for byte."""
    output = tmp_path_factory.mktemp("local") / "benchmark"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    completed = subprocess.run([sys.executable, "-m", "dmlbench", "benchmark", str(SMOKE), "-o", str(output), "--jobs", "2", "-q"],
                               capture_output=True, text=True, timeout=600, env=environment)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return output


def assert_same_results(one: Path, two: Path) -> None:
    for name in COMPARED:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name


def recorded_job(output: Path) -> str:
    return str(json.loads((output / SLURM_FILE).read_text())["jobs"][-1]["job_id"])


def wait_for(condition, what: str, seconds: float = 300.0) -> None:  # noqa: ANN001  a callable without arguments
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"waited {seconds:.0f} s for {what}")


def running_owners(output: Path) -> list[int]:
    """The process ids of the workers holding a unit now, read from the benchmark's storage."""
    if not (output / BENCHMARK_FILE).is_file():
        return []
    url = json.loads((output / BENCHMARK_FILE).read_text())["storage"]
    if not storage_module.study_names(url):
        return []
    backend = storage_module.open_storage(url)
    return [int(trial.user_attrs["worker"]["pid"]) for name in storage_module.study_names(url)
            for trial in optuna.load_study(study_name=name, storage=backend).get_trials(
                deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)) if "worker" in trial.user_attrs]


def task_pids(job: str) -> set[int]:
    """The processes of array task or job ``job`` (``12_1``) on this node (``scontrol listpids``)."""
    shown = subprocess.run(["scontrol", "--oneliner", "show", "job", job], capture_output=True, text=True).stdout
    raw = shown.split("JobId=", 1)[1].split()[0] if "JobId=" in shown else job
    listed = subprocess.run(["scontrol", "listpids", raw], capture_output=True, text=True).stdout.splitlines()[1:]
    return {int(line.split()[0]) for line in listed if line.split()}


def holds_a_unit(output: Path, job: str) -> bool:
    return bool(task_pids(job) & set(running_owners(output)))


def interrupted_attempts(output: Path) -> int:
    url = json.loads((output / BENCHMARK_FILE).read_text())["storage"]
    backend = storage_module.open_storage(url)
    return sum(bool(trial.user_attrs.get("interrupted")) for name in storage_module.study_names(url)
               for trial in optuna.load_study(study_name=name, storage=backend).get_trials(deepcopy=False))


def job_ended(job_id: str, tasks: int, output: Path) -> bool:
    return not any(task.live for task in slurm.task_states(job_id, tasks, output / SLURM_DIR))


# -- Options and checks (no cluster) -----------------------------------------------------------------


@pytest.mark.parametrize(("text", "minutes"), [("90", 90), ("5:30", 6), ("1:00:00", 60), ("2-00", 2880),
                                                ("1-02:03", 1563), ("0:0:1", 1)])
def test_slurm_time_limits_read_as_sbatch_reads_them(text: str, minutes: int) -> None:
    assert slurm.parse_time(text) == minutes


def test_a_time_limit_that_is_none_is_refused() -> None:
    with pytest.raises(UserInputError, match="no SLURM time limit"):
        slurm.parse_time("an hour")


def test_sbatch_pass_through_options_and_the_ones_dmlbench_sets() -> None:
    assert slurm.parse_sbatch_options(["--qos=high", "--exclusive", "--comment=a b"]) == {
        "qos": "high", "exclusive": True, "comment": "a b"}
    with pytest.raises(UserInputError, match="--partition is set by dmlbench itself"):
        slurm.parse_sbatch_options(["--partition=gpu"])
    with pytest.raises(UserInputError, match="one long sbatch option"):
        slurm.parse_sbatch_options(["-p gpu"])


def test_a_follower_asks_often_while_states_change_and_rarely_while_tasks_run_on() -> None:
    pauses = slurm.poll_pauses(0.5, 30.0)
    assert [next(pauses) for _ in range(9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_tasks_the_controller_forgot_are_told_by_their_result_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``MinJobAge`` neither scontrol nor squeue knows a job: submitit's result file of each task says
    how it ended, and a task without one ended without a result (stopped or cancelled)."""
    from submitit.core.utils import cloudpickle_dump

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no controller to ask
    cloudpickle_dump(("success", None), tmp_path / "41_0_0_result.pkl")
    cloudpickle_dump(("error", "Traceback ..."), tmp_path / "41_1_0_result.pkl")
    assert [(task.state, task.live) for task in slurm.task_states("41", 3, tmp_path)] == [
        ("COMPLETED", False), ("FAILED", False), ("ENDED", False)]


def test_task_lists_of_slurm_arrays() -> None:
    assert slurm._task_ids("[0-2,5%2]") == [0, 1, 2, 5]
    assert slurm._task_ids("3") == [3]
    assert slurm._task_ids("N/A") == [0]


def test_without_slurm_installed_it_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, out, err = run_cli(["benchmark", str(SMOKE), "-o", str(tmp_path / "b"), "--slurm", "--jobs", "2"], capsys)
    assert code == 2
    assert err.strip().splitlines() == [
        "dmlbench: error: --slurm cannot be used: SLURM is not installed here (sbatch, sinfo, scontrol, srun not on PATH); run from a "
        "machine of the cluster, or leave out --slurm"]
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("flag", [["--partition", "gpu"], ["--wait"], ["--cpus-per-worker", "4"]])
def test_slurm_options_without_slurm_are_refused(flag: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["benchmark", str(SMOKE), "-o", str(tmp_path / "b"), *flag], capsys)
    assert code == 2
    assert f"{flag[0]} is an option of --slurm" in err
    assert not (tmp_path / "b").exists()


def test_train_options_of_slurm_without_slurm_and_impossible_requests_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    glyphs = str(REPO / "configs" / "glyphs.yaml")
    code, _, err = run_cli(["train", glyphs, "-o", str(tmp_path / "r"), "--nodes", "2"], capsys)
    assert code == 2 and "--nodes is an option of --slurm" in err
    code, _, err = run_cli(["train", glyphs, "-o", str(tmp_path / "r"), "--slurm", "--cpus-per-task", "0"], capsys)
    assert code == 2 and err.strip() == "dmlbench: error: CPUs per SLURM task must be at least 1, got 0"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, _, err = run_cli(["train", glyphs, "-o", str(tmp_path / "r"), "--slurm", "--tasks-per-node", "2"], capsys)
    assert code == 2 and "SLURM is not installed here" in err
    assert not (tmp_path / "r").exists()


def test_the_command_that_continues_a_slurm_benchmark_submits_or_follows_it_again() -> None:
    from dmlbench.cli.benchmark import continue_command

    options = slurm.SlurmOptions("gpu", 90, 4, 1, {"qos": "high", "exclusive": True})
    assert continue_command("benchmark", Path("c.yaml"), ["protocol.trials=3"], Path("d"), None, jobs="2", slurm=options) == (
        "dmlbench benchmark c.yaml protocol.trials=3 -o d --jobs 2 --slurm --wait --time 90 --partition gpu "
        "--cpus-per-worker 4 --gpus-per-worker 1 --sbatch=--qos=high --sbatch=--exclusive")


def test_jobs_auto_with_slurm_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["benchmark", str(SMOKE), "-o", str(tmp_path / "b"), "--slurm", "--jobs", "auto"], capsys)
    assert code == 2
    assert "with --slurm give the number of workers" in err


def test_a_journal_shared_by_nodes_frees_a_unit_whose_worker_on_another_node_stopped_beating(tmp_path: Path) -> None:
    """A worker on another node (a SLURM task) cannot be looked up by its process id: its unit is freed once
    its heartbeat is three beats old, and not before."""
    from dmlbench.protocol.queue import work

    worker = work.Worker(f"journal:///{tmp_path / JOURNAL_FILE}", heartbeat=30)
    study = optuna.create_study(study_name="m", storage=worker.storage)
    now = time.time()
    for last_beat in (now - 4 * 30, now - 30):
        trial = study.ask()
        trial.set_user_attr("worker", {"id": "node-b:7:x", "host": "node-b", "pid": os.getpid(), "last_seen": last_beat})
        trial.set_user_attr("heartbeat", last_beat)
    work.release_stale(study, worker)
    silent, beating = study.get_trials(deepcopy=False)
    assert silent.state == optuna.trial.TrialState.FAIL and silent.user_attrs["interrupted"] is True
    assert silent.user_attrs["interrupted_reason"] == "interrupted: its worker on another machine stopped beating"
    assert beating.state == optuna.trial.TrialState.RUNNING


# -- Against the test cluster -------------------------------------------------------------------------


def test_a_partition_that_does_not_exist_is_one_line_before_anything_is_submitted(
        on_cluster: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["benchmark", str(SMOKE), "-o", str(tmp_path / "b"), "--slurm", "--jobs", "2",
                            "--partition", "nowhere"], capsys)
    assert code == 2
    assert err.strip().splitlines() == [
        f"dmlbench: error: --partition 'nowhere' does not exist on this cluster; its partitions: {slurm_cluster.PARTITION}"]
    assert not (tmp_path / "b").exists()
    assert subprocess.run(["squeue", "--noheader"], capture_output=True, text=True).stdout.strip() == ""


def test_a_job_sbatch_refuses_is_one_line_and_exit_2(on_cluster: dict[str, str], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """More memory than any node has: sbatch's own reasons in one line; no job recorded."""
    output = tmp_path / "b"
    code, _, err = run_cli(["benchmark", str(SMOKE), "-o", str(output), "--slurm", "--jobs", "2", "--sbatch=--mem=99999999"],
                           capsys)
    assert code == 2
    assert err.strip().splitlines() == ["dmlbench: error: sbatch refused the job: Memory specification can not be satisfied; "
                                        "Batch job submission failed: Requested node configuration is not available"]
    assert not (output / SLURM_FILE).exists()
    code, _, err = run_cli(["train", str(REPO / "configs" / "glyphs.yaml"), "-o", str(tmp_path / "run"), "--slurm",
                            "--sbatch=--mem=99999999"], capsys)
    assert code == 2 and err.strip().startswith("dmlbench: error: sbatch refused the job: ") and "\n" not in err.strip()


def test_a_two_task_array_gives_the_bytes_of_local_jobs_2_and_the_script_the_dry_run_printed(
        on_cluster: dict[str, str], local_jobs_2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "slurm"
    options = ["-o", str(output), "--slurm", "--jobs", "2", "--partition", slurm_cluster.PARTITION, "--time", "20",
               "--sbatch=--comment=dmlbench test"]
    code, script, err = run_cli(["benchmark", str(SMOKE), *options, "--dry-run"], capsys)
    assert code == 0, err
    assert "#SBATCH --array=0-1%2" in script and "#SBATCH --partition=debug" in script
    assert "#SBATCH --comment='dmlbench test'" in script and "#SBATCH --signal=USR2@90" in script
    assert not output.exists()  # a dry run submits and stores nothing

    code, out, err = run_cli(["benchmark", str(SMOKE), *options, "--wait"], capsys)
    assert code == 0, err
    job = recorded_job(output)
    assert f"submitted SLURM job {job} (2 worker task(s))" in err
    assert f"SLURM job {job}: task 0 COMPLETED, task 1 COMPLETED" in err
    assert f"results: {output / RESULTS_CSV}" in out
    assert_same_results(local_jobs_2, output)
    assert (output / SLURM_DIR / f"{job}_submission.sh").read_text() == script.rstrip("\n") + "\n"
    record = json.loads((output / "benchmark.json").read_text())
    assert record["threads_per_worker"] == 1

    code, out, _ = run_cli(["status", str(output)], capsys)
    assert code == 0
    assert out.strip().splitlines()[-1] == f"SLURM job {job}: task 0 COMPLETED, task 1 COMPLETED"


def test_a_task_cancelled_mid_unit_leaves_the_unit_to_the_other_task(
        on_cluster: dict[str, str], local_jobs_2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``scancel`` of one task while it holds a unit: the cancelled task marks its unit interrupted (a
    clean stop on SIGTERM), the other task runs it again, and the results are those of an undisturbed run."""
    output = tmp_path / "slurm"
    code, _, err = run_cli(["benchmark", str(SMOKE), "-o", str(output), "--slurm", "--jobs", "2"], capsys)
    assert code == 0, err
    job = recorded_job(output)
    code, out, _ = run_cli(["status", str(output)], capsys)
    assert code == 0  # whether or not a task has started: the tasks' states, never an error
    assert out.strip().splitlines()[-1].startswith(f"SLURM job {job}: task 0 ")
    # Held still while it holds a unit (SIGSTOP), so that the cancel finds it inside the unit.
    wait_for(lambda: holds_a_unit(output, f"{job}_1"), "task 1 to hold a unit")
    subprocess.run(["scontrol", "suspend", f"{job}_1"], check=True)
    assert holds_a_unit(output, f"{job}_1")
    subprocess.run(["scancel", f"{job}_1"], check=True)
    wait_for(lambda: job_ended(job, 2, output), "the job to end")
    assert_same_results(local_jobs_2, output)
    assert interrupted_attempts(output) >= 1
    states = [task.state for task in slurm.task_states(job, 2, output / SLURM_DIR)]
    assert states == ["COMPLETED", "CANCELLED"]


def test_sigterm_to_a_waiting_command_stops_the_following_not_the_job(on_cluster: dict[str, str], local_jobs_2: Path,
                                                                       tmp_path: Path) -> None:
    output = tmp_path / "slurm"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    follower = subprocess.Popen([sys.executable, "-m", "dmlbench", "benchmark", str(SMOKE), "-o", str(output), "--slurm",
                                 "--jobs", "2", "--wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
    wait_for(lambda: (output / SLURM_FILE).is_file(), "the submission")
    job = recorded_job(output)
    follower.send_signal(signal.SIGTERM)
    _, err = follower.communicate(timeout=60)
    assert follower.returncode == 143
    assert (f"dmlbench: stopped following SLURM job {job}; its tasks run on: follow them with `dmlbench status {output}`, "
            f"cancel them with `scancel {job}`") in err
    wait_for(lambda: job_ended(job, 2, output), "the job to end")
    assert_same_results(local_jobs_2, output)


@pytest.mark.parametrize("damage", [b"{\"jobs\": [{\"job_id\": \"1", b"\xff\xfe", b"[]"])
def test_a_damaged_slurm_record_is_one_line_and_is_never_overwritten(damage: bytes, on_cluster: dict[str, str],
                                                                      tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "slurm"
    output.mkdir()
    (output / SLURM_FILE).write_bytes(damage)
    code, _, err = run_cli(["benchmark", str(SMOKE), "-o", str(output), "--slurm", "--jobs", "2"], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(f"dmlbench: error: {output / SLURM_FILE} is damaged (")
    assert (output / SLURM_FILE).read_bytes() == damage
    assert subprocess.run(["squeue", "--noheader"], capture_output=True, text=True).stdout.strip() == ""


def test_the_same_command_follows_a_job_still_running_instead_of_submitting_another(
        on_cluster: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "slurm"
    command = ["benchmark", str(SMOKE), "-o", str(output), "--slurm", "--jobs", "2", "-q"]
    assert run_cli(command, capsys)[0] == 0
    job = recorded_job(output)
    code, _, err = run_cli([*command, "--wait"], capsys)
    assert code == 0, err
    assert f"SLURM job {job} of {output} is still queued or running: nothing submitted" in err
    assert len(json.loads((output / SLURM_FILE).read_text())["jobs"]) == 1


def test_on_postgresql_a_task_killed_outright_leaves_its_unit_to_the_heartbeat(
        on_cluster: dict[str, str], postgres_url: str, local_jobs_2: Path, tmp_path: Path,  # noqa: F811
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL as the storage, its password written in the URL (the tasks get the URL without it and the
    password through ``PGPASSWORD``); one task killed with SIGKILL inside a unit: the other task takes the
    unit up after three missed heartbeats, and the results are those of an undisturbed run."""
    secret = os.environ["PGPASSWORD"]
    monkeypatch.delenv("PGPASSWORD")
    with_password = postgres_url.replace("postgres@", f"postgres:{secret}@", 1)
    output = tmp_path / "slurm"
    code, _, err = run_cli(["benchmark", str(SMOKE), "-o", str(output), "--slurm", "--jobs", "2", "--storage", with_password,
                            "--heartbeat", "2"], capsys)
    assert code == 0, err
    assert secret not in (output / BENCHMARK_FILE).read_text() + (output / SLURM_FILE).read_text()
    assert os.environ["PGPASSWORD"] == secret  # how the tasks get it (sbatch exports this process's environment)
    job = recorded_job(output)
    wait_for(lambda: holds_a_unit(output, f"{job}_1"), "task 1 to hold a unit")
    subprocess.run(["scontrol", "suspend", f"{job}_1"], check=True)
    (victim,) = task_pids(f"{job}_1") & set(running_owners(output))
    os.kill(victim, signal.SIGKILL)
    subprocess.run(["scontrol", "resume", f"{job}_1"], check=True)
    wait_for(lambda: job_ended(job, 2, output), "the job to end")
    assert_same_results(local_jobs_2, output)
    backend = storage_module.open_storage(postgres_url)
    stale = [trial for name in storage_module.study_names(postgres_url)
             for trial in optuna.load_study(study_name=name, storage=backend).get_trials(deepcopy=False)
             if trial.user_attrs.get("worker", {}).get("pid") == victim and trial.state == optuna.trial.TrialState.FAIL]
    assert len(stale) == 1 and not stale[0].user_attrs.get("interrupted")  # failed by the heartbeat, not by a stop


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["requeue", "time_limit_warning"])
def test_a_requeued_task_continues_the_benchmark(stop: str, on_cluster: dict[str, str], local_jobs_2: Path,
                                                 tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One task, stopped inside a unit and requeued (SIGTERM and ``scontrol requeue``, as a preemption does;
    or SLURM's time-limit warning, SIGUSR2, after which the task requeues itself), continues after SLURM's
    requeue delay and gives the bytes of an undisturbed run, its unit marked interrupted and run again."""
    output = tmp_path / "slurm"
    code, _, err = run_cli(["benchmark", str(SMOKE), "-o", str(output), "--slurm", "--jobs", "1"], capsys)
    assert code == 0, err
    job = recorded_job(output)
    wait_for(lambda: holds_a_unit(output, job), "the task to hold a unit")
    # Held still inside the unit (SIGSTOP) while the signal is sent, so that it is handled there on SIGCONT
    # (scancel cannot signal a suspended job: the signal goes to the worker's process itself).
    subprocess.run(["scontrol", "suspend", job], check=True)
    (worker,) = task_pids(job) & set(running_owners(output))
    os.kill(worker, signal.SIGTERM if stop == "requeue" else signal.SIGUSR2)
    subprocess.run(["scontrol", "resume", job], check=True)
    if stop == "requeue":  # what a preemption does: SIGTERM, then the job back in the queue
        wait_for(lambda: slurm.task_states(job, 1, output / SLURM_DIR)[0].state != "RUNNING", "the task to stop", 60)
        subprocess.run(["scontrol", "requeue", job], check=True)
    wait_for(lambda: slurm.task_states(job, 1, output / SLURM_DIR)[0].restarts == 1, "the requeue", 60)
    wait_for(lambda: job_ended(job, 1, output), "the requeued job to end", 600)
    assert_same_results(local_jobs_2, output)
    assert interrupted_attempts(output) >= 1
    assert slurm.task_states(job, 1, output / SLURM_DIR)[0].state == "COMPLETED"


def test_a_two_process_training_through_slurm_is_the_torchrun_one(on_cluster: dict[str, str], tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Two SLURM tasks as the two ranks (gloo on the CPU) train bit for bit what torchrun's two ranks train."""
    import torch

    from test_distributed import DDP_SETUP, torchrun

    overrides = [*DDP_SETUP, "loss.name=normalized_softmax", "loss.params={}", "miner.name=null"]
    completed = torchrun(tmp_path / "torchrun", overrides)
    assert completed.returncode == 0, completed.stderr[-3000:]
    code, _, err = run_cli(["train", str(REPO / "configs" / "glyphs.yaml"), *overrides, "-o", str(tmp_path / "slurm"),
                            "--slurm", "--tasks-per-node", "2", "--wait", "-q"], capsys)
    assert code == 0, err
    record = json.loads((tmp_path / "slurm" / "run.json").read_text())
    assert record["status"] == "completed"
    assert record["launch"]["backend"] == "gloo" and record["launch"]["world_size"] == 2
    assert record["launch"]["slurm_job_id"].isdigit()
    assert json.loads((tmp_path / "torchrun" / "run.json").read_text())["launch"] == {"backend": "gloo", "world_size": 2}
    metrics = [[{key: value for key, value in json.loads(line).items() if key != "seconds"}
                for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()] for run in ("slurm", "torchrun")]
    assert metrics[0] == metrics[1]
    checkpoints = [torch.load(tmp_path / run / "checkpoint_last.pt", weights_only=False) for run in ("slurm", "torchrun")]
    for name, tensor in checkpoints[1]["model"].items():
        assert torch.equal(checkpoints[0]["model"][name], tensor), name
