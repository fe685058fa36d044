"""Exporting a run's embedding model (trunk + head + normalisation) to ONNX or TorchScript.

Both formats take ``images`` ``[batch, C, H, W]`` with a dynamic batch dimension and return
``embeddings`` ``[batch, D]``. The export is checked against PyTorch on a batch of the run's own
evaluation images of a size other than the one traced with, and the largest absolute difference is
recorded beside the file (``FILE.json``) with the opset and library versions.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dmlbench import __version__, files, provenance
from dmlbench.deploy.images import InputSpec
from dmlbench.deploy.model import RunModel
from dmlbench.errors import ParameterError, UserInputError
from dmlbench.files import atomic_write

FORMATS = ("onnx", "torchscript")
TOLERANCE = 1e-4
ONNX_OPSET = 18
# Traced with one batch size, checked with another: a batch dimension frozen by mistake shows up.
_TRACE_BATCH, _CHECK_BATCH = 2, 5


def export_model(run: RunModel, spec: InputSpec, sample: Tensor, out: str | Path, *, format: str) -> dict[str, Any]:
    """Write the model to ``out`` and ``out.json``; ``sample``: model inputs to check it on."""
    if format not in FORMATS:
        raise ParameterError("format", f"must be one of {', '.join(FORMATS)}; got {format!r}")
    out = Path(out)
    if out.is_dir():
        raise UserInputError(f"-o {out} is a directory; name the file to write")
    out.parent.mkdir(parents=True, exist_ok=True)
    model = run.model.to("cpu").eval()
    check = sample[:_CHECK_BATCH].to(torch.float32)
    with torch.no_grad():
        expected = model(check).numpy()
    if format == "onnx":
        data, extra = _onnx_bytes(model, sample[:_TRACE_BATCH])
        produced = _run_onnx(data, check.numpy())
    else:
        data, extra = _torchscript_bytes(model, sample[:_TRACE_BATCH])
        produced = _run_torchscript(data, check)
    difference = float(np.abs(produced - expected).max())
    if not difference < TOLERANCE:
        raise UserInputError(
            f"the exported model differs from PyTorch by {difference:.3g} (limit {TOLERANCE}); nothing was written"
        )
    atomic_write(out, lambda stream: stream.write(data))
    meta = {
        "format": format,
        **extra,
        "input": {"name": "images", "shape": ["batch", spec.channels, spec.height, spec.width], "dtype": "float32", **spec.to_dict()},
        "output": {"name": "embeddings", "shape": ["batch", run.embedding_dim], "normalized": bool(run.config.model.normalize)},
        "max_abs_difference": difference,
        "checked_batch": len(check),
        "run": str(run.run_dir.resolve()),
        "checkpoint_epoch": run.epoch,
        "sha256": hashlib.sha256(data).hexdigest(),
        "exported": provenance.now(),
        "dmlbench": __version__,
        "torch": torch.__version__,
    }
    files.write_json(out.with_name(out.name + ".json"), meta)
    return meta


def _onnx_bytes(model: torch.nn.Module, example: Tensor) -> tuple[bytes, dict[str, Any]]:
    try:
        import onnx
        import onnxscript  # noqa: F401  (torch's exporter needs it; a missing one is named here, not deep inside torch)
    except ImportError:
        raise UserInputError("ONNX export needs the export extra: pip install 'dmlbench[export]'") from None
    batch = torch.export.Dim("batch", min=1)
    with _quiet():
        program = torch.onnx.export(
            model, (example,), input_names=["images"], output_names=["embeddings"],
            dynamic_shapes={"images": {0: batch}}, opset_version=ONNX_OPSET, dynamo=True, verbose=False,
        )
    proto = program.model_proto
    onnx.checker.check_model(proto)
    opset = next(entry.version for entry in proto.opset_import if entry.domain in ("", "ai.onnx"))
    return proto.SerializeToString(), {"opset": int(opset), "onnx": onnx.__version__}


def _run_onnx(data: bytes, images: np.ndarray) -> np.ndarray:
    try:
        import onnxruntime
    except ImportError:
        raise UserInputError("checking an ONNX export needs the export extra: pip install 'dmlbench[export]'") from None
    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    return session.run(["embeddings"], {"images": images})[0]


def _torchscript_bytes(model: torch.nn.Module, example: Tensor) -> tuple[bytes, dict[str, Any]]:
    buffer = io.BytesIO()
    with _quiet(), torch.no_grad():
        traced = torch.jit.trace(model, example)
        torch.jit.save(traced, buffer)
    return buffer.getvalue(), {}


def _run_torchscript(data: bytes, images: Tensor) -> np.ndarray:
    with _quiet(), torch.no_grad():
        loaded = torch.jit.load(io.BytesIO(data))
        return loaded(images).numpy()


@contextlib.contextmanager
def _quiet():
    """torch's exporters print progress and deprecation notes; the command prints its own summary."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield
