"""``dmlbench evaluate --embeddings ... --labels ...`` and its one-line errors (exit code 2)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from dmlbench.cli import main
from dmlbench.evaluation import evaluate


def _run(arguments: list[str]) -> tuple[int, str, str]:
    runner = CliRunner()
    with runner.isolation() as (stdout, stderr, *_):
        try:
            main(arguments)
            code = 0
        except SystemExit as exit_:
            code = int(exit_.code or 0)
        sys.stdout.flush()
        sys.stderr.flush()
        return code, stdout.getvalue().decode(), stderr.getvalue().decode()


@pytest.fixture
def arrays(tmp_path):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 12, 150)
    embeddings = rng.standard_normal((12, 8))[labels] + rng.standard_normal((150, 8))
    paths = {"embeddings": tmp_path / "e.npy", "labels": tmp_path / "l.npy", "second": tmp_path / "e2.npy"}
    np.save(paths["embeddings"], embeddings.astype(np.float32))
    np.save(paths["labels"], labels)
    np.save(paths["second"], rng.standard_normal((150, 4)))
    return paths, embeddings.astype(np.float32), labels


def test_table_and_json_match_the_python_api(arrays, tmp_path):
    paths, embeddings, labels = arrays
    out = tmp_path / "out" / "metrics.json"
    code, stdout, stderr = _run(["evaluate", "--embeddings", str(paths["embeddings"]), "--labels", str(paths["labels"]),
                                 "--metrics", "map_at_r,recall_at_3,nmi", "--json", str(out)])
    assert code == 0, stderr
    expected = evaluate(embeddings, labels, metrics=["map_at_r", "recall_at_3", "nmi"])
    assert json.loads(out.read_text()) == pytest.approx(expected)
    assert "map_at_r" in stdout and f"{expected['map_at_r']:.4f}" in stdout


def test_analysis_writes_a_spectrum_plot(arrays, tmp_path):
    paths, _, _ = arrays
    plot = tmp_path / "spectrum.png"
    code, stdout, stderr = _run(["evaluate", "--embeddings", str(paths["embeddings"]), "--labels", str(paths["labels"]),
                                 "--metrics", "precision_at_1", "--analysis", "--plot", str(plot)])
    assert code == 0, stderr
    assert "rho" in stdout and "pi_ratio" in stdout
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_several_models_are_analysed_concatenated_as_evaluated(arrays, tmp_path):
    """Two models' embeddings: the analysis is of each L2-normalised, side by side (written out in float64)."""
    from dmlbench.evaluation import embedding_space

    paths, embeddings, labels = arrays
    out = tmp_path / "out.json"
    code, _, stderr = _run(["evaluate", "--embeddings", str(paths["embeddings"]), "--embeddings", str(paths["second"]),
                            "--labels", str(paths["labels"]), "--metrics", "precision_at_1", "--analysis", "--json", str(out)])
    assert code == 0, stderr
    unit = [matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
            for matrix in (embeddings.astype(np.float64), np.load(paths["second"]))]
    expected = embedding_space.analyze(np.concatenate(unit, axis=1), labels)
    analysis = json.loads(out.read_text())["analysis"]
    for key in ("rho", "pi_intra", "pi_inter", "pi_ratio"):
        assert analysis[key] == pytest.approx(float(expected[key]), rel=1e-9)


def test_several_models_concatenated_and_separated(arrays):
    paths, _, _ = arrays
    for mode in ("concatenated", "separated"):
        code, stdout, stderr = _run(["evaluate", "--embeddings", str(paths["embeddings"]), "--embeddings", str(paths["second"]),
                                     "--labels", str(paths["labels"]), "--metrics", "map_at_r", "--mode", mode])
        assert code == 0, stderr
        assert "map_at_r" in stdout


