"""``dmlbench embed``, ``export``, ``index`` and ``query``: using a trained model."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dmlbench.cli.common import QUIET_HELP, QUIET_SILENT_HELP, Command, require_directory, require_file, require_run_dir, rerank_option
from dmlbench.errors import UserInputError


def register(app: typer.Typer) -> None:
    app.command("embed", cls=Command)(embed_command)
    app.command("export", cls=Command)(export_command)
    app.command("index", cls=Command)(index_command)
    app.command("query", cls=Command)(query_command)


def embed_command(
    run: Annotated[Path, typer.Argument(metavar="RUN", help="A completed training run directory.", show_default=False)],
    output: Annotated[Path, typer.Option("-o", "--output", metavar="EMB", help="Prefix EMB: writes EMB.npy, EMB.labels.npy, EMB.paths.txt, EMB.json.", show_default=False)],
    data: Annotated[Optional[str], typer.Option("--data", metavar="NAME", help="A dataset by name (the run's own with its options when it is the run's).", show_default=False)] = None,
    root: Annotated[Optional[Path], typer.Option("--root", metavar="PATH", help="With --data: the dataset's root (as data.root).", show_default=False)] = None,
    images: Annotated[Optional[Path], typer.Option("--images", metavar="DIR", help="A folder of image files (recursively, sorted; no labels).", show_default=False)] = None,
    batch_size: Annotated[int, typer.Option(metavar="N", help="Images per batch.")] = 256,
    device: Annotated[Optional[str], typer.Option(metavar="DEVICE", help="cpu, cuda, ... (default: the run's training.device).", show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_HELP)] = False,
) -> None:
    """Embed every image with the run's best checkpoint and evaluation transform (resumable: rerun
    the same command after an interruption).

    Exit codes: 0 embedded (or already complete), 1 a write failed for lack of space, 2 bad input,
    130 interrupted by Ctrl-C, 143 by SIGTERM (the same command continues).
    """
    if (data is None) == (images is None):
        raise UserInputError("give exactly one of --data NAME or --images DIR")
    if root is not None and data is None:
        raise UserInputError("--root goes with --data")
    # Paths first: a missing one is reported before torch is imported.
    require_run_dir(run)
    if images is not None:
        require_directory(images, "--images")
    if root is not None and not root.exists():
        raise UserInputError(f"--root {root} does not exist")
    from dmlbench.deploy import embeddings as store
    from dmlbench.deploy.images import list_images, split_readable
    from dmlbench.deploy.model import load_run_model

    model = load_run_model(run, device)
    if data is not None:
        dataset = model.other_dataset(data, root)
        collection = store.dataset_collection(dataset, {"data": data, "root": None if root is None else str(root.resolve())})
        spec = model.input_spec(dataset)
    else:
        spec = model.input_spec(model.dataset())
        files, unreadable = split_readable(list_images(images))
        if not files:
            raise UserInputError(f"--images {images}: none of its {len(unreadable)} image files can be decoded")
        if unreadable:
            print(f"dmlbench: warning: skipping {len(unreadable)} unreadable image files under {images} "
                  "(listed in the output's .json as source.unreadable)", file=sys.stderr, flush=True)
        collection = store.image_collection(files, spec, {
            "images": str(images.resolve()), "unreadable": [str(path) for path in unreadable]})
    result, computed = store.embed_collection(model, collection, output, spec=spec, batch_size=batch_size, progress=not quiet)
    state = "already complete, nothing computed" if computed == 0 else f"{computed} embedded now"
    typer.echo(f"{store.side_file(result.prefix, '.npy')}: {len(result.paths)} x {result.embeddings.shape[1]} ({state})")


def export_command(
    run: Annotated[Path, typer.Argument(metavar="RUN", help="A completed training run directory.", show_default=False)],
    format: Annotated[str, typer.Option("--format", metavar="FORMAT", help="onnx or torchscript.", show_default=False)],
    output: Annotated[Path, typer.Option("-o", "--output", metavar="FILE", help="The model file to write (FILE.json is written beside it).", show_default=False)],
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_SILENT_HELP)] = False,
) -> None:
    """Export trunk + head + normalisation with a dynamic batch dimension, checked against PyTorch.

    Exit codes: 0 exported, 1 a write failed for lack of space, 2 bad input, 130 interrupted by
    Ctrl-C, 143 by SIGTERM.
    """
    require_run_dir(run)  # before torch is imported
    from dmlbench.deploy.export import FORMATS, TOLERANCE, export_model
    from dmlbench.deploy.model import load_run_model
    from dmlbench.training.setup import make_splits

    if format not in FORMATS:
        raise UserInputError(f"--format must be one of {', '.join(FORMATS)}; got {format!r}")
    model = load_run_model(run, "cpu")
    dataset = model.dataset()
    # The check batch comes from the training classes: an export never needs to open the test split.
    sample, _, _ = dataset.batch(make_splits(model.config, dataset, test=False).train[:8])
    meta = export_model(model, model.input_spec(dataset), sample, output, format=format)
    opset = f", opset {meta['opset']}" if "opset" in meta else ""
    typer.echo(
        f"{output}: {format}{opset}, input [batch, {', '.join(str(v) for v in meta['input']['shape'][1:])}], "
        f"max abs difference to PyTorch {meta['max_abs_difference']:.2e} (< {TOLERANCE:g}) on {meta['checked_batch']} images"
    )


def index_command(
    embeddings: Annotated[Path, typer.Argument(metavar="EMB", help="An embedding set written by dmlbench embed (EMB or EMB.npy).", show_default=False)],
    output: Annotated[Path, typer.Option("-o", "--output", metavar="DIR", help="The index directory to create.", show_default=False)],
    kind: Annotated[str, typer.Option("--kind", metavar="KIND", help="exact, ivf or hnsw.")] = "exact",
    seed: Annotated[int, typer.Option(metavar="N", help="Seed of the ivf clustering and of the recall sample.")] = 0,
    nprobe: Annotated[Optional[int], typer.Option(metavar="N", help="ivf: lists probed per query (default nlist / 8).", show_default=False)] = None,
    ef_search: Annotated[int, typer.Option(metavar="N", help="hnsw: candidate list size while searching.")] = 64,
    calibration: Annotated[Optional[Path], typer.Option("--calibration", metavar="FILE", help="A calibration.json of the same model, stored with the index for query.", show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_SILENT_HELP)] = False,
) -> None:
    """A faiss index over the embeddings, stored with their paths and labels.

    Exit codes: 0 built, 1 a write failed for lack of space, 2 bad input, 130 interrupted by Ctrl-C,
    143 by SIGTERM.
    """
    array_file = _array_file(embeddings)
    # An incomplete set (EMB.npy.partial) is left to EmbeddingSet.load, which says how to finish it.
    if not array_file.is_file() and not array_file.with_name(array_file.name + ".partial").is_file():
        raise UserInputError(f"embeddings {array_file} do not exist")
    from dmlbench.deploy.embeddings import EmbeddingSet
    from dmlbench.deploy.index import build_index

    index = build_index(EmbeddingSet.load(embeddings), output, kind=kind, seed=seed, nprobe=nprobe, ef_search=ef_search,
                        calibration=calibration)
    recall = index.meta.get("recall_at_10")
    measured = "" if recall is None else f", recall@10 against exact {recall:.4f}"
    if index.calibration is not None:
        measured += f", calibration at FMR {', '.join(f'{t:g}' for t in index.meta['calibration']['target_fmrs'])}"
    typer.echo(f"{output}: {index.kind} index of {len(index)} x {index.dim} ({index.meta['build_seconds']:.2f} s){measured}")


def query_command(
    index: Annotated[Path, typer.Argument(metavar="INDEX", help="An index directory written by dmlbench index.", show_default=False)],
    k: Annotated[int, typer.Option("-k", "--k", metavar="K", min=1, help="Neighbours per query.")] = 10,
    image: Annotated[Optional[Path], typer.Option("--image", metavar="FILE", help="An image file, embedded with the index's run.", show_default=False)] = None,
    label: Annotated[Optional[str], typer.Option("--label", metavar="LABEL", help="With --image: its class name or label number, to mark correct neighbours.", show_default=False)] = None,
    query_embeddings: Annotated[Optional[Path], typer.Option("--embeddings", metavar="FILE", help="Query embeddings Q.npy [Q, D] (an embed output brings its paths and labels).", show_default=False)] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", metavar="FILE", help="Write every query's neighbors here.", show_default=False)] = None,
    html: Annotated[Optional[Path], typer.Option("--html", metavar="FILE", help="Write a page of queries and neighbour thumbnails here.", show_default=False)] = None,
    device: Annotated[Optional[str], typer.Option(metavar="DEVICE", help="With --image: device of the model.", show_default=False)] = None,
    calibration: Annotated[Optional[Path], typer.Option("--calibration", metavar="FILE", help="A calibration.json of the index's model: 'no match' beyond its threshold.", show_default=False)] = None,
    fmr: Annotated[Optional[float], typer.Option("--fmr", metavar="RATE", help="The calibration's target FMR (needed when it has several).", show_default=False)] = None,
    rerank: Annotated[Optional[str], typer.Option("--rerank", metavar="KIND", help="query_expansion: re-rank each query's list (alpha-QE with DBA over the stored items).", show_default=False)] = None,
    rerank_params: Annotated[Optional[list[str]], typer.Option("--rerank-param", metavar="NAME=VALUE", help="With --rerank: one of its parameters, e.g. alpha=3; repeat for several.", show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_SILENT_HELP)] = False,
) -> None:
    """The K nearest stored items of each query, nearest first (ties broken by index); with a
    calibration (given, or stored with the index), "no match" where the nearest is beyond its threshold;
    with --rerank query_expansion, the lists after query expansion.

    Exit codes: 0 answered, 2 bad input, 130 interrupted by Ctrl-C, 143 by SIGTERM.
    """
    if (image is None) == (query_embeddings is None):
        raise UserInputError("give exactly one of --image FILE or --embeddings Q.npy")
    if label is not None and image is None:
        raise UserInputError("--label goes with --image")
    # Paths first: a missing one is reported before torch and faiss are imported.
    if not (index / "index.json").is_file():
        raise UserInputError(f"{index} is not a dmlbench index (no index.json); build one with dmlbench index")
    if image is not None:
        require_file(image, "image")
    if query_embeddings is not None and not (query_embeddings.is_file() or _array_file(query_embeddings).is_file()):
        raise UserInputError(f"query embeddings file {query_embeddings} does not exist")
    from dmlbench.deploy import query as querying
    from dmlbench.deploy.index import StoredIndex

    asked = rerank_option(rerank, rerank_params)
    stored = StoredIndex.load(index)
    method = (None if asked is None else
              querying.query_reranking(asked["kind"], asked["params"], querying.calibration_source(stored, calibration)))
    threshold = querying.query_threshold(stored, calibration, fmr)
    queries = (
        querying.image_queries(stored, image, label, device) if image is not None
        else querying.embedding_queries(query_embeddings)
    )
    answers = querying.answer(stored, queries, k, method)
    for name, hits in zip(queries.names, answers):
        typer.echo(name)
        if threshold is not None:
            typer.echo(f"  {threshold.verdict(hits)}")
        for rank, hit in enumerate(hits, start=1):
            label_text = "" if hit.label is None else f"  label {hit.label}" + querying.class_name_text(stored, hit.label)
            typer.echo(f"  {rank:>3}. {hit.distance:.6f}  #{hit.index}{label_text}  {hit.path}")
    if json_path is not None:
        querying.write_json(json_path, queries, answers, threshold)
    if html is not None:
        querying.write_html(html, stored, queries, answers, threshold)
        typer.echo(f"page: {html}")


def _array_file(path: Path) -> Path:
    """The array of an embedding set named ``EMB`` or ``EMB.npy`` (``deploy.embeddings.prefix_of``,
    which imports torch)."""
    return path if path.suffix == ".npy" else path.with_name(path.name + ".npy")
