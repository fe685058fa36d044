"""A file server on 127.0.0.1 for the download tests (range requests, a connection dropped mid-body,
a slow body), and archives of the replicas in each dataset's official layout."""

from __future__ import annotations

import hashlib
import io
import json
import socket
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import replicas


@dataclass
class Served:
    """What the server answers: ``files`` by name; ``drop_after[name]`` bytes of the next answer, then the
    connection is cut; ``ranges`` whether Range is honoured; ``pause`` seconds between 1 KiB blocks."""

    files: dict[str, bytes] = field(default_factory=dict)
    drop_after: dict[str, int] = field(default_factory=dict)
    ranges: bool = True
    pause: float = 0.0
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    url: str = ""


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        state: Served = self.server.state  # type: ignore[attr-defined]
        name = self.path.lstrip("/").split("?")[0]
        asked = self.headers.get("Range")
        state.requests.append((name, asked))
        body = state.files.get(name)
        if body is None:
            self.send_error(404)
            return
        start = int(asked.removeprefix("bytes=").split("-")[0]) if asked and state.ranges else 0
        if start >= len(body) > 0:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(body)}")
            self.end_headers()
            return
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        self._send(body[start:], state.drop_after.pop(name, None), state.pause)

    def _send(self, payload: bytes, drop: int | None, pause: float) -> None:
        try:
            for offset in range(0, len(payload) if drop is None else drop, 1024):
                self.wfile.write(payload[offset:offset + 1024 if drop is None else min(offset + 1024, drop)])
                self.wfile.flush()
                time.sleep(pause)
            if drop is not None:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # the client went away (a test stopped it)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Served]:
    state = Served()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.state = state  # type: ignore[attr-defined]
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()


def _tgz(folder: Path, arcname: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(folder, arcname=arcname)
    return buffer.getvalue()


def _zip(folder: Path, arcname: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in sorted(folder.rglob("*")):
            archive.write(path, f"{arcname}/{path.relative_to(folder).as_posix()}")
    return buffer.getvalue()


def official_files(dataset: str, scratch: Path) -> dict[str, bytes]:
    """The files ``data fetch`` downloads for ``dataset``, built from its replica in the official layout."""
    base = replicas.BUILDERS[dataset](scratch)
    if dataset == "cub200":
        return {"CUB_200_2011.tgz": _tgz(base, "CUB_200_2011")}
    if dataset == "sop":
        return {"Stanford_Online_Products.zip": _zip(base, "Stanford_Online_Products")}
    if dataset == "cars196":
        return {"car_ims.tgz": _tgz(base / "car_ims", "car_ims"), "cars_annos.mat": (base / "cars_annos.mat").read_bytes()}
    return {"img.zip": _zip(base / "Img" / "img", "img"),
            "list_eval_partition.txt": (base / "Eval" / "list_eval_partition.txt").read_bytes()}


def write_sums(path: Path, files: dict[str, bytes], kind: str = "sha256") -> Path:
    """The sums table (``DMLBENCH_FETCH_SUMS``) pinning ``files`` by ``kind`` (``none``: nothing pinned)."""
    table = {name: ({} if kind == "none" else {kind: hashlib.new(kind, data).hexdigest()}) for name, data in files.items()}
    path.write_text(json.dumps(table))
    return path
