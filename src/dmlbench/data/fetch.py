"""``dmlbench data fetch cub200|cars196|sop|inshop``: download the official files (``data/sources.py``),
check their sums, unpack them into a hidden folder beside the dataset and rename that into place, so
that ``ROOT/<folder>`` is either absent or complete; a record of what was fetched (addresses, sha256,
terms, citation) lies inside it as ``dmlbench-fetch.json``.

Downloads wait in ``ROOT/.dmlbench-downloads/`` (``NAME.part`` while incomplete: the same command
resumes it) and are deleted once unpacked."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tarfile
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dmlbench import __version__
from dmlbench.data.base import DATASETS, dataset_source
from dmlbench.data.sources import SOURCES, Part, Source
from dmlbench.download import Remote, download
from dmlbench.errors import ParameterError, UserInputError
from dmlbench.files import atomic_write_text, write_json

DOWNLOADS = ".dmlbench-downloads"
RECORD = "dmlbench-fetch.json"
# A JSON file {file name: {"sha256": ..., "md5": ...}} that replaces the pinned sums (the tests' replica
# archives); every command that uses it says so on its first line and records the file in RECORD.
SUMS_VARIABLE = "DMLBENCH_FETCH_SUMS"


@dataclass(frozen=True)
class Fetched:
    folder: Path
    action: str  # "present" (fetched before, nothing done) or "unpacked"
    record: dict[str, Any]


def fetch(dataset: str, root: Path, *, mirror: str | None = None, quiet: bool = False,
          report: Callable[[str], None] = print) -> Fetched:
    """Make ``root/<folder>`` hold ``dataset`` as its reader expects it; a folder fetched before is left as it is."""
    if dataset not in SOURCES:
        known = [name for name in DATASETS.names() if dataset_source(name).fetch is not None]
        raise UserInputError(f"cannot fetch {dataset!r}; known: {', '.join(known)}")
    source = SOURCES[dataset]
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ParameterError("root", f"{root} cannot be created: {error.strerror or error}") from None
    target = root / source.folder
    if target.exists():
        if not (target / RECORD).is_file():
            raise UserInputError(f"{target} exists but data fetch did not unpack it (no {RECORD}): give it as "
                                 "data.root as it is, or move it away and fetch again")
        return Fetched(target, "present", json.loads((target / RECORD).read_text()))
    sums_file = os.environ.get(SUMS_VARIABLE)
    if sums_file:
        report(f"warning: checking against the sums in {sums_file} ({SUMS_VARIABLE}), not the pinned ones")
    downloads = root / DOWNLOADS
    try:
        files = [_download(part.remote, downloads, sums_file, mirror, quiet, report) for part in source.parts]
    except UserInputError as error:
        if not source.when_unreachable:
            raise
        raise UserInputError(f"{error}; {source.when_unreachable}") from None
    record = {"dataset": dataset, "files": files, "terms": source.terms, "citation": source.citation,
              "sums": sums_file or "pinned in dmlbench.data.sources", "dmlbench": __version__,
              "fetched": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _unpack(source, downloads, root, record)
    for part in source.parts:
        (downloads / part.remote.name).unlink(missing_ok=True)
    return Fetched(target, "unpacked", record)


def _download(remote: Remote, downloads: Path, sums_file: str | None, mirror: str | None, quiet: bool,
              report: Callable[[str], None]) -> dict[str, Any]:
    """One file downloaded and checked against its pinned sums, or its sha256 recorded on first use."""
    if sums_file:
        remote = _replaced(remote, Path(sums_file))
    trusted = _trusted_path(downloads, remote.name)
    recorded = trusted.read_text().strip() if trusted.is_file() else None
    if remote.sha256 is None and recorded:
        remote = replace(remote, sha256=recorded)
    pinned = remote.sha256 is not None
    digest = download(remote, downloads / remote.name, mirror=mirror, quiet=quiet)
    if recorded:
        checked = "sha256 recorded on first use"
    elif pinned:
        checked = "pinned sha256"
    else:
        atomic_write_text(trusted, digest + "\n")
        checked = "pinned md5; sha256 recorded on first use" if remote.md5 else "sha256 recorded on first use"
        report(f"trust on first use: no sha256 is published for {remote.name}; recorded {digest} in {trusted}, "
               "later downloads are checked against it")
    return {"name": remote.name, "url": remote.address(mirror), "sha256": digest, "checked": checked}


def _replaced(remote: Remote, sums_file: Path) -> Remote:
    try:
        table = json.loads(sums_file.read_text())
    except (OSError, ValueError) as error:
        raise UserInputError(f"{SUMS_VARIABLE}={sums_file} is not a readable JSON file: {error}") from None
    sums = table.get(remote.name) if isinstance(table, dict) else None
    if not isinstance(sums, dict):
        raise UserInputError(f"{SUMS_VARIABLE}={sums_file} has no entry for {remote.name}")
    return replace(remote, sha256=sums.get("sha256"), md5=sums.get("md5"))


def _trusted_path(downloads: Path, name: str) -> Path:
    return downloads / f"{name}.sha256"


def _unpack(source: Source, downloads: Path, root: Path, record: dict[str, Any]) -> None:
    """Build the dataset's folder in a hidden staging folder under ``root``, then rename it into place."""
    for leftover in root.glob(f".dmlbench-unpacking-{source.folder}-*"):  # of a process that was killed
        shutil.rmtree(leftover, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".dmlbench-unpacking-{source.folder}-", dir=root))
    try:
        for part in source.parts:
            _place(part, downloads, staging)
        built = staging / source.folder
        if not built.is_dir():
            names = ", ".join(part.remote.name for part in source.parts)
            raise UserInputError(f"{names} hold no {source.folder}/ folder; not the archive this dataset expects")
        _open_with_reader(record["dataset"], built)
        write_json(built / RECORD, record)
        # One rename on one filesystem: the reader sees no folder or the whole of it.
        os.rename(built, root / source.folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


LISTING_IMAGE_SIZE = 8  # ``_open_with_reader``'s: nothing is decoded at it


def _open_with_reader(dataset: str, folder: Path) -> None:
    """The dataset's reader lists its images from ``folder`` (still hidden), or a user error."""
    from dmlbench.data.base import build

    try:
        # Listing the files is the check. At the smallest image size the reader's upscaling warning stays quiet:
        # the data check after the move gives it, once, for the folder the user names (it named the staging too).
        build(dataset, root=str(folder), image_size=LISTING_IMAGE_SIZE)
    except UserInputError as error:
        raise UserInputError(f"the unpacked files are not the layout the {dataset} reader expects ({error})") from None


def _place(part: Part, downloads: Path, staging: Path) -> None:
    path = downloads / part.remote.name
    destination = staging / part.into
    destination.parent.mkdir(parents=True, exist_ok=True)
    if not part.archive:
        shutil.copyfile(path, destination)
        return
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                archive.extractall(destination)  # zipfile drops absolute paths and ".." from member names
        else:
            with tarfile.open(path) as archive:
                archive.extractall(destination, filter="data")  # no links out, no absolute paths, no devices
                # tarfile ends quietly at a damaged header; reading the compressed rest checks its CRC.
                while archive.fileobj is not None and archive.fileobj.read(1 << 20):
                    pass
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, gzip.BadGzipFile) as error:
        path.unlink(missing_ok=True)
        _trusted_path(downloads, part.remote.name).unlink(missing_ok=True)
        raise UserInputError(f"{part.remote.name} is not a readable archive ({type(error).__name__}: {error}); "
                             "deleted it, run the same command again") from None
