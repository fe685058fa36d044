"""The ``emoji`` dataset: the same emoji drawn by up to four design teams (Apple, Google, Twitter,
Facebook), from the npm packages ``emoji-datasource-<vendor>`` (version 16.0.0; ``dmlbench data
fetch emoji`` unpacks them, ``data/emoji_fetch.py``).

Layout under ``root``: ``emoji.json`` and ``img/<vendor>/64/*.png`` (what ``data fetch`` writes,
or the packages unpacked into one folder without their ``package/`` prefix), or one folder per
package, each with its own ``emoji.json`` and ``img/<vendor>/64`` (``root`` = a ``node_modules``
folder, for instance). Every ``emoji.json`` found must have the same bytes (the four 16.0.0 packages
ship one file); differing ones are refused, since a class would then mean different things per vendor.

``emoji.json`` is the truth. A class is a base emoji (its ``unified`` code); an entry lists an image
of vendor V when its ``has_img_V`` is true, and so does each of its ``skin_variations``. A listed
image missing on disk, or that Pillow cannot decode completely, is left out and reported (``data
check`` fails on it); a file on disk that no entry lists is ignored and counted. Classes are ordered
by ``sort_order`` (so the first half, the train/validation pool, holds smileys, people and animals,
the second half travel, objects, symbols and flags); after the vendor choice, classes with fewer than
two images are dropped and counted. Each image carries its vendor as its domain
(``ImageDataset.domains``), for cross-domain evaluation.

The 64 x 64 RGBA images are composited on ``background`` (the alpha channel is never dropped
as is: a transparent pixel shows the background), then resized to ``image_size`` (box filter when
shrinking, bicubic when enlarging). ``skin_tones``: ``instances`` (a skin-tone variant is another
image of its base emoji's class), ``drop`` (base images only) or ``classes`` (each variant is a class
of its own, placed right after its base emoji). Item order: class by class, within a class vendor by
vendor (``VENDORS`` order), the base image before its variants (by tone code).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dmlbench.data.base import DatasetSource, ImageDataset, register_dataset
from dmlbench.data.cache import cache_directory, load_arrays, save_arrays
from dmlbench.errors import UserInputError

# Part of the cache key: an edit of this module (which may change the decoded bytes) makes earlier cache files stale.
_SOURCE_HASH = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()

PACKAGE_VERSION = "16.0.0"
VENDORS = ("apple", "google", "twitter", "facebook")
LICENCES = {
    "apple": "Apple images, (c) Apple Inc.: not licensed for commercial use",
    "google": "Google images (Noto Emoji): Apache-2.0",
    "twitter": "Twitter images (Twemoji): CC-BY-4.0",
    "facebook": "Facebook images, (c) Facebook, Inc.: no clear licence (research use only)",
}
SKIN_TONE_MODES = ("instances", "drop", "classes")
CATALOG_FILE = "emoji.json"
NATIVE_SIZE = 64
# Names of files reported in full before a count takes over.
_EXAMPLES = 10


def image_directory(vendor: str) -> str:
    """Where a package keeps its vendor's 64-pixel images, relative to the package folder."""
    return f"img/{vendor}/{NATIVE_SIZE}"


@dataclass(frozen=True)
class EmojiOptions:
    vendors: tuple[str, ...] | None
    skin_tones: str
    image_size: int
    background: tuple[int, int, int]


@dataclass
class _Item:
    class_key: str
    order: tuple[int, int]  # (sort_order, 0 for the base emoji or 1 + the variant's position in classes mode)
    vendor: str
    relative: str  # path under root
    category: str


@dataclass
class _Listing:
    """What ``emoji.json`` lists for the chosen vendors and skin-tone mode, checked against the disk."""

    items: list[_Item] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unlisted: dict[str, int] = field(default_factory=dict)  # vendor -> files on disk that no entry lists
    listed: dict[str, int] = field(default_factory=dict)  # vendor -> images emoji.json lists


