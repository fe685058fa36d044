"""Downloads of datasets and weights: resumed with HTTP range requests where the server allows (a
clean restart where it does not), shown with a progress bar, checked against pinned sums before the
file takes its name. ``--mirror URL`` / ``DMLBENCH_MIRROR`` look the same file names up under another
base address (a proxy, a local copy; a folder path works too); ``--offline`` / ``DMLBENCH_OFFLINE=1``
forbid every download and name the file to place by hand."""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dmlbench import __version__
from dmlbench.errors import UserInputError

OFFLINE_VARIABLE = "DMLBENCH_OFFLINE"
MIRROR_VARIABLE = "DMLBENCH_MIRROR"
PART_SUFFIX = ".part"
BLOCK = 1 << 20
TIMEOUT_SECONDS = 60


def offline() -> bool:
    """Whether downloads are forbidden (``--offline`` sets the variable for the whole command)."""
    return os.environ.get(OFFLINE_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


def mirror_base(explicit: str | None = None) -> str | None:
    """The mirror's base address: ``--mirror``, else ``DMLBENCH_MIRROR``, else none; a folder becomes a file URL."""
    base = explicit or os.environ.get(MIRROR_VARIABLE) or None
    if base is not None and "://" not in base:
        folder = Path(base).expanduser()
        if not folder.is_dir():
            raise UserInputError(f"mirror {base} is neither a URL nor a folder")
        base = folder.resolve().as_uri()
    if base is not None:
        parsed = urllib.parse.urlsplit(base)
        if parsed.scheme not in ("http", "https", "file"):
            raise UserInputError(f"mirror {base} must be an http://, https:// or file:// address, or a folder")
        if parsed.scheme != "file" and not parsed.netloc:
            raise UserInputError(f"mirror {base} names no host: give it as http://HOST[:PORT]/PATH")
    return base


@dataclass(frozen=True)
class Remote:
    """A file to download: its name (the name looked up under a mirror), official address and pinned sums."""

    name: str
    url: str
    sha256: str | None = None
    md5: str | None = None
    sha256_prefix: str | None = None  # the hex digits a torch.hub file name carries (``name_hash_prefix``)

    def address(self, mirror: str | None) -> str:
        return f"{mirror.rstrip('/')}/{self.name}" if mirror else self.url


def file_digests(path: Path) -> tuple[str, str]:
    """sha256 and md5 of a file (one read; md5 only where a publisher pins nothing stronger)."""
    sha256, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(BLOCK), b""):
            sha256.update(block)
            md5.update(block)
    return sha256.hexdigest(), md5.hexdigest()


def check_sums(path: Path, remote: Remote, source: str) -> str:
    """``path``'s sha256 once it matches what ``remote`` pins; otherwise the file is deleted and a user error says so."""
    sha256, md5 = file_digests(path)
    for kind, expected, found in (("sha256", remote.sha256, sha256), ("md5", remote.md5, md5)):
        if expected is not None and found != expected:
            path.unlink(missing_ok=True)
            raise UserInputError(f"{source} has {kind} {found}, not the pinned {expected} (truncated or altered); "
                                 "deleted it, run the same command again")
    if remote.sha256_prefix is not None and not sha256.startswith(remote.sha256_prefix):
        path.unlink(missing_ok=True)
        raise UserInputError(f"{source} has sha256 {sha256}, which does not start with the {remote.sha256_prefix} "
                             "its name carries (truncated or altered); deleted it, run the same command again")
    return sha256


def name_hash_prefix(name: str) -> str | None:
    """The hex digits between a ``-`` and a ``.`` of a file name (``resnet50-0676ba61.pth``): the start
    of the file's sha256, as ``torch.hub.load_state_dict_from_url`` reads it (its ``HASH_REGEX``)."""
    match = re.search(r"-([0-9a-f]{6,})\.", name)
    return match.group(1) if match else None


def download(remote: Remote, destination: Path, *, mirror: str | None, quiet: bool = False) -> str:
    """``destination`` holding ``remote`` (downloaded unless already there), checked; returns its sha256.

    The bytes arrive in ``destination.part`` (kept across interruptions, resumed from its end) and
    the file takes its name only once its sums match."""
    source = remote.address(mirror)
    if destination.is_file():
        return check_sums(destination, remote, str(destination))
    destination.parent.mkdir(parents=True, exist_ok=True)  # where the file goes, also by hand
    if offline():
        raise UserInputError(f"offline: {destination} is missing; download {source} and place it there by hand "
                             f"(or run without --offline / {OFFLINE_VARIABLE})")
    part = destination.with_name(destination.name + PART_SUFFIX)
    transfer(source, part, quiet=quiet)
    digest = check_sums(part, remote, source)
    os.replace(part, destination)
    return digest


def transfer(url: str, part: Path, *, quiet: bool = False) -> None:
    """Append the rest of ``url`` to ``part`` (a range request from its current size), or rewrite it
    whole where the server ignores ranges; a broken connection is a user error that says to run again."""
    have = part.stat().st_size if part.is_file() else 0
    headers = {"User-Agent": f"dmlbench/{__version__}"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_SECONDS)
    except urllib.error.HTTPError as error:
        if error.code == 416 and have:  # RFC 9110 15.5.17: the range starts at the end; nothing is left
            return
        raise UserInputError(f"cannot download {url}: HTTP {error.code} {error.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        reason = getattr(error, "reason", None) or error
        raise UserInputError(f"cannot download {url}: {reason}; run the same command again") from None
    with response:
        # A 206 whose Content-Range starts where the part ends continues it; anything else is the whole file.
        resumed = have > 0 and getattr(response, "status", None) == 206 and _range_start(response) == have
        if not resumed:
            have = 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else None
        # read1: what has arrived (up to a block), so that the part and the bar grow as bytes come in.
        _copy(getattr(response, "read1", response.read), part, "ab" if resumed else "wb", have, total, url, quiet)


def _range_start(response: object) -> int | None:
    match = re.match(r"bytes (\d+)-", getattr(response, "headers", {}).get("Content-Range", "") or "")
    return int(match.group(1)) if match else None


def _copy(read: Callable[[int], bytes], part: Path, mode: str, have: int, total: int | None, url: str,
          quiet: bool) -> None:
    """Blocks from ``read`` written to ``part`` behind a progress bar (shown on a terminal only)."""
    from tqdm import tqdm

    with open(part, mode, buffering=0) as stream, tqdm(total=total, initial=have, unit="B", unit_scale=True, unit_divisor=1024,
                                         desc=part.name.removesuffix(PART_SUFFIX), disable=True if quiet else None,
                                         leave=False) as bar:
        while True:
            try:
                block = read(BLOCK)
            except (OSError, http.client.HTTPException) as error:
                raise UserInputError(f"the connection to {url} broke after {have} bytes ({type(error).__name__}); "
                                     "run the same command again to resume") from None
            if not block:
                break
            try:
                view = memoryview(block)
                while view:  # an unbuffered write may take part of a block
                    view = view[stream.write(view):]
            except OSError as error:  # name the file: a full disk's message says where space is missing
                raise OSError(error.errno, error.strerror, str(part)) from None
            have += len(block)
            bar.update(len(block))
    if total is not None and have < total:
        raise UserInputError(f"the connection to {url} broke after {have} of {total} bytes; "
                             "run the same command again to resume")
