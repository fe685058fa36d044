"""``dmlbench embed``, ``export``, ``index`` and ``query``: using a trained model."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dmlbench.cli.common import Command
from dmlbench.errors import UserInputError


def register(app: typer.Typer) -> None:
    app.command("embed", cls=Command)(embed_command)
    app.command("export", cls=Command)(export_command)
    app.command("index", cls=Command)(index_command)
    app.command("query", cls=Command)(query_command)


def embed_command(
    run: Annotated[Path, typer.Argument(help="A completed training run directory.", show_default=False)],
    output: Annotated[Path, typer.Option("-o", "--output", help="Prefix EMB: writes EMB.npy, EMB.labels.npy, EMB.paths.txt, EMB.json.", show_default=False)],
    data: Annotated[Optional[str], typer.Option("--data", help="A dataset by name (the run's own with its options when it is the run's).", show_default=False)] = None,
    root: Annotated[Optional[Path], typer.Option("--root", help="With --data: the dataset's root (as data.root).", show_default=False)] = None,
    images: Annotated[Optional[Path], typer.Option("--images", help="A folder of image files (recursively, sorted; no labels).", show_default=False)] = None,
    batch_size: Annotated[int, typer.Option(help="Images per batch.")] = 256,
    device: Annotated[Optional[str], typer.Option(help="cpu, cuda, ... (default: the run's training.device).", show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Embed every image with the run's best checkpoint and evaluation transform (resumable: rerun
    the same command after an interruption)."""
    from dmlbench.deploy import embeddings as store
    from dmlbench.deploy.images import list_images, split_readable
    from dmlbench.deploy.model import load_run_model

    if (data is None) == (images is None):
        raise UserInputError("give exactly one of --data NAME or --images DIR")
    if root is not None and data is None:
        raise UserInputError("--root goes with --data")
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
    run: Annotated[Path, typer.Argument(help="A completed training run directory.", show_default=False)],
    format: Annotated[str, typer.Option("--format", help="onnx or torchscript.", show_default=False)],
    output: Annotated[Path, typer.Option("-o", "--output", help="The model file to write (FILE.json is written beside it).", show_default=False)],
) -> None:
    """Export trunk + head + normalisation with a dynamic batch dimension, checked against PyTorch."""
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
    output: Annotated[Path, typer.Option("-o", "--output", help="The index directory to create.", show_default=False)],
    kind: Annotated[str, typer.Option("--kind", help="exact, ivf or hnsw.")] = "exact",
    seed: Annotated[int, typer.Option(help="Seed of the ivf clustering and of the recall sample.")] = 0,
    nprobe: Annotated[Optional[int], typer.Option(help="ivf: lists probed per query (default nlist / 8).", show_default=False)] = None,
    ef_search: Annotated[int, typer.Option(help="hnsw: candidate list size while searching.")] = 64,
) -> None:
    """A faiss index over the embeddings, stored with their paths and labels."""
    from dmlbench.deploy.embeddings import EmbeddingSet
    from dmlbench.deploy.index import build_index

    index = build_index(EmbeddingSet.load(embeddings), output, kind=kind, seed=seed, nprobe=nprobe, ef_search=ef_search)
    recall = index.meta.get("recall_at_10")
    measured = "" if recall is None else f", recall@10 against exact {recall:.4f}"
    typer.echo(f"{output}: {index.kind} index of {len(index)} x {index.dim} ({index.meta['build_seconds']:.2f} s){measured}")


def query_command(
    index: Annotated[Path, typer.Argument(metavar="INDEX", help="An index directory written by dmlbench index.", show_default=False)],
    k: Annotated[int, typer.Option("-k", "--k", help="Neighbours per query.")] = 10,
    image: Annotated[Optional[Path], typer.Option("--image", help="An image file, embedded with the index's run.", show_default=False)] = None,
    label: Annotated[Optional[int], typer.Option("--label", help="With --image: its label, to mark correct neighbours.", show_default=False)] = None,
    query_embeddings: Annotated[Optional[Path], typer.Option("--embeddings", help="Query embeddings Q.npy [Q, D] (an embed output brings its paths and labels).", show_default=False)] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write every query's neighbors here.", show_default=False)] = None,
    html: Annotated[Optional[Path], typer.Option("--html", help="Write a page of queries and neighbour thumbnails here.", show_default=False)] = None,
    device: Annotated[Optional[str], typer.Option(help="With --image: device of the model.", show_default=False)] = None,
) -> None:
    """The K nearest stored items of each query, nearest first (ties broken by index)."""
    from dmlbench.deploy import query as querying
    from dmlbench.deploy.index import StoredIndex

    if (image is None) == (query_embeddings is None):
        raise UserInputError("give exactly one of --image FILE or --embeddings Q.npy")
    if label is not None and image is None:
        raise UserInputError("--label goes with --image")
    stored = StoredIndex.load(index)
    queries = (
        querying.image_queries(stored, image, label, device) if image is not None
        else querying.embedding_queries(query_embeddings)
    )
    answers = querying.answer(stored, queries, k)
    for name, hits in zip(queries.names, answers):
        typer.echo(name)
        for rank, hit in enumerate(hits, start=1):
            label_text = "" if hit.label is None else f"  label {hit.label}"
            typer.echo(f"  {rank:>3}. {hit.distance:.6f}  #{hit.index}{label_text}  {hit.path}")
    if json_path is not None:
        querying.write_json(json_path, queries, answers)
    if html is not None:
        querying.write_html(html, stored, queries, answers)
        typer.echo(f"page: {html}")
