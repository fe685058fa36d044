"""The baseline rows (``protocol.baselines``): ``raw_pixels`` against a brute-force float64 retrieval on
the test images' pixels, the default leaving older benchmarks' hash alone, and the trunk's input
channels checked against the dataset before anything trains."""

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from cli_runner import cli_exit_code, run_cli
from test_protocol_benchmark import BASE, METHODS, PROTOCOL, write_spec

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def with_pixels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny benchmark of test_protocol_benchmark with both baselines, run once in this process."""
    directory = tmp_path_factory.mktemp("baselines")
    spec = write_spec(directory / "bench.yaml", protocol={**PROTOCOL, "baselines": ["untrained", "raw_pixels"]})
    assert cli_exit_code(["benchmark", str(spec), "-o", str(directory / "out"), "-q"]) == 0
    return directory / "out"


def _rows(output: Path, method: str) -> list[dict[str, str]]:
    with open(output / "runs.csv", newline="") as stream:
        return [row for row in csv.DictReader(stream) if row["method"] == method]


def _brute_force_precision_at_1(pixels: np.ndarray, labels: np.ndarray) -> float:
    """Nearest other image by cosine similarity in float64, ties to the lowest index."""
    unit = pixels / np.linalg.norm(pixels, axis=1, keepdims=True)
    hits = 0
    for query in range(len(unit)):
        best, best_similarity = -1, -np.inf
        for candidate in range(len(unit)):
            if candidate == query:
                continue
            similarity = float(unit[query] @ unit[candidate])
            if similarity > best_similarity + 1e-12:
                best, best_similarity = candidate, similarity
        hits += labels[best] == labels[query]
    return hits / len(unit)


def test_raw_pixels_row_is_the_pixels_retrieval_for_every_seed(with_pixels: Path) -> None:
    from dmlbench.config import from_dict
    from dmlbench.training.setup import load_dataset, make_splits

    rows = [row for row in _rows(with_pixels, "raw_pixels") if row["metric"] == "precision_at_1"]
    assert len(rows) == 2 * PROTOCOL["reproductions"]  # two reproductions x two modes
    scores = {(row["mode"], row["reproduction"]): float(row["value"]) for row in rows}
    assert len(set(scores.values())) == 1  # no model, no seed: the same number in every row
    config = from_dict(dict(BASE))
    dataset = load_dataset(config)
    test = make_splits(config, dataset).test
    subset = dataset.subset(test)
    pixels = np.stack([subset[i][0].double().flatten().numpy() for i in range(len(subset))])
    labels = np.asarray(dataset.labels)[test]
    assert next(iter(scores.values())) == pytest.approx(_brute_force_precision_at_1(pixels, labels), abs=1e-9)
    # A method that trained and the untrained models are other rows, and the report explains this one.
    assert _rows(with_pixels, "untrained") and _rows(with_pixels, "triplet")
    report = (with_pixels / "report.md").read_text()
    assert "| raw_pixels |" in report and "The `raw_pixels` row embeds each test image as its pixels" in report
    assert report.index("| untrained |") < report.index("| raw_pixels |")


def test_baselines_default_leaves_the_description_and_hash_alone(tmp_path: Path) -> None:
    from dmlbench.protocol.design.benchmark import load_spec
    from dmlbench.protocol.design.prepare import prepare

    plain = prepare(load_spec(write_spec(tmp_path / "plain.yaml")), tmp_path / "a")
    assert "baselines" not in plain.description()["protocol"]
    both = prepare(load_spec(write_spec(tmp_path / "both.yaml",
                                        protocol={**PROTOCOL, "baselines": ["untrained", "raw_pixels"]})), tmp_path / "b")
    assert both.description()["protocol"]["baselines"] == ["untrained", "raw_pixels"]
    assert both.config_hash != plain.config_hash


@pytest.mark.parametrize("baselines, message", [
    (["untrained", "untrained"], "each baseline once"),
    (["pixels"], "protocol.baselines"),
])
def test_bad_baselines_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], baselines: list[str],
                                            message: str) -> None:
    spec = write_spec(tmp_path / "bad.yaml", protocol={**PROTOCOL, "baselines": baselines})
    code, _, err = run_cli(["benchmark", str(spec), "-o", str(tmp_path / "out")], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_raw_pixels_is_a_reserved_method_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path / "named.yaml", methods=[{**METHODS[0], "name": "raw_pixels"}, METHODS[1]])
    code, _, err = run_cli(["benchmark", str(spec), "-o", str(tmp_path / "out")], capsys)
    assert code == 2 and "'raw_pixels' is reserved for a baseline row" in err


def test_a_trunk_for_other_channels_is_refused_before_training(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # glyphs are grey (1 channel); an RGB trunk would fail every step with a shape error.
    rgb = {**BASE, "model": {**BASE["model"], "options": {"width": 8, "in_channels": 3}}}
    spec = write_spec(tmp_path / "rgb.yaml", base=rgb)
    code, _, err = run_cli(["benchmark", str(spec), "-o", str(tmp_path / "bench")], capsys)
    expected = "takes 3-channel images but data 'glyphs' has 1-channel images: set model.options.in_channels=1"
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bench").exists()
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(rgb))
    code, _, err = run_cli(["train", str(config), "-o", str(tmp_path / "run")], capsys)
    assert code == 2 and expected in err and not (tmp_path / "run" / "metrics.jsonl").exists()
