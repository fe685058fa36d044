"""What a new user runs into: one line naming the cause, the right exit code, and nothing created
before the input is known to be good. The commands run in-process (the same exit code and output as
the console script, without a new interpreter importing torch each time); the installed console
script runs where the lines a user sees are the subject (Python warnings reach stderr only in a
process of its own)."""

import json
import subprocess
from pathlib import Path

import pytest

import replicas
from cli_runner import cli_exit_code, run_in_process
from test_cli_process import GLYPHS_CONFIG, assert_one_line_error, console_script, run
from training_fixtures import TINY

REPO = Path(__file__).resolve().parent.parent
SMOKE = str(REPO / "configs" / "smoke.yaml")
RGB = ["data.options={}", "model.options={in_channels: 3, width: 8}", "data.image_size=16", "training.epochs=1",
       "training.batch_size=8", "evaluation.metrics=[precision_at_1, map_at_r]"]


@pytest.mark.parametrize("command", ["train", "benchmark"])
def test_a_config_that_is_not_utf8_is_one_line(command: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "latin1.yaml"
    config.write_bytes("# entraîné\nseed: 0\n".encode("latin-1"))
    result = run_in_process([command, str(config), "-o", str(tmp_path / "out")], capsys)
    assert_one_line_error(result, 2, str(config), "is not UTF-8")
    assert not (tmp_path / "out").exists()


def test_a_benchmark_yaml_that_is_a_list_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "list.yaml"
    config.write_text("- name: contrastive\n- name: triplet\n")
    result = run_in_process(["benchmark", str(config), "-o", str(tmp_path / "out")], capsys)
    assert_one_line_error(result, 2, str(config), "must be a mapping", "not a list")
    assert "BenchmarkSpec" not in result.stderr


def test_protocol_keys_are_benchmark_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_in_process(["benchmark", SMOKE, "protocol.trials=1", "protocol.reproductions=3",
                             "-o", str(tmp_path / "out"), "--dry-run"], capsys)
    assert result.returncode == 0, result.stderr
    assert "(1 search trials + 3 reproductions) x 2 folds = 16 training runs" in result.stdout


@pytest.mark.parametrize(("override", "message"), [
    ("protocol.folds=1", "'protocol.folds': Input should be greater than or equal to 2"),
    ("protocol.trails=8", "unknown key 'protocol.trails'"),
    ("analysis.references=[nobody]", "'nobody', which is not a method"),
])
def test_bad_protocol_overrides_are_one_line(override: str, message: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    result = run_in_process(["benchmark", SMOKE, override, "-o", str(tmp_path / "out"), "--dry-run"], capsys)
    assert_one_line_error(result, 2, message)


def test_a_batch_the_sampler_cannot_fill_stops_the_benchmark_before_training(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trained = run_in_process(["train", GLYPHS_CONFIG, *TINY, "training.batch_size=6", "-o", str(tmp_path / "run")],
                             capsys)
    benchmark = run_in_process(["benchmark", SMOKE, "training.batch_size=6", "-o", str(tmp_path / "out")], capsys)
    assert_one_line_error(trained, 2, "batch_size=6 is not divisible by samples_per_class=4")
    assert_one_line_error(benchmark, 2, "batch_size=6 is not divisible by samples_per_class=4")
    assert not (tmp_path / "out").exists()


def test_train_of_a_directory_says_so(tiny_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_in_process(["train", str(tiny_run)], capsys)
    assert_one_line_error(result, 2, "is a directory", "dmlbench train --resume -o")


def test_a_dataset_whose_validation_split_has_one_class_is_named_before_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = replicas.folder(tmp_path, classes=12, per_class=4)
    run_dir = tmp_path / "run"
    result = run_in_process(["train", GLYPHS_CONFIG, "data.name=folder", f"data.root={root}", *RGB,
                             "-o", str(run_dir)], capsys)
    assert_one_line_error(result, 2, "the validation split has 1 class", "data.validation_fraction")
    assert not run_dir.exists()


def test_a_csv_whose_paths_are_all_missing_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "images.csv"
    table.write_text("path,label\nmissing1.png,1\nmissing2.png,2\nmissing3.png,3\n")
    result = run_in_process(["train", GLYPHS_CONFIG, "data.name=csv", f"data.root={table}", *RGB,
                             "-o", str(tmp_path / "run")], capsys)
    assert_one_line_error(result, 2, "none of its 2 training and validation images can be read", "data check csv")
    assert not (tmp_path / "run").exists()


def test_a_warning_is_one_line_and_no_progress_bar_streams_into_a_log(tmp_path: Path) -> None:
    root = replicas.folder(tmp_path, classes=16, per_class=4)
    rows = ["path,label"] + [f"{image},{image.parent.name}" for image in sorted(root.glob("*/*.png"))]
    table = tmp_path / "images.csv"
    table.write_text("\n".join([*rows, f"{tmp_path / 'gone.png'},class_0"]) + "\n")
    result = subprocess.run(
        [console_script(), "train", GLYPHS_CONFIG, "data.name=csv", f"data.root={table}", *RGB,
         "data.validation_fraction=0.4", "-o", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"dmlbench: warning: dataset 'csv': skipping 1 unreadable training and validation images (dmlbench data check csv --root {table} lists them)"
    ]
    assert "\r" not in result.stderr


def test_the_continue_command_of_a_benchmark_names_its_output_directory() -> None:
    from dmlbench.cli.benchmark import continue_command

    command = continue_command("benchmark", None, ["training.epochs=3"], Path("runs/benchmark-20261124-010203"),
                               "postgresql://me@db/bench", jobs="2", heartbeat=30, db_retry=300, quiet=True)
    assert command == ("dmlbench benchmark training.epochs=3 -o runs/benchmark-20261124-010203 "
                       "--storage postgresql://me@db/bench --jobs 2 -q")
    # --jobs auto is continued as auto (the same machine resolves it the same way), not as a number.
    command = continue_command("benchmark", None, [], Path("out"), None, jobs="auto")
    assert command == "dmlbench benchmark -o out --jobs auto"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A completed one-epoch run, trained in-process; the tests read it and leave it unchanged."""
    run_dir = tmp_path_factory.mktemp("tiny") / "run"
    assert cli_exit_code(["train", GLYPHS_CONFIG, *TINY, "training.epochs=1", "-o", str(run_dir), "-q"]) == 0
    return run_dir


def test_embed_images_skips_unreadable_files_lists_them_and_counts_them(tiny_run: Path, tmp_path: Path) -> None:
    folder = tmp_path / "images"
    for index in range(3):
        replicas.write_image(folder / f"{index}.png", index)
    replicas.write_image(folder / "broken.jpg", 9)
    (folder / "broken.jpg").write_bytes((folder / "broken.jpg").read_bytes()[:40])  # a truncated JPEG
    result = run("embed", str(tiny_run), "--images", str(folder), "-o", str(tmp_path / "emb"), "-q")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"dmlbench: warning: skipping 1 unreadable image files under {folder} (listed in the output's .json as source.unreadable)"
    ]
    meta = json.loads((tmp_path / "emb.json").read_text())
    assert meta["source"]["unreadable"] == [str(folder / "broken.jpg")]
    assert (tmp_path / "emb.paths.txt").read_text().splitlines() == [str(folder / f"{i}.png") for i in range(3)]


def test_evaluate_per_query_into_a_read_only_folder_names_per_query(tiny_run: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "read-only"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs here (needs root)")
    try:
        result = run_in_process(["evaluate", str(tiny_run), "--per-query", str(folder / "q.csv")], capsys)
    finally:
        subprocess.run(["umount", str(folder)], check=True)
    assert_one_line_error(result, 2, "cannot write --per-query", str(folder / "q.csv"), "Read-only file system")


def test_evaluate_verification_says_which_pairs_it_used(tiny_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_in_process(["evaluate", str(tiny_run), "--verification"], capsys)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("equal error rate"))
    assert " over all " in line and " positive pairs and all " in line and "negative pairs" in line


def test_what_evaluate_prints_is_the_json_it_writes(tiny_run: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Every table ``dmlbench evaluate`` prints is rendered from the results it writes as JSON (so the two
    cannot disagree), then one line per file written."""
    from dmlbench.evaluation.table import evaluation_text

    out = tmp_path / "results.json"
    result = run_in_process(["evaluate", str(tiny_run), "--analysis", "--verification", "--open-set",
                             "--per-query", str(tmp_path / "q.csv"), "--json", str(out)], capsys)
    assert result.returncode == 0, result.stderr
    results = json.loads(out.read_text())
    assert {"analysis", "verification", "open_set", "untrained"} <= set(results)
    rendered = "\n".join(evaluation_text(results, of_run=True))
    queries = len((tmp_path / "q.csv").read_text().splitlines()) - 1
    assert result.stdout == f"{rendered}\nper-query results: {tmp_path / 'q.csv'} ({queries} queries)\n"


def test_a_full_run_directory_names_resume_as_its_caller_gives_it(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The library names the parameter (``resume``), the command line the option (``--resume``)."""
    import dmlbench
    from dmlbench.errors import UserInputError

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine\n")
    result = run_in_process(["train", GLYPHS_CONFIG, *TINY, "-o", str(tmp_path / "run")], capsys)
    assert_one_line_error(result, 2, "already exists and is not empty (--resume continues it)")
    with pytest.raises(UserInputError, match=r"not empty \(`resume` continues it\)"):
        dmlbench.train(GLYPHS_CONFIG, tmp_path / "run", list(TINY))
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine\n"


def test_evaluate_prints_the_scores_before_a_long_verification_starts(tiny_run: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Each section is printed once computed: a verification over many pairs follows scores already shown."""
    from dmlbench.evaluation import verification
    from dmlbench.evaluation.table import evaluation_text
    from dmlbench.report.evaluation import EvaluateRequest, evaluate

    printed: list[str] = []
    seen_before: list[list[str]] = []
    measured = verification.pair_distances

    def pair_distances(*args: object, **kwargs: object) -> object:
        seen_before.append(list(printed))
        return measured(*args, **kwargs)

    monkeypatch.setattr(verification, "pair_distances", pair_distances)
    results = evaluate(EvaluateRequest(run=tiny_run, verification=True), printed.append)
    assert len(seen_before) == 1 and seen_before[0] and seen_before[0][0].startswith("metric")
    assert not any(line.startswith("equal error rate") for line in seen_before[0])
    assert "\n".join(printed) == "\n".join(evaluation_text(results, of_run=True))
