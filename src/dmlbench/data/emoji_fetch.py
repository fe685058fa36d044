"""``dmlbench data fetch emoji``: the ``emoji-datasource-<vendor>`` packages (version 16.0.0) from
the npm registry, checked against the sha256 pinned here, unpacked to the layout ``data/emoji.py``
reads: ``ROOT/emoji.json`` and ``ROOT/img/<vendor>/64/``. Nothing else of a package is extracted.

``npm pack`` downloads (the one client every machine of the project reaches the registry with);
``tarballs`` may instead hold packages fetched by hand. A vendor is fetched once: its manifest
``ROOT/.emoji-<vendor>.sha256`` lists the sha256 of every file it unpacked, and a run that finds
them all intact does nothing for that vendor.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dmlbench.data.emoji import CATALOG_FILE, LICENCES, PACKAGE_VERSION, VENDORS, image_directory
from dmlbench.download import offline
from dmlbench.errors import ParameterError, UserInputError
from dmlbench.files import atomic_write, file_sha256

# sha256 of the tarballs the npm registry serves for version 16.0.0 (npm pack, 2026).
TARBALL_SHA256 = {
    "apple": "b34d1665e136f163b0d4433318df151895b785186e8c729b2211b43017945075",
    "google": "fb5fd131b362aab7a55542d2a147a79708cce0a8b1c1bbacd470172708b5c438",
    "twitter": "f64a530c63bca463bd8317fdc4615ce63a53a0c65018e4ce2d848aaba7a28877",
    "facebook": "017038cf5a4e7fcf03dd9133cbed43d4c281c4b3ce7b927c7160261b92b8821e",
}
REGISTRY = "https://registry.npmjs.org"


class NpmMissing(Exception):
    """``npm`` is not on PATH and a package must be downloaded; the message holds the commands to run by hand."""


@dataclass(frozen=True)
class Fetched:
    vendor: str
    action: str  # "present" (verified, nothing done) or "unpacked"
    files: int


def package_name(vendor: str) -> str:
    return f"emoji-datasource-{vendor}"


def tarball_name(vendor: str) -> str:
    """The file ``npm pack`` writes."""
    return f"{package_name(vendor)}-{PACKAGE_VERSION}.tgz"


def manual_commands(vendors: Sequence[str], root: Path, tarballs: Path) -> str:
    """One line of shell that fetches the tarballs without npm and unpacks them with this command."""
    downloads = " && ".join(
        f"curl -fLO {REGISTRY}/{package_name(vendor)}/-/{tarball_name(vendor)}" for vendor in vendors)
    return (f"mkdir -p {tarballs} && cd {tarballs} && {downloads} && cd - && "
            f"dmlbench data fetch emoji --root {root} --tarballs {tarballs} --vendors {','.join(vendors)}")


def fetch(
    root: Path,
    vendors: Sequence[str] = VENDORS,
    *,
    tarballs: Path | None = None,
    pinned: Mapping[str, str] = TARBALL_SHA256,
    report: Callable[[str], None] = print,
) -> list[Fetched]:
    """Make ``root`` hold the packages of ``vendors``; a vendor already present and intact is left as it is."""
    unknown = [vendor for vendor in vendors if vendor not in VENDORS]
    if unknown:
        raise UserInputError(f"unknown emoji vendor {unknown[0]!r}; known: {', '.join(VENDORS)}")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ParameterError("root", f"{root} cannot be created: {error.strerror or error}") from None
    needed = [vendor for vendor in vendors if not is_present(root, vendor)]
    results = {vendor: Fetched(vendor, "present", len(_manifest(root, vendor) or {})) for vendor in vendors if vendor not in needed}
    if needed:
        with tempfile.TemporaryDirectory(prefix="dmlbench-emoji-") as scratch:
            folder = tarballs if tarballs is not None else Path(scratch)
            for vendor in needed:
                tarball = _tarball(vendor, folder, root, pinned[vendor], needed)
                results[vendor] = Fetched(vendor, "unpacked", unpack(tarball, vendor, root))
    for vendor in vendors:
        outcome = results[vendor]
        state = "already present, verified" if outcome.action == "present" else "unpacked and verified"
        report(f"{vendor:<9} {outcome.files} files {state}; licence: {LICENCES[vendor]}")
    return [results[vendor] for vendor in vendors]


def is_present(root: Path, vendor: str) -> bool:
    """Whether every file the vendor's manifest lists is there with its recorded sha256."""
    manifest = _manifest(root, vendor)
    if not manifest:
        return False
    for relative, digest in manifest.items():
        path = root / relative
        try:
            if not path.is_file() or file_sha256(path) != digest:
                return False
        except OSError:
            return False
    return True


