"""Readers of the on-disk layouts of the standard benchmarks, plus ``folder`` and ``csv``.

Each is registered (``register_dataset``, a ``files`` source) and returns a ``FileDataset``; ``root`` is the folder the
dataset's official archive unpacks to (README, "Real datasets"), or the CSV file for ``csv``.
Declared splits: CUB200-2011 classes 1-100 train / 101-200 test, CARS196 1-98 / 99-196 (Oh Song
et al. 2016, as in seed 001 §4); SOP and In-Shop by their list files; ``folder`` declares none.
"""

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from dmlbench.data.base import DatasetSource, register_dataset
from dmlbench.data.files import FileDataset
from dmlbench.data.sources import SOURCES
from dmlbench.errors import UserInputError



def _archived(name: str) -> DatasetSource:
    """A file format whose official archives ``data fetch`` downloads (``data.sources``)."""
    return DatasetSource("files", fetch="archives", terms=SOURCES[name].terms)


YOUR_FILES = DatasetSource("files")  # a layout of your own images: nothing to fetch, your terms
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def _root(name: str, root: str | os.PathLike[str] | None, *, is_file: bool = False) -> Path:
    if root is None or not str(root):
        raise UserInputError(f"dataset {name!r} reads files: set data.root (dmlbench data check {name} --root PATH)")
    path = Path(root).expanduser()
    if is_file and not path.is_file():
        raise UserInputError(f"data.root {path} of dataset {name!r} is not a file (it should be the CSV file)")
    if not is_file and not path.is_dir():
        raise UserInputError(f"data.root {path} of dataset {name!r} is not a directory")
    return path


def _required(root: Path, name: str, relative: str, contents: str) -> Path:
    path = root / relative
    if not path.is_file():
        raise UserInputError(f"{name} root {root} has no {relative} (it should hold {contents})")
    return path