@register_dataset("emoji", DatasetSource("rooted", fetch="npm", terms="; ".join(LICENCES.values())))
def emoji(
    root: str | None = None,
    *,
    vendors: str | list[str] | None = None,
    skin_tones: str = "instances",
    image_size: int = 32,
    background: str | list[int] = "white",
    cache_dir: str | os.PathLike[str] | None = None,
) -> ImageDataset:
    """The emoji of the packages under ``root`` as an in-memory dataset whose domains are the vendors.

    Decoding takes seconds; the result is cached (``cache_dir``, default ``$DMLBENCH_CACHE`` or
    ``~/.cache/dmlbench``) under a key of the options and each listed file's path, size and mtime.
    """
    options = check_options(vendors, skin_tones, image_size, background)
    base = _root(root)
    catalog, catalog_sha256, folders = read_catalog(base)
    chosen = _chosen_vendors(base, folders, options.vendors)
    listing = list_items(catalog, chosen, options.skin_tones, base)
    path = cache_directory(cache_dir) / f"emoji-{_cache_key(base, catalog_sha256, listing, options)[:20]}.npz"
    cached = _load_cached(path)
    if cached is not None:
        return cached
    dataset = _decode_dataset(base, catalog_sha256, folders, chosen, options, listing)
    save_arrays(path, {
        "images": dataset.images.numpy(), "labels": dataset.labels.numpy(),
        "class_names": np.array(dataset.class_names, dtype=np.str_), "domains": dataset.domains,
        "content_hash": np.array(dataset.content_hash, dtype=np.str_),
        "metadata_json": np.array(json.dumps(dataset.metadata, sort_keys=True), dtype=np.str_),
    })
    return dataset


def _decode_dataset(base: Path, catalog_sha256: str, folders: list[Path], chosen: dict[str, Path],
                    options: EmojiOptions, listing: _Listing) -> ImageDataset:
    images, readable, unreadable = _decode_all(base, listing.items, options)
    kept_items = [item for item, ok in zip(listing.items, readable) if ok]
    class_counts = Counter(item.class_key for item in kept_items)
    order = {item.class_key: item.order for item in listing.items}  # the same for every image of a class
    dropped = sorted((key for key, count in class_counts.items() if count < 2), key=order.__getitem__)
    keep = [index for index, item in enumerate(kept_items) if class_counts[item.class_key] >= 2]
    if not keep:
        raise UserInputError(f"emoji root {base}: no class has two readable images of vendors {', '.join(chosen)}")
    kept_items = [kept_items[index] for index in keep]
    class_keys = sorted({item.class_key for item in kept_items}, key=order.__getitem__)
    class_id = {key: index for index, key in enumerate(class_keys)}
    labels = torch.tensor([class_id[item.class_key] for item in kept_items], dtype=torch.int64)
    domains = np.asarray([item.vendor for item in kept_items], dtype=np.str_)
    report = _report(base, catalog_sha256, folders, chosen, options, listing, kept_items, dropped, unreadable)
    metadata = {"format": "emoji", "root": str(base), "source_report": report}
    return ImageDataset(torch.from_numpy(images[np.flatnonzero(readable)[keep]]), labels, class_keys,
                        name="emoji", metadata=metadata, domains=domains)