@pytest.mark.parametrize(
    ("make_bad", "extra", "message"),
    [
        (lambda e, l: (e[:-1], l), [], "rows but labels"),
        (lambda e, l: (np.where(np.arange(e.size).reshape(e.shape) == 3, np.nan, e), l), [], "NaN"),
        (lambda e, l: (e, np.zeros_like(l)), [], "single class"),
        (lambda e, l: (e, l), ["--k", "100000"], "k=100000"),
        (lambda e, l: (e, l), ["--query-mask", "MASK"], "selects no query"),
        (lambda e, l: (e, l), ["--metrics", "recall_at_x"], "unknown metric"),
        (lambda e, l: (e, l), ["--backend", "annoy"], "backend"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(arrays, tmp_path, make_bad, extra, message):
    _, embeddings, labels = arrays
    bad_embeddings, bad_labels = make_bad(embeddings, labels)
    np.save(tmp_path / "bad_e.npy", bad_embeddings)
    np.save(tmp_path / "bad_l.npy", bad_labels)
    np.save(tmp_path / "mask.npy", np.zeros(len(labels), dtype=bool))
    extra = [str(tmp_path / "mask.npy") if item == "MASK" else item for item in extra]
    code, _, stderr = _run(["evaluate", "--embeddings", str(tmp_path / "bad_e.npy"),
                                 "--labels", str(tmp_path / "bad_l.npy"), *extra])
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], stderr


def test_missing_file_and_missing_arguments_are_user_errors(tmp_path):
    code, _, stderr = _run(["evaluate", "--embeddings", str(tmp_path / "none.npy"), "--labels", str(tmp_path / "none.npy")])
    assert code == 2 and "does not exist" in stderr
    code, _, stderr = _run(["evaluate"])
    assert code == 2 and "either a RUN" in stderr


def test_run_directory_prints_trained_and_untrained_columns(monkeypatch, tmp_path):
    from dmlbench.training import run_evaluation

    calls = []

    class FakeEvaluation:
        def __init__(self, run_dir):
            calls.append(("open", run_dir))

        @classmethod
        def open(cls, run_dir):
            return cls(run_dir)

        def scores(self, **options):
            calls.append(("scores", options))
            return {"map_at_r": 0.5, "num_queries": 10, "untrained": {"map_at_r": 0.125, "num_queries": 10}}

    monkeypatch.setattr(run_evaluation, "RunEvaluation", FakeEvaluation)
    out = tmp_path / "run.json"
    code, stdout, stderr = _run(["evaluate", str(tmp_path), "--metrics", "map_at_r", "--json", str(out)])
    assert code == 0, stderr
    header, row = stdout.splitlines()[:2]
    assert header.split() == ["metric", "trained", "untrained"]
    assert row.split() == ["map_at_r", "0.5000", "0.1250"]
    assert calls == [("open", tmp_path), ("scores", {"metrics": "map_at_r"})]  # the run opened once, then scored
    assert json.loads(out.read_text())["untrained"]["map_at_r"] == 0.125


def test_an_option_given_reaches_the_run_and_one_left_out_does_not(monkeypatch, tmp_path):
    """No option is dropped for equalling the command's default: ``--backend torch`` given is passed on (a
    run's stored faiss results are not what it asked for), and options not given are not passed at all."""
    from dmlbench.training import run_evaluation

    asked = []

    class Recording:
        @classmethod
        def open(cls, run_dir):
            return cls()

        def scores(self, **options):
            asked.append(options)
            return {"map_at_r": 0.5, "untrained": {"map_at_r": 0.25}}

    monkeypatch.setattr(run_evaluation, "RunEvaluation", Recording)
    for arguments in (["--backend", "torch", "--ks", "1,2,4,8", "--normalize", "--no-binarize"], []):
        code, _, stderr = _run(["evaluate", str(tmp_path), *arguments])
        assert code == 0, stderr
    assert asked == [{"ks": (1, 2, 4, 8), "backend": "torch", "binarize": False, "normalize": True}, {}]


def test_stored_run_scores_are_keyed_by_the_options_that_change_a_number(monkeypatch, tmp_path):
    """``RunEvaluation.scores`` stores its results under the options that differ from ``evaluation.evaluate``'s
    defaults: ``backend='torch'`` given is the default evaluation, ``backend='faiss'`` is another one."""
    from dmlbench.training.run_evaluation import _not_default

    assert _not_default({"backend": "torch", "ks": (1, 2, 4, 8), "normalize": True, "binarize": False}) == {}
    assert _not_default({"backend": "faiss", "ks": [1, 2], "seed": 3}) == {"backend": "faiss", "ks": [1, 2], "seed": 3}
    assert _not_default({"seed": 0}) == {"seed": 0}  # the run's seed is the default there, not evaluate's 0