def _tarball(vendor: str, folder: Path, root: Path, expected: str, needed: Sequence[str]) -> Path:
    """The vendor's tarball in ``folder``, downloaded with ``npm pack`` unless it is already there; its sha256 checked."""
    path = folder / tarball_name(vendor)
    if not path.is_file():
        if offline():
            raise UserInputError(f"offline: {path} is missing; place it there by hand ({manual_commands(needed, root, folder)})")
        npm = shutil.which("npm")
        if npm is None:
            raise NpmMissing(f"npm is not on PATH; fetch the packages by hand: {manual_commands(needed, root, folder)}")
        folder.mkdir(parents=True, exist_ok=True)
        command = [npm, "pack", f"{package_name(vendor)}@{PACKAGE_VERSION}", "--pack-destination", str(folder)]
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        if completed.returncode != 0 or not path.is_file():
            last = (completed.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserInputError(f"npm pack {package_name(vendor)}@{PACKAGE_VERSION} failed: {last}")
    digest = file_sha256(path)
    if digest != expected:
        raise UserInputError(f"{path} has sha256 {digest}, not the pinned {expected}; delete it and fetch again")
    return path


def unpack(tarball: Path, vendor: str, root: Path) -> int:
    """Extract ``package/emoji.json`` and ``package/img/<vendor>/64/*`` to ``root``, then write the
    manifest (last, so that an interrupted unpack is redone). Returns the number of files."""
    images = PurePosixPath("package") / image_directory(vendor)
    manifest: dict[str, str] = {}
    try:
        with tarfile.open(tarball, "r:gz") as archive:
            for member in archive:
                name = PurePosixPath(member.name)
                wanted = name == PurePosixPath("package", CATALOG_FILE) or name.parent == images
                if not wanted or not member.isfile() or ".." in name.parts:
                    continue
                relative = name.relative_to("package").as_posix()
                source = archive.extractfile(member)
                assert source is not None  # a regular file always has contents
                data = source.read()
                _place(root / relative, data, relative == CATALOG_FILE)
                manifest[relative] = hashlib.sha256(data).hexdigest()
    except (OSError, tarfile.TarError, EOFError) as error:
        raise UserInputError(f"cannot unpack {tarball}: {error}") from None
    if CATALOG_FILE not in manifest or len(manifest) < 2:
        raise UserInputError(f"{tarball} holds no package/{CATALOG_FILE} or no package/{images.relative_to('package')} images")
    lines = "".join(f"{digest}  {relative}\n" for relative, digest in sorted(manifest.items()))
    atomic_write(_manifest_path(root, vendor), lambda stream: stream.write(lines.encode()))
    return len(manifest)


def _place(path: Path, data: bytes, is_catalog: bool) -> None:
    # The packages of one version ship the same emoji.json; another one would make classes mean other things.
    if is_catalog and path.is_file() and path.read_bytes() != data:
        raise UserInputError(f"{path} differs from the {CATALOG_FILE} of version {PACKAGE_VERSION}; "
                             "use an empty --root or one fetched with this version")
    path.parent.mkdir(parents=True, exist_ok=True)
    # A plain write: the manifest, written last, is what marks the unpack complete (``is_present``).
    path.write_bytes(data)


def _manifest_path(root: Path, vendor: str) -> Path:
    return root / f".emoji-{vendor}.sha256"


def _manifest(root: Path, vendor: str) -> dict[str, str] | None:
    path = _manifest_path(root, vendor)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    entries = {}
    for line in lines:
        digest, separator, relative = line.partition("  ")
        if not separator or len(digest) != 64 or ".." in PurePosixPath(relative).parts:
            return None
        entries[relative] = digest
    return entries
