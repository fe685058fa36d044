"""``dmlbench calibrate``, ``evaluate --open-set``, and thresholds stored with an index and applied by ``query``."""

import json
from pathlib import Path

import numpy as np
import pytest

from cli_runner import cli_exit_code, run_cli
from dmlbench import config as config_module
from dmlbench.evaluation.verification import pair_distances, threshold_at_fmr
from dmlbench.training import train
from dmlbench.training.records import run_hashes
from dmlbench.training.runs import embed_run, embed_test_split
from training_fixtures import TINY


def _train(directory: Path, seed: int) -> Path:
    config = config_module.load(Path("configs/glyphs.yaml"), [*TINY, "training.epochs=1", "training.max_steps_per_epoch=3", f"seed={seed}"])
    train(config, directory, progress=False)
    return directory


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("calibrate")
    return _train(root / "run", 0), _train(root / "other", 1)


@pytest.fixture(scope="module")
def calibrated(runs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("calibrations")
    paths = {"own": root / "own.json", "other": root / "other.json"}
    for (name, path), run in zip(paths.items(), runs):
        assert cli_exit_code(["calibrate", str(run), "--fmr", "1e-2,1e-3", "-o", str(path), "--replicates", "200"]) == 0
    return paths


def test_calibrate_a_run_chooses_on_validation_and_measures_on_test(runs: tuple[Path, Path], calibrated: dict[str, Path]) -> None:
    document = json.loads(calibrated["own"].read_text())
    assert {key: document[key] for key in ("model_sha256", "config_sha256")} == run_hashes(runs[0])
    validation = pair_distances(*embed_run(runs[0], "validation"))
    test = pair_distances(*embed_test_split(runs[0]))
    assert [point["target_fmr"] for point in document["targets"]] == [1e-2, 1e-3]
    for point in document["targets"]:
        assert point["threshold"] == threshold_at_fmr(validation, point["target_fmr"])["threshold"]
        assert point["in_sample_threshold"] == threshold_at_fmr(test, point["target_fmr"])["threshold"]
        assert point["test_fmr"] == pytest.approx(np.mean(test.negative <= point["threshold"]), abs=1e-12)
        assert point["test_fnmr"] == pytest.approx(np.mean(test.positive > point["threshold"]), abs=1e-12)
        assert len(point["test_fmr_ci"]) == 2 and len(point["test_fnmr_ci"]) == 2
    assert document["calibration"]["classes"] == 4 and document["test"]["classes"] == 20
    assert document["seed"] == 0 and document["bootstrap"]["replicates"] == 200


def test_calibrate_from_files_gives_the_same_thresholds(runs: tuple[Path, Path], calibrated: dict[str, Path], tmp_path: Path) -> None:
    arrays = {}
    for name, (embeddings, labels) in (("cal", embed_run(runs[0], "validation")), ("test", embed_test_split(runs[0]))):
        arrays[name], arrays[f"{name}_labels"] = tmp_path / f"{name}.npy", tmp_path / f"{name}_labels.npy"
        np.save(arrays[name], embeddings.numpy())
        np.save(arrays[f"{name}_labels"], labels.numpy())
    out = tmp_path / "files.json"
    assert cli_exit_code(["calibrate", "--embeddings", str(arrays["cal"]), "--labels", str(arrays["cal_labels"]),
                 "--test-embeddings", str(arrays["test"]), "--test-labels", str(arrays["test_labels"]),
                 "--fmr", "1e-2,1e-3", "--replicates", "200", "-o", str(out)]) == 0
    from_files, from_run = json.loads(out.read_text()), json.loads(calibrated["own"].read_text())
    assert from_files["targets"] == from_run["targets"]
    assert "model_sha256" not in from_files  # bare arrays say nothing about their model


@pytest.mark.parametrize("fmr, message", [
    ("0", "must lie in (0, 1)"), ("1.5", "must lie in (0, 1)"), ("1e-2,abc", "comma-separated numbers"),
    ("1e-2,1e-4", "1,536 impostor pairs; a target FMR of 0.0001 needs at least 10,000"),
    ("", "--fmr needs at least one target false match rate"),
])
def test_bad_calibrate_input_is_one_line_and_writes_nothing(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], fmr: str, message: str
) -> None:
    out = tmp_path / "calibration.json"
    code, _, err = run_cli(["calibrate", str(runs[0]), "--fmr", fmr, "-o", str(out)], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_evaluate_open_set_at_far_targets_and_calibrated_thresholds(
    runs: tuple[Path, Path], calibrated: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "results.json"
    code, printed, _ = run_cli(["evaluate", str(runs[0]), "--open-set", "--calibration", str(calibrated["own"]),
                                "--metrics", "precision_at_1", "--json", str(out)], capsys)
    assert code == 0 and "open set: 10 enrolled classes" in printed
    found = json.loads(out.read_text())["open_set"]
    document = json.loads(calibrated["own"].read_text())
    assert [p["threshold"] for p in found["at_calibrated_threshold"]] == [p["threshold"] for p in document["targets"]]
    assert [p["target_far"] for p in found["at_far"]] == [0.1, 0.01, 0.001] and found["unknown_classes"] == 10
    code, _, err = run_cli(["evaluate", str(runs[0]), "--open-set", "--calibration", str(calibrated["other"])], capsys)
    assert code == 2 and "is of another model than run" in err and len(err.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def embedded(runs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    prefix = tmp_path_factory.mktemp("calibrated_emb") / "emb"
    assert cli_exit_code(["embed", str(runs[0]), "--data", "glyphs", "-o", str(prefix), "-q"]) == 0
    return prefix


def test_index_refuses_a_calibration_of_another_model(
    embedded: Path, calibrated: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["index", str(embedded), "-o", str(tmp_path / "index"), "--calibration", str(calibrated["other"])], capsys)
    assert code == 2 and "is of another model than embeddings" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "index").exists()


def test_query_answers_no_match_beyond_the_stored_threshold(
    embedded: Path, calibrated: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = tmp_path / "index"
    assert run_cli(["index", str(embedded), "-o", str(index), "--calibration", str(calibrated["own"])], capsys)[0] == 0
    stored_rows = np.load(f"{embedded}.npy").astype(np.float64)
    unit = stored_rows / np.linalg.norm(stored_rows, axis=1, keepdims=True)
    threshold = json.loads(calibrated["own"].read_text())["targets"][1]["threshold"]
    candidates = np.random.default_rng(0).normal(size=(200, unit.shape[1]))
    nearest = np.sqrt((((candidates / np.linalg.norm(candidates, axis=1, keepdims=True))[:, None] - unit[None]) ** 2).sum(-1)).min(1)
    far_away = candidates[int(np.argmax(nearest))]
    assert nearest.max() > threshold
    queries = tmp_path / "queries.npy"
    np.save(queries, np.stack([stored_rows[5], far_away]).astype(np.float32))
    answers, page = tmp_path / "answers.json", tmp_path / "page.html"
    code, printed, _ = run_cli(["query", str(index), "--embeddings", str(queries), "-k", "3", "--fmr", "1e-3",
                                "--json", str(answers), "--html", str(page)], capsys)
    assert code == 0 and "no match: nearest" in printed
    found = json.loads(answers.read_text())
    assert [entry["match"] for entry in found] == [True, False]
    assert all(entry["threshold"] == threshold and entry["target_fmr"] == 1e-3 for entry in found)
    assert "no match" in page.read_text() and 'class="verdict match"' in page.read_text()
    # Several targets and no --fmr: which threshold is meant is asked, not guessed.
    code, _, err = run_cli(["query", str(index), "--embeddings", str(queries)], capsys)
    assert code == 2 and "--fmr is needed: calibration" in err and "has several targets (0.01, 0.001); choose one" in err
    code, _, err = run_cli(["query", str(index), "--embeddings", str(queries), "--calibration", str(calibrated["other"]), "--fmr", "1e-2"], capsys)
    assert code == 2 and "is of another model than index" in err and len(err.strip().splitlines()) == 1


def test_calibration_and_test_embeddings_of_different_dimensions_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(0)
    paths = {name: tmp_path / f"{name}.npy" for name in ("e16", "l16", "t8", "l8")}
    np.save(paths["e16"], rng.standard_normal((200, 16)).astype(np.float32))
    np.save(paths["t8"], rng.standard_normal((200, 8)).astype(np.float32))
    for name in ("l16", "l8"):
        np.save(paths[name], np.repeat(np.arange(20), 10))
    out = tmp_path / "c.json"
    code, _, err = run_cli(["calibrate", "--embeddings", str(paths["e16"]), "--labels", str(paths["l16"]), "--test-embeddings",
                            str(paths["t8"]), "--test-labels", str(paths["l8"]), "--fmr", "1e-2", "-o", str(out)], capsys)
    assert code == 2 and "16-dimensional rows but --test-embeddings" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("argv", [
    ["calibrate", "missing_run", "--fmr", "1e-2", "-o", "c.json", "--replicates", "0"],
    ["evaluate", "missing_run", "-k", "0"],
    ["query", "missing_index", "--embeddings", "q.npy", "-k", "0"],
])
def test_zero_counts_are_refused_before_anything_is_read(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # The option itself is refused: before the missing path is even looked at (and long before loading).
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "greater than or equal to 1" in err and "missing" not in err


def test_reranking_on_a_calibrated_index_is_refused_once_naming_why(
    embedded: Path, calibrated: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The calibration holds two targets: the refusal comes first, not a request for --fmr.
    index = tmp_path / "index"
    assert run_cli(["index", str(embedded), "-o", str(index), "--calibration", str(calibrated["own"])], capsys)[0] == 0
    for fmr in ([], ["--fmr", "1e-2"]):
        code, _, err = run_cli(["query", str(index), "--embeddings", f"{embedded}.npy", "--rerank", "query_expansion", *fmr], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1
        assert "thresholds were chosen on raw distances" in err and "--fmr" not in err