def _cache_key(root: Path, catalog_sha256: str, listing: _Listing, options: EmojiOptions) -> str:
    digest = hashlib.sha256(json.dumps({
        "source": _SOURCE_HASH, "root": str(root.resolve()), "catalog": catalog_sha256,
        "missing": listing.missing, "unlisted": listing.unlisted, "options": asdict(options),
    }, sort_keys=True).encode())
    for item in listing.items:
        status = (root / item.relative).stat()
        digest.update(f"{item.relative}\t{status.st_size}\t{status.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _load_cached(path: Path) -> ImageDataset | None:
    """The dataset stored at ``path`` if the file is complete and its content hash checks out."""
    arrays = load_arrays(path, {"images": "u", "labels": "i", "class_names": "U", "domains": "U",
                                "content_hash": "U", "metadata_json": "U"})
    if arrays is None:
        return None
    try:
        dataset = ImageDataset(torch.from_numpy(arrays["images"]), torch.from_numpy(arrays["labels"].astype(np.int64)),
                               [str(name) for name in arrays["class_names"]], name="emoji",
                               metadata=json.loads(str(arrays["metadata_json"])), domains=arrays["domains"])
    except (UserInputError, ValueError):
        return None
    return dataset if dataset.content_hash == str(arrays["content_hash"]) else None


def check_options(vendors: Any, skin_tones: Any, image_size: Any, background: Any) -> EmojiOptions:
    """The options checked and made canonical (vendors in ``VENDORS`` order, the colour as RGB)."""
    if skin_tones not in SKIN_TONE_MODES:
        raise UserInputError(f"emoji option skin_tones must be one of {', '.join(SKIN_TONE_MODES)}, got {skin_tones!r}")
    if isinstance(image_size, bool) or not isinstance(image_size, int) or not 8 <= image_size <= 512:
        raise UserInputError(f"emoji option image_size must be an integer in [8, 512], got {image_size!r}")
    return EmojiOptions(parse_vendors(vendors), skin_tones, image_size, _colour(background))


def parse_vendors(vendors: Any) -> tuple[str, ...] | None:
    """``None`` (every vendor found), or the named vendors in ``VENDORS`` order; an unknown one is refused."""
    if vendors is None:
        return None
    names = [part.strip() for part in vendors.split(",")] if isinstance(vendors, str) else vendors
    if not isinstance(names, (list, tuple)) or not all(isinstance(name, str) and name for name in names) or not names:
        raise UserInputError(f"emoji vendors must be a comma-separated list of {', '.join(VENDORS)}, got {vendors!r}")
    for name in names:
        if name not in VENDORS:
            raise UserInputError(f"unknown emoji vendor {name!r}; known: {', '.join(VENDORS)}")
    return tuple(vendor for vendor in VENDORS if vendor in names)


def _colour(value: Any) -> tuple[int, int, int]:
    from PIL import ImageColor

    hint = "a colour name, '#rrggbb' (quoted in YAML) or [r, g, b] with values 0-255"
    if isinstance(value, str):
        try:
            rgb = ImageColor.getrgb(value)
        except ValueError:
            raise UserInputError(f"emoji option background must be {hint}, got {value!r}") from None
        if len(rgb) == 4 and rgb[3] != 255:
            raise UserInputError(f"emoji option background must be opaque, got {value!r}")
        return int(rgb[0]), int(rgb[1]), int(rgb[2])
    valid = (isinstance(value, (list, tuple)) and len(value) == 3
             and all(isinstance(part, int) and not isinstance(part, bool) and 0 <= part <= 255 for part in value))
    if not valid:
        raise UserInputError(f"emoji option background must be {hint}, got {value!r}")
    return int(value[0]), int(value[1]), int(value[2])


def _root(root: str | None) -> Path:
    if root is None or not str(root):
        raise UserInputError("dataset 'emoji' reads files: set data.root (dmlbench data check emoji --root PATH)")
    path = Path(root).expanduser()
    if not path.is_dir():
        raise UserInputError(f"data.root {path} of dataset 'emoji' is not a directory")
    return path


def read_catalog(root: Path) -> tuple[list[dict[str, Any]], str, list[Path]]:
    """``emoji.json``'s entries, its sha256, and the package folders found (``root`` itself and/or its sub-folders)."""
    folders = [root] if (root / CATALOG_FILE).is_file() else []
    folders += sorted(path for path in root.iterdir() if path.is_dir() and (path / CATALOG_FILE).is_file())
    if not folders:
        raise UserInputError(f"emoji root {root} has no {CATALOG_FILE} (fetch the data: dmlbench data fetch emoji --root {root})")
    digests = {folder: hashlib.sha256((folder / CATALOG_FILE).read_bytes()).hexdigest() for folder in folders}
    first = folders[0]
    for folder in folders[1:]:
        if digests[folder] != digests[first]:
            raise UserInputError(f"{first / CATALOG_FILE} and {folder / CATALOG_FILE} differ; "
                                 f"use packages of one version ({PACKAGE_VERSION}) under one root")
    path = first / CATALOG_FILE
    try:
        catalog = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UserInputError(f"cannot read {path} as JSON: {error}") from None
    if not isinstance(catalog, list) or not all(isinstance(entry, dict) for entry in catalog):
        raise UserInputError(f"{path} must hold a JSON list of emoji entries")
    for entry in catalog:
        missing = [key for key in ("unified", "image", "sort_order", "category") if key not in entry]
        if missing:
            raise UserInputError(f"{path}: entry {entry.get('unified', '?')!r} has no field {missing[0]!r}")
    return catalog, digests[first], folders


def _chosen_vendors(root: Path, folders: list[Path], requested: tuple[str, ...] | None) -> dict[str, Path]:
    """Vendor -> the package folder holding its images; a requested vendor with no images is refused."""
    found: dict[str, Path] = {}
    for vendor in VENDORS:
        holders = [folder for folder in folders if (folder / image_directory(vendor)).is_dir()]
        if len(holders) > 1:
            raise UserInputError(f"emoji root {root}: vendor {vendor!r} has images in both {holders[0]} and {holders[1]}")
        if holders:
            found[vendor] = holders[0]
    if requested is None:
        if not found:
            raise UserInputError(f"emoji root {root} has no img/<vendor>/{NATIVE_SIZE} folder of {', '.join(VENDORS)}")
        return found
    for vendor in requested:
        if vendor not in found:
            raise UserInputError(f"emoji root {root} has no {image_directory(vendor)} (fetch it: "
                                 f"dmlbench data fetch emoji --root {root} --vendors {vendor})")
    return {vendor: found[vendor] for vendor in requested}


def list_items(catalog: list[dict[str, Any]], vendors: dict[str, Path], skin_tones: str, root: Path) -> _Listing:
    """The images the options use, in item order, with what is missing on disk and what is not listed."""
    listing = _Listing()
    entries = sorted(catalog, key=lambda entry: (int(entry["sort_order"]), str(entry["unified"])))
    variants_of = {str(entry["unified"]): _variants(entry) for entry in entries}
    for entry in entries:
        base_key = str(entry["unified"])
        for vendor, folder in vendors.items():
            prefix = folder.relative_to(root) / image_directory(vendor)
            images = [(base_key, 0, entry)]
            if skin_tones != "drop":
                images += [(str(variant["unified"]) if skin_tones == "classes" else base_key,
                            1 + position if skin_tones == "classes" else 0, variant)
                           for position, variant in enumerate(variants_of[base_key])]
            for class_key, rank, image in images:
                if not image.get(f"has_img_{vendor}", False):
                    continue
                relative = (prefix / str(image["image"])).as_posix()
                if not (root / relative).is_file():
                    listing.missing.append(relative)
                    continue
                listing.items.append(_Item(class_key, (int(entry["sort_order"]), rank), vendor, relative,
                                           str(entry["category"])))
    # Class by class; the stable sort keeps vendor order, then the base image before its variants.
    listing.items.sort(key=lambda item: item.order)
    for vendor, folder in vendors.items():
        listed = {str(image["image"]) for entry in entries for image in [entry, *variants_of[str(entry["unified"])]]
                  if image.get(f"has_img_{vendor}", False)}
        on_disk = {path.name for path in (folder / image_directory(vendor)).iterdir() if path.is_file()}
        listing.listed[vendor] = len(listed)
        listing.unlisted[vendor] = len(on_disk - listed)
    return listing


def _variants(entry: dict[str, Any]) -> list[dict[str, Any]]:
    variations = entry.get("skin_variations") or {}
    if not isinstance(variations, dict):
        return []
    return [variations[tone] for tone in sorted(variations) if isinstance(variations[tone], dict) and "image" in variations[tone]]


def _decode_all(root: Path, items: list[_Item], options: EmojiOptions) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(images uint8 [N, 3, S, S], readable bool [N], unreadable relative paths)``; unreadable rows stay zero."""
    size = options.image_size
    images = np.zeros((len(items), 3, size, size), dtype=np.uint8)
    readable = np.zeros(len(items), dtype=bool)
    unreadable = []
    for index, item in enumerate(items):
        decoded = decode(root / item.relative, options.background, size)
        if decoded is None:
            unreadable.append(item.relative)
        else:
            images[index], readable[index] = decoded, True
    return images, readable, unreadable


def decode(path: Path, background: tuple[int, int, int], size: int) -> np.ndarray | None:
    """One image composited on ``background`` and resized, uint8 ``[3, size, size]``; ``None`` if it
    cannot be decoded completely (missing, truncated, not an image)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            opened.load()
            rgba = opened.convert("RGBA")
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError):
        return None
    composited = Image.alpha_composite(Image.new("RGBA", rgba.size, (*background, 255)), rgba).convert("RGB")
    if composited.size != (size, size):
        shrinking = size <= min(composited.size)
        composited = composited.resize((size, size), Image.Resampling.BOX if shrinking else Image.Resampling.BICUBIC)
    return np.asarray(composited, dtype=np.uint8).transpose(2, 0, 1)