def _rows(path: Path, fields: int, contents: str, skip: int = 0) -> list[list[str]]:
    """Whitespace-separated rows of ``path`` after ``skip`` lines, each with at least ``fields`` fields."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UserInputError(f"cannot read {path}: {error}") from None
    rows = []
    for number, line in enumerate(lines[skip:], start=skip + 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) < fields:
            raise UserInputError(f"{path} line {number}: expected {contents}, got {line.strip()!r}")
        rows.append(parts)
    return rows


def _integer(value: str, path: Path, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UserInputError(f"{path}: {what} must be an integer, got {value!r}") from None


def _dataset(
    name: str, root: Path, paths: Sequence[str], class_keys: Sequence[Any], *, test: np.ndarray | None,
    roles: np.ndarray | None = None, class_names: dict[Any, str] | None = None, **options: Any,
) -> FileDataset:
    """Class ids ``0 .. C-1`` in the sorted order of ``class_keys``; ``class_names`` maps a key to its name."""
    if not paths:
        raise UserInputError(f"dataset {name!r} at {root} lists no images")
    keys = sorted(set(class_keys))
    position = {key: index for index, key in enumerate(keys)}
    labels = torch.tensor([position[key] for key in class_keys], dtype=torch.int64)
    names = [str((class_names or {}).get(key, key)) for key in keys]
    _warn_if_upscaled(name, root, paths, int(options.get("image_size", 224)))
    return FileDataset(root, paths, labels, names, name=name, test=test, roles=roles,
                       metadata={"format": name, "root": str(root)}, **options)


UPSCALE_WARNING = 2.0  # images this many times smaller than image_size are upscaled for nothing but cost
_WARNED: set[tuple[str, int]] = set()  # once per root and size: a benchmark loads the dataset for every run


def _warn_if_upscaled(name: str, root: Path, paths: Sequence[str], image_size: int) -> None:
    """A warning when the images are much smaller than ``image_size`` (224 unless set): they are
    upscaled, and training costs grow with the square of the side (64-px emoji at 224: 20 times slower).
    Sizes come from the headers of 16 evenly spread files (Pillow reads no pixels for them)."""
    if (str(root), image_size) in _WARNED:
        return
    _WARNED.add((str(root), image_size))
    sides = []
    for relative in [paths[i] for i in np.linspace(0, len(paths) - 1, min(16, len(paths))).astype(int)]:
        try:
            with Image.open(root / relative) as image:
                sides.append(min(image.size))
        except (OSError, ValueError):
            continue  # unreadable files are data check's to report
    if sides and image_size >= UPSCALE_WARNING * float(np.median(sides)):
        side = int(np.median(sides))
        print(f"dmlbench: warning: dataset {name!r} at {root}: images are about {side} px but data.image_size is "
              f"{image_size}, so each is upscaled {image_size / side:.1f}x and training costs about "
              f"{(image_size / side) ** 2:.0f}x more; set data.image_size={side}", file=sys.stderr, flush=True)


@register_dataset("cub200", _archived("cub200"))
def cub200(
    root: str | None = None, *, image_size: int = 224, augmentation: str = "none", seed: int = 0,
    cache_dir: str | None = None, workers: int = 4,
) -> FileDataset:
    """CUB-200-2011 (Wah et al. 2011): ``root`` is the ``CUB_200_2011`` folder."""
    base = _root("cub200", root)
    images = _rows(_required(base, "cub200", "images.txt", "lines '<image_id> <path under images/>'"), 2,
                   "'<image_id> <path>'")
    label_path = _required(base, "cub200", "image_class_labels.txt", "lines '<image_id> <class_id 1-200>'")
    classes = {row[0]: _integer(row[1], label_path, "class_id") for row in _rows(label_path, 2, "'<image_id> <class_id>'")}
    names: dict[Any, str] = {}
    if (base / "classes.txt").is_file():
        names = {_integer(row[0], base / "classes.txt", "class_id"): row[1] for row in _rows(base / "classes.txt", 2, "'<class_id> <name>'")}
    missing = [row[0] for row in images if row[0] not in classes]
    if missing:
        raise UserInputError(f"{label_path} has no class for image_id {missing[0]} of images.txt")
    class_keys = [classes[row[0]] for row in images]
    test = np.asarray([key > 100 for key in class_keys])
    return _dataset("cub200", base, [f"images/{row[1]}" for row in images], class_keys, test=test,
                    class_names=names, image_size=image_size, augmentation=augmentation, seed=seed, cache_dir=cache_dir, workers=workers)


@register_dataset("cars196", _archived("cars196"))
def cars196(
    root: str | None = None, *, image_size: int = 224, augmentation: str = "none", seed: int = 0,
    cache_dir: str | None = None, workers: int = 4,
) -> FileDataset:
    """Stanford Cars (Krause et al. 2013): ``root`` holds ``cars_annos.mat`` and the ``car_ims`` folder."""
    from scipy.io import loadmat

    base = _root("cars196", root)
    path = _required(base, "cars196", "cars_annos.mat",
                     "the struct array 'annotations' with fields relative_im_path and class, and 'class_names'")
    try:
        contents = loadmat(path, squeeze_me=True)
    except (OSError, ValueError, TypeError, NotImplementedError) as error:
        raise UserInputError(f"cannot read {path} as a MATLAB file: {error}") from None
    annotations = contents.get("annotations")
    fields = getattr(getattr(annotations, "dtype", None), "names", None) or ()
    if "relative_im_path" not in fields or "class" not in fields:
        raise UserInputError(f"{path} has no struct array 'annotations' with fields relative_im_path and class")
    annotations = np.atleast_1d(annotations)
    paths = [str(item) for item in annotations["relative_im_path"]]
    class_keys = [int(item) for item in annotations["class"]]
    raw_names = np.atleast_1d(contents.get("class_names", np.array([])))
    names = {index + 1: str(value) for index, value in enumerate(raw_names)}
    test = np.asarray([key > 98 for key in class_keys])
    return _dataset("cars196", base, paths, class_keys, test=test, class_names=names, image_size=image_size, augmentation=augmentation, seed=seed, cache_dir=cache_dir, workers=workers)


@register_dataset("sop", _archived("sop"))
def sop(
    root: str | None = None, *, image_size: int = 224, augmentation: str = "none", seed: int = 0,
    cache_dir: str | None = None, workers: int = 4,
) -> FileDataset:
    """Stanford Online Products (Oh Song et al. 2016): ``root`` is the ``Stanford_Online_Products`` folder."""
    base = _root("sop", root)
    paths, class_keys, test = [], [], []
    for file_name, is_test in (("Ebay_train.txt", False), ("Ebay_test.txt", True)):
        path = _required(base, "sop", file_name, "a header line, then 'image_id class_id super_class_id path'")
        for row in _rows(path, 4, "'image_id class_id super_class_id path'", skip=1):
            paths.append(row[3])
            class_keys.append(_integer(row[1], path, "class_id"))
            test.append(is_test)
    return _dataset("sop", base, paths, class_keys, test=np.asarray(test), image_size=image_size, augmentation=augmentation, seed=seed, cache_dir=cache_dir, workers=workers)


@register_dataset("inshop", _archived("inshop"))
def inshop(
    root: str | None = None, *, image_size: int = 224, augmentation: str = "none", seed: int = 0,
    cache_dir: str | None = None, workers: int = 4,
) -> FileDataset:
    """DeepFashion In-Shop (Liu et al. 2016): ``root`` holds ``list_eval_partition.txt`` (or
    ``Eval/list_eval_partition.txt``) and the ``img`` folder (or ``Img/img``). Test = query + gallery."""
    base = _root("inshop", root)
    partition = base / "list_eval_partition.txt"
    if not partition.is_file() and (base / "Eval" / "list_eval_partition.txt").is_file():
        partition = base / "Eval" / "list_eval_partition.txt"
    partition = _required(partition.parent, "inshop", partition.name,
                          "a count line, a header line, then 'image_name item_id evaluation_status'")
    image_base = base / "Img" if (base / "Img").is_dir() else base
    paths, class_keys, test, roles = [], [], [], []
    for row in _rows(partition, 3, "'image_name item_id evaluation_status'", skip=2):
        status = row[2]
        if status not in ("train", "query", "gallery"):
            raise UserInputError(f"{partition}: evaluation_status must be train, query or gallery, got {status!r}")
        paths.append(row[0])
        class_keys.append(row[1])
        test.append(status != "train")
        roles.append("" if status == "train" else status)
    return _dataset("inshop", image_base, paths, class_keys, test=np.asarray(test), roles=np.asarray(roles), image_size=image_size, augmentation=augmentation, seed=seed, cache_dir=cache_dir, workers=workers)


def require_utf8_name(path: Path) -> None:
    """Refuse a file whose name is not UTF-8: Python keeps its bytes as surrogates, which every record
    of it (paths in run.json, the index's paths.txt, the content hash) cannot encode."""
    try:
        str(path).encode()
    except UnicodeEncodeError:
        raise UserInputError(f"file name {os.fsencode(path)!r} is not UTF-8; rename it (and any such folder) "
                             "to a UTF-8 name") from None


@register_dataset("folder", YOUR_FILES)
def folder(
    root: str | None = None, *, image_size: int = 224, augmentation: str = "none", seed: int = 0,
    cache_dir: str | None = None, workers: int = 4,
) -> FileDataset:
    """One sub-folder of images per class (sorted by name); no declared split (first half of the classes trains).

    A linked folder whose target lies inside the root (or holds it) is not followed: its images would count
    twice, once under another class (``metadata["skipped_links"]``, named by ``data check``). A link to an image
    that leads nowhere (broken, or a loop) is listed, so that it counts among the unreadable files."""
    base = _root("folder", root)
    paths, class_keys, skipped = [], [], []
    resolved_root = base.resolve()
    for class_dir in sorted(path for path in base.iterdir() if path.is_dir()):
        if class_dir.is_symlink() and _inside(class_dir.resolve(), resolved_root):
            skipped.append(class_dir.name)
            continue
        for file in sorted(class_dir.rglob("*")):  # rglob itself follows no linked folder below a class
            if file.suffix.lower() in IMAGE_SUFFIXES and (file.is_file() or (file.is_symlink() and not file.exists())):
                require_utf8_name(file)
                paths.append(file.relative_to(base).as_posix())
                class_keys.append(class_dir.name)
    if not paths:
        raise UserInputError(f"folder root {base} has no class sub-folders with images ({', '.join(IMAGE_SUFFIXES)})")
    dataset = _dataset("folder", base, paths, class_keys, test=None, image_size=image_size, augmentation=augmentation,
                       seed=seed, cache_dir=cache_dir, workers=workers)
    dataset.metadata["skipped_links"] = skipped
    return dataset


def _inside(target: Path, root: Path) -> bool:
    """Whether ``target`` is ``root``, lies under it, or holds it: a link there shows images already listed."""
    return target == root or root in target.parents or target in root.parents


@register_dataset("csv", YOUR_FILES)
def csv_file(
    root: str | None = None, *, image_size: int = 224, augmentation: str = "none", seed: int = 0,
    cache_dir: str | None = None, workers: int = 4,
) -> FileDataset:
    """A CSV file with a header and columns ``path,label`` (optional ``split``: train/test, ``role``:
    query/gallery, which makes the row a test item); relative paths are relative to the CSV's folder."""
    path = _root("csv", root, is_file=True)
    try:
        with path.open(newline="", encoding="utf-8") as stream:
            reader = csv.DictReader(stream)
            columns = [name.strip() for name in reader.fieldnames or []]
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise UserInputError(f"cannot read {path} as CSV: {error}") from None
    missing = [column for column in ("path", "label") if column not in columns]
    if missing:
        raise UserInputError(f"{path} has no column {missing[0]!r} (header must name path,label and optionally split,role)")
    unknown = sorted(set(columns) - {"path", "label", "split", "role"})
    if unknown:
        raise UserInputError(f"{path} has an unknown column {unknown[0]!r} (allowed: path, label, split, role)")
    paths, labels, test, roles = [], [], [], []
    for number, row in enumerate(rows, start=2):
        row = {key.strip(): (value or "").strip() for key, value in row.items() if key is not None}
        if not row["path"] or not row["label"]:
            raise UserInputError(f"{path} line {number}: path and label must not be empty")
        split, role = row.get("split", ""), row.get("role", "")
        if split not in ("", "train", "test"):
            raise UserInputError(f"{path} line {number}: split must be train or test, got {split!r}")
        if role not in ("", "query", "gallery"):
            raise UserInputError(f"{path} line {number}: role must be query or gallery, got {role!r}")
        if role and split == "train":
            raise UserInputError(f"{path} line {number}: a {role} item belongs to the test split, not train")
        paths.append(row["path"])
        labels.append(row["label"])
        test.append(split == "test" or bool(role))
        roles.append(role)
    has_split = "split" in columns or "role" in columns
    if "split" in columns and any(not row.get("split", "").strip() and not row.get("role", "").strip() for row in rows):
        raise UserInputError(f"{path}: every row needs a split (train or test) when the column is present")
    has_roles = "role" in columns and any(roles)
    if has_roles and any(is_test and not role for is_test, role in zip(test, roles)):
        raise UserInputError(f"{path}: with roles, every test row needs role query or gallery")
    # Integer labels sort numerically, others as strings.
    keys: list[Any] = [int(label) for label in labels] if all(_is_int(label) for label in labels) else labels
    return _dataset("csv", path.parent, paths, keys, test=np.asarray(test) if has_split else None,
                    roles=np.asarray(roles) if has_roles else None, image_size=image_size, augmentation=augmentation, seed=seed, cache_dir=cache_dir, workers=workers)


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True
