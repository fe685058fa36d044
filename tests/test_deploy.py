"""Using a trained model: embed, index, query, export, per-query diagnostics, verification pages."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cli_runner import cli_exit_code, run_cli
from dmlbench import config as config_module
from dmlbench.deploy.embeddings import EmbeddingSet, dataset_collection, embed_collection
from dmlbench.deploy.model import load_run_model
from dmlbench.evaluation.knn_index import prepare
from dmlbench.evaluation.neighbors import nearest_neighbors
from dmlbench.training import train
from dmlbench.training.embed import embed
from training_fixtures import TINY


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("deploy") / "run"
    config = config_module.load(Path("configs/glyphs.yaml"), [*TINY, "training.epochs=1", "training.max_steps_per_epoch=3"])
    train(config, directory, progress=False)
    return directory


@pytest.fixture(scope="module")
def embedded(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    prefix = tmp_path_factory.mktemp("emb") / "emb"
    code = cli_exit_code(["embed", str(run_dir), "--data", "glyphs", "-o", str(prefix), "--batch-size", "100", "-q"])
    assert code == 0
    return prefix


def _brute_force_neighbours(stored: np.ndarray, queries: np.ndarray, k: int) -> tuple[list[list[int]], list[list[float]]]:
    """Euclidean distances between L2-normalised float64 rows, sorted by (distance, index)."""
    stored = stored.astype(np.float64)
    queries = queries.astype(np.float64)
    stored /= np.linalg.norm(stored, axis=1, keepdims=True)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    ids, distances = [], []
    for query in queries:
        squared = [float(((query - row) ** 2).sum()) for row in stored]
        order = sorted(range(len(stored)), key=lambda i: (squared[i], i))[:k]
        ids.append(order)
        distances.append([squared[i] ** 0.5 for i in order])
    return ids, distances


def test_embed_writes_every_item_with_labels_paths_and_the_models_embeddings(run_dir: Path, embedded: Path) -> None:
    stored = EmbeddingSet.load(embedded)
    model = load_run_model(run_dir)
    dataset = model.dataset()
    assert stored.embeddings.shape == (len(dataset), model.embedding_dim)
    assert stored.embeddings.dtype == np.float32
    np.testing.assert_array_equal(stored.labels, dataset.labels.numpy())
    assert stored.paths[:2] == ["glyphs:0", "glyphs:1"] and len(stored.paths) == len(dataset)
    direct, _ = embed(model.model, dataset.subset(range(150, 230)), 64, model.device)
    np.testing.assert_allclose(stored.embeddings[150:230], direct.numpy(), atol=1e-6)
    assert stored.meta["checkpoint_epoch"] == model.epoch and stored.meta["input"]["channels"] == 1


def test_interrupted_embedding_resumes_to_the_same_rows(run_dir: Path, embedded: Path, tmp_path: Path) -> None:
    model = load_run_model(run_dir)
    dataset = model.dataset()
    collection = dataset_collection(dataset, {"data": "glyphs", "root": None})
    calls = {"count": 0}
    inputs = collection.inputs

    def interrupted(start: int, stop: int) -> torch.Tensor:
        calls["count"] += 1
        if calls["count"] == 3:
            raise KeyboardInterrupt
        return inputs(start, stop)

    collection.inputs = interrupted
    from dmlbench.errors import RunInterrupted

    with pytest.raises(RunInterrupted):
        embed_collection(model, collection, tmp_path / "e", spec=model.input_spec(dataset), batch_size=100, progress=False)
    assert not (tmp_path / "e.npy").exists() and (tmp_path / "e.npy.partial").exists()
    collection.inputs = inputs
    resumed, computed = embed_collection(model, collection, tmp_path / "e", spec=model.input_spec(dataset), batch_size=100, progress=False)
    assert computed == len(dataset) - 200
    np.testing.assert_array_equal(resumed.embeddings, EmbeddingSet.load(embedded).embeddings)
    _, again = embed_collection(model, collection, tmp_path / "e", spec=model.input_spec(dataset), batch_size=100, progress=False)
    assert again == 0


def test_embed_refuses_to_overwrite_other_embeddings(run_dir: Path, embedded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["embed", str(run_dir), "--data", "glyphs", "-o", str(embedded), "--batch-size", "64", "-q"], capsys)
    assert code == 2 and "already exists and holds other embeddings" in err and len(err.strip().splitlines()) == 1


def test_embed_images_folder_uses_the_evaluation_transform(run_dir: Path, tmp_path: Path) -> None:
    model = load_run_model(run_dir)
    dataset = model.dataset()
    folder = tmp_path / "images" / "sub"
    folder.mkdir(parents=True)
    for index in (3, 7):
        Image.fromarray(dataset.images[index, 0].numpy()).save(folder / f"item{index}.png")
    assert cli_exit_code(["embed", str(run_dir), "--images", str(tmp_path / "images"), "-o", str(tmp_path / "files"), "-q"]) == 0
    stored = EmbeddingSet.load(tmp_path / "files")
    assert stored.labels is None and [Path(p).name for p in stored.paths] == ["item3.png", "item7.png"]
    direct, _ = embed(model.model, dataset.subset([3, 7]), 8, model.device)
    # PNG is lossless and the size already matches: the file path gives the dataset's own embedding.
    np.testing.assert_allclose(stored.embeddings, direct.numpy(), atol=1e-6)


def test_exact_index_returns_the_evaluation_engines_neighbours(embedded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["index", str(embedded), "-o", str(tmp_path / "idx")], capsys)
    assert code == 0 and "exact index" in out
    stored = EmbeddingSet.load(embedded)
    queries = np.asarray(stored.embeddings[::37])
    np.save(tmp_path / "q.npy", queries)
    code, _, err = run_cli(["query", str(tmp_path / "idx"), "--embeddings", str(tmp_path / "q.npy"), "-k", "7", "--json", str(tmp_path / "q.json")], capsys)
    assert code == 0, err
    answers = json.loads((tmp_path / "q.json").read_text())
    rows = torch.from_numpy(np.concatenate([stored.embeddings, queries]).astype(np.float64))
    space = prepare(rows, normalize=True, binarize=False)
    count = len(stored.embeddings)
    engine = nearest_neighbors(space, torch.arange(count, count + len(queries)), torch.arange(count), 7, exclude_self=False)
    assert [[hit["index"] for hit in answer["neighbors"]] for answer in answers] == engine.ids.tolist()
    first = answers[0]["neighbors"][0]
    assert set(first) == {"index", "path", "label", "distance"}
    assert first["path"] == stored.paths[first["index"]] and first["label"] == int(stored.labels[first["index"]])


def test_query_breaks_ties_by_index_like_brute_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generator = np.random.default_rng(0)
    base = generator.normal(size=(30, 6)).astype(np.float32)
    # Exact duplicates and scaled copies (same direction, so the same normalised row): ties.
    stored = np.concatenate([base, base[:10], 3.0 * base[5:15]])
    np.save(tmp_path / "s.npy", stored)
    np.save(tmp_path / "q.npy", base[:12])
    assert run_cli(["index", str(tmp_path / "s.npy"), "-o", str(tmp_path / "idx")], capsys)[0] == 0
    code, _, err = run_cli(["query", str(tmp_path / "idx"), "--embeddings", str(tmp_path / "q.npy"), "-k", "9", "--json", str(tmp_path / "a.json")], capsys)
    assert code == 0, err
    answers = json.loads((tmp_path / "a.json").read_text())
    ids, distances = _brute_force_neighbours(stored, base[:12], 9)
    assert [[hit["index"] for hit in answer["neighbors"]] for answer in answers] == ids
    np.testing.assert_allclose([[hit["distance"] for hit in answer["neighbors"]] for answer in answers], distances, atol=1e-6)
    assert answers[0]["neighbors"][0]["path"] == "0" and answers[0]["neighbors"][0]["label"] is None


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_approximate_index_measures_its_recall(embedded: Path, tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["index", str(embedded), "-o", str(tmp_path / kind), "--kind", kind], capsys)
    assert code == 0, err
    meta = json.loads((tmp_path / kind / "index.json").read_text())
    assert 0.0 <= meta["recall_at_10"] <= 1.0 and f"recall@10 against exact {meta['recall_at_10']:.4f}" in out
    if kind == "ivf":
        # Probing every list is exhaustive: the approximate index must then find the exact answer.
        full = tmp_path / "ivf_all"
        assert run_cli(["index", str(embedded), "-o", str(full), "--kind", "ivf", "--nprobe", "1000"], capsys)[0] == 0
        assert json.loads((full / "index.json").read_text())["recall_at_10"] == 1.0


def test_query_bad_input_is_one_line(embedded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["index", str(embedded), "-o", str(tmp_path / "idx")], capsys)[0] == 0
    np.save(tmp_path / "wrong.npy", np.ones((2, 5), dtype=np.float32))
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    cases = [
        (["--embeddings", str(tmp_path / "wrong.npy"), "-k", "3"], "dimension 5"),
        (["--embeddings", str(embedded) + ".npy", "-k", "100000"], "exceeds the"),
        (["--image", str(tmp_path / "broken.png"), "-k", "3"], "cannot be decoded"),
        (["-k", "3"], "exactly one of --image FILE or --embeddings"),
    ]
    for arguments, message in cases:
        code, _, err = run_cli(["query", str(tmp_path / "idx"), *arguments], capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    code, _, err = run_cli(["index", str(embedded), "-o", str(tmp_path / "idx")], capsys)
    assert code == 2 and "not empty" in err


def test_query_by_image_and_html_page(run_dir: Path, embedded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset = load_run_model(run_dir).dataset()
    Image.fromarray(dataset.images[11, 0].numpy()).save(tmp_path / "q.png")
    assert run_cli(["index", str(embedded), "-o", str(tmp_path / "idx")], capsys)[0] == 0
    label = int(dataset.labels[11])
    code, out, err = run_cli(["query", str(tmp_path / "idx"), "--image", str(tmp_path / "q.png"), "--label", f"#{label}",
                              "-k", "4", "--html", str(tmp_path / "q.html"), "--json", str(tmp_path / "q.json")], capsys)
    assert code == 0, err
    answer = json.loads((tmp_path / "q.json").read_text())[0]
    assert answer["neighbors"][0]["index"] == 11 and answer["neighbors"][0]["distance"] < 1e-5
    page = (tmp_path / "q.html").read_text()
    assert page.count("data:image/png;base64,") == 5 and 'class="tile correct"' in page
    # The class name, as the index stores it from the embedding set, gives the same answer.
    name = dataset.class_names[label]
    assert json.loads(Path(f"{embedded}.json").read_text())["class_names"] == list(dataset.class_names)
    code, out, err = run_cli(["query", str(tmp_path / "idx"), "--image", str(tmp_path / "q.png"), "--label", name,
                              "-k", "4", "--json", str(tmp_path / "named.json")], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "named.json").read_text()) == json.loads((tmp_path / "q.json").read_text())
    assert f"label {label} ({name})" in out
    code, _, err = run_cli(["query", str(tmp_path / "idx"), "--image", str(tmp_path / "q.png"), "--label", "no such class"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "'no such class' is neither a class name of index" in err and f"its classes are {dataset.class_names[0]}" in err
    # A class named like another label's number is refused, not guessed (glyphs has classes named by digits).
    clash = next(i for i, other in enumerate(dataset.class_names) if other.isdigit() and int(other) != i)
    code, _, err = run_cli(["query", str(tmp_path / "idx"), "--image", str(tmp_path / "q.png"), "--label", dataset.class_names[clash]], capsys)
    assert code == 2 and "is ambiguous" in err and "write it #" in err and err.startswith("dmlbench: error: --label ")
    _check_in_browser(tmp_path / "q.html", tmp_path / "q_shot.png")


def _check_in_browser(page: Path, screenshot: Path) -> None:
    """Render the page in headless Chromium (Debian's ``chromium``) and check the picture is not blank."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        if os.environ.get("DMLBENCH_REQUIRE_BROWSER"):
            pytest.fail("DMLBENCH_REQUIRE_BROWSER is set (as .ci/run sets it) but no chromium is installed")
        pytest.skip("no headless browser: apt-get install chromium to render the pages in this test")
    subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={screenshot}", "--window-size=800,600",
         page.resolve().as_uri()],
        capture_output=True, timeout=120, check=True,
    )
    pixels = np.asarray(Image.open(screenshot).convert("RGB"))
    # Thumbnails with coloured borders: many distinct colours, and the blue query border is there.
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50
    assert ((pixels[:, :, 2] > 180) & (pixels[:, :, 0] < 100)).sum() > 200


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")
@pytest.mark.parametrize("format", ["onnx", "torchscript"])
def test_export_matches_pytorch_with_a_dynamic_batch(run_dir: Path, tmp_path: Path, format: str, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / f"model.{format}"
    code, out, err = run_cli(["export", str(run_dir), "--format", format, "-o", str(target)], capsys)
    assert code == 0, err
    meta = json.loads(target.with_name(target.name + ".json").read_text())
    assert meta["max_abs_difference"] < 1e-4 and meta["torch"] == torch.__version__
    model = load_run_model(run_dir, "cpu")
    images = model.dataset().batch(range(3))[0]
    expected = model.embed(images).numpy()
    if format == "onnx":
        import onnxruntime

        assert meta["opset"] >= 17
        session = onnxruntime.InferenceSession(str(target), providers=["CPUExecutionProvider"])
        produced = session.run(None, {"images": images.numpy()})[0]
    else:
        produced = torch.jit.load(str(target))(images).detach().numpy()
    np.testing.assert_allclose(produced, expected, atol=1e-4)


def test_export_without_a_checkpoint_is_one_line(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "checkpoint_best.pt").unlink()
    code, _, err = run_cli(["export", str(copy), "--format", "onnx", "-o", str(tmp_path / "m.onnx")], capsys)
    assert code == 2 and "has no checkpoint" in err and not (tmp_path / "m.onnx").exists()
    code, _, err = run_cli(["export", str(run_dir), "--format", "tflite", "-o", str(tmp_path / "m")], capsys)
    assert code == 2 and "onnx, torchscript" in err


def test_evaluate_per_query_worst_page_and_verification(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli([
        "evaluate", str(run_dir), "--per-query", str(tmp_path / "pq.csv"), "--worst", "3", "--html", str(tmp_path / "w.html"),
        "--verification", "--roc", str(tmp_path / "roc.png"), "--json", str(tmp_path / "r.json"),
    ], capsys)
    assert code == 0, err
    import csv

    rows = list(csv.DictReader((tmp_path / "pq.csv").open()))
    results = json.loads((tmp_path / "r.json").read_text())
    assert len(rows) == results["num_queries"]
    assert list(rows[0]) == ["query", "path", "label", "relevant", "first_correct_rank", "average_precision_at_r"]
    map_at_r = np.mean([float(row["average_precision_at_r"]) for row in rows])
    precision_at_1 = np.mean([row["first_correct_rank"] == "1" for row in rows])
    assert map_at_r == pytest.approx(results["map_at_r"], abs=1e-6)
    assert precision_at_1 == pytest.approx(results["precision_at_1"], abs=1e-12)
    assert (tmp_path / "w.html").read_text().count("AP@R") >= 3
    points = results["verification"]["operating_points"]
    assert [point["target_fmr"] for point in points] == [0.1, 0.01, 0.001, 0.0001]
    assert all(point["fmr"] <= point["target_fmr"] for point in points)
    assert (tmp_path / "roc.png").stat().st_size > 1000
    _check_in_browser(tmp_path / "w.html", tmp_path / "w_shot.png")


def test_diagnostic_options_need_a_run(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "e.npy", np.eye(4, dtype=np.float32))
    np.save(tmp_path / "l.npy", np.array([0, 0, 1, 1]))
    code, _, err = run_cli(["evaluate", "--embeddings", str(tmp_path / "e.npy"), "--labels", str(tmp_path / "l.npy"), "--verification"], capsys)
    assert code == 2 and "RUN's test split" in err
    code, _, err = run_cli(["evaluate", str(run_dir), "--worst", "3"], capsys)
    assert code == 2 and "go together" in err


def test_a_run_on_image_files_embeds_queries_and_diagnoses_queries_against_the_gallery(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import replicas

    root = replicas.csv(tmp_path / "data", extra_train=3)
    run = tmp_path / "run"
    code, _, err = run_cli([
        "train", "configs/glyphs.yaml", "--output", str(run), "-q", "data.name=csv", f"data.root={root}", "data.image_size=16",
        "data.validation_fraction=0.4", "model.options={in_channels: 3, width: 4}", "model.embedding_dim=8", "training.epochs=1",
        "training.batch_size=4", "sampler.params={samples_per_class: 2}", "training.max_steps_per_epoch=1",
        "evaluation.metrics=[precision_at_1, map_at_r]",
    ], capsys)
    assert code == 0, err
    code, _, err = run_cli(["embed", str(run), "--data", "csv", "-o", str(tmp_path / "emb"), "-q"], capsys)
    assert code == 0, err
    stored = EmbeddingSet.load(tmp_path / "emb")
    assert all(Path(path).is_file() for path in stored.paths)
    assert run_cli(["index", str(tmp_path / "emb"), "-o", str(tmp_path / "idx")], capsys)[0] == 0
    # A stored file as a query image goes through the file datasets' evaluation view: it finds itself.
    code, _, err = run_cli(["query", str(tmp_path / "idx"), "--image", stored.paths[4], "-k", "2", "--json", str(tmp_path / "q.json")], capsys)
    assert code == 0, err
    first = json.loads((tmp_path / "q.json").read_text())[0]["neighbors"][0]
    assert first["distance"] < 1e-5 and stored.embeddings[first["index"]] == pytest.approx(stored.embeddings[4], abs=1e-5)
    code, _, err = run_cli(["evaluate", str(run), "--per-query", str(tmp_path / "pq.csv"), "--json", str(tmp_path / "r.json")], capsys)
    assert code == 0, err
    import csv

    rows = list(csv.DictReader((tmp_path / "pq.csv").open()))
    assert len(rows) == json.loads((tmp_path / "r.json").read_text())["num_queries"] == 2  # queries only


def test_nan_embeddings_are_refused_and_no_set_is_written(run_dir: Path, tmp_path: Path) -> None:
    from dmlbench.errors import UserInputError

    model = load_run_model(run_dir)
    dataset = model.dataset()
    collection = dataset_collection(dataset, {"data": "glyphs", "root": None})
    model.embed = lambda images: torch.full((len(images), model.embedding_dim), float("nan"))  # type: ignore[method-assign]
    with pytest.raises(UserInputError, match="NaN or infinite embeddings for rows 0..99"):
        embed_collection(model, collection, tmp_path / "e", spec=model.input_spec(dataset), batch_size=100, progress=False)
    assert not (tmp_path / "e.npy").exists()