def _report(root: Path, catalog_sha256: str, folders: list[Path], vendors: dict[str, Path], options: EmojiOptions,
            listing: _Listing, items: list[_Item], dropped: list[str], unreadable: list[str]) -> dict[str, Any]:
    """What ``data check`` shows beside its generic summary; ``problems`` are missing and unreadable images."""
    problems = []
    if listing.missing:
        problems.append(f"{len(listing.missing)} images listed in {CATALOG_FILE} are missing on disk")
    if unreadable:
        problems.append(f"{len(unreadable)} unreadable images")
    return {
        "root": str(root),
        "emoji_json_sha256": catalog_sha256,
        "packages": [str(folder) for folder in folders],
        "vendors": list(vendors),
        "skin_tones": options.skin_tones,
        "image_size": options.image_size,
        "background": "#{:02x}{:02x}{:02x}".format(*options.background),
        "listed_per_vendor": dict(listing.listed),
        "images_per_vendor": {vendor: sum(item.vendor == vendor for item in items) for vendor in vendors},
        "images_per_category": dict(sorted(Counter(item.category for item in items).items())),
        "dropped_classes": {"count": len(dropped), "reason": "fewer than two images", "examples": dropped[:_EXAMPLES]},
        "missing": {"count": len(listing.missing), "files": listing.missing[:_EXAMPLES]},
        "unreadable": {"count": len(unreadable), "files": unreadable[:_EXAMPLES]},
        "unlisted": {"count": sum(listing.unlisted.values()), "per_vendor": dict(listing.unlisted)},
        "licences": {vendor: LICENCES[vendor] for vendor in vendors},
        "problems": problems,
    }
