"""Tiny replicas of every on-disk dataset layout, written with Pillow (and scipy for the .mat file).

Each builder writes ``per_class`` small images for each class in the format's exact layout and
returns the path to give as ``data.root``. Images differ per item (a coloured square at a position
that depends on the item), so duplicate detection sees no false duplicates.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image


def write_image(path: Path, seed: int, size: tuple[int, int] = (40, 30)) -> None:
    """A small RGB picture that depends on ``seed``; JPEG or PNG by the suffix."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def cub200(root: Path, classes: int = 4, per_class: int = 3) -> Path:
    """Classes 1..classes/2 as 1.., and the rest numbered from 101 (the declared test classes)."""
    base = root / "CUB_200_2011"
    ids = [*range(1, classes // 2 + 1), *range(101, 101 + classes - classes // 2)]
    images, labels, names = [], [], []
    item = 0
    for class_id in ids:
        folder = f"{class_id:03d}.Bird_{class_id}"
        names.append(f"{class_id} {folder}")
        for k in range(per_class):
            item += 1
            relative = f"{folder}/Bird_{class_id}_{k}.jpg"
            write_image(base / "images" / relative, item)
            images.append(f"{item} {relative}")
            labels.append(f"{item} {class_id}")
    (base / "images.txt").write_text("\n".join(images) + "\n")
    (base / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    (base / "classes.txt").write_text("\n".join(names) + "\n")
    return base


def cars196(root: Path, classes: int = 4, per_class: int = 3) -> Path:
    """``cars_annos.mat`` in the devkit's field layout; classes 1.. and 99.. (declared test)."""
    from scipy.io import savemat

    base = root / "cars196"
    ids = [*range(1, classes // 2 + 1), *range(99, 99 + classes - classes // 2)]
    dtype = [("relative_im_path", object), ("bbox_x1", object), ("bbox_y1", object), ("bbox_x2", object),
             ("bbox_y2", object), ("class", object), ("test", object)]
    rows = []
    item = 0
    for class_id in ids:
        for _ in range(per_class):
            item += 1
            relative = f"car_ims/{item:06d}.jpg"
            write_image(base / relative, 1000 + item)
            rows.append((relative, np.uint8(1), np.uint8(1), np.uint8(30), np.uint8(20), np.uint8(class_id), np.uint8(item % 2)))
    annotations = np.array([rows], dtype=dtype)  # 1 x N struct array, as MATLAB stores it
    class_names = np.empty((1, 196), dtype=object)
    for index in range(196):
        class_names[0, index] = f"Car model {index + 1}"
    savemat(base / "cars_annos.mat", {"annotations": annotations, "class_names": class_names})
    return base


def sop(root: Path, train_classes: int = 3, test_classes: int = 2, per_class: int = 2) -> Path:
    """Uneven split (3 train / 2 test classes) so that only a declared split can be right."""
    base = root / "Stanford_Online_Products"
    item, class_id = 0, 0
    for file_name, count in (("Ebay_train.txt", train_classes), ("Ebay_test.txt", test_classes)):
        lines = ["image_id class_id super_class_id path"]
        for _ in range(count):
            class_id += 1
            for k in range(per_class):
                item += 1
                relative = f"bicycle_final/{class_id}_{k}.JPG"
                write_image(base / relative, 2000 + item)
                lines.append(f"{item} {class_id} 1 {relative}")
        (base / file_name).write_text("\n".join(lines) + "\n")
    return base


def inshop(root: Path, extra_train: int = 0) -> Path:
    """Two train items (4 images), two test items with query and gallery images, one gallery-only item;
    ``extra_train`` more train items of two images each."""
    base = root / "inshop"
    rows = [*((f"id_1{extra:07d}", "train") for extra in range(extra_train) for _ in range(2)),
        ("id_00000001", "train"), ("id_00000001", "train"), ("id_00000002", "train"), ("id_00000002", "train"),
        ("id_00000003", "query"), ("id_00000003", "gallery"), ("id_00000003", "gallery"),
        ("id_00000004", "query"), ("id_00000004", "query"), ("id_00000004", "gallery"),
        ("id_00000005", "gallery"),
    ]
    lines = [str(len(rows)), "image_name item_id evaluation_status"]
    for number, (item_id, status) in enumerate(rows):
        relative = f"img/WOMEN/Dresses/{item_id}/{number:02d}_1_front.jpg"
        write_image(base / "Img" / relative, 3000 + number)
        lines.append(f"{relative}  {item_id}  {status}")
    (base / "Eval").mkdir(parents=True)
    (base / "Eval" / "list_eval_partition.txt").write_text("\n".join(lines) + "\n")
    return base


def folder(root: Path, classes: int = 4, per_class: int = 3) -> Path:
    base = root / "folder"
    for class_index in range(classes):
        for k in range(per_class):
            write_image(base / f"class_{class_index}" / f"{k}.png", 4000 + class_index * per_class + k)
    return base


def csv(root: Path, roles: bool = True, extra_train: int = 0) -> Path:
    """Train rows of classes a, b; test rows of c, d (with query/gallery roles when ``roles``);
    ``extra_train`` more train classes of two rows each."""
    base = root / "csvdata"
    rows = ["path,label,split" + (",role" if roles else "")]
    specs = [*((f"e{extra}", "train", "") for extra in range(extra_train) for _ in range(2)),("a", "train", ""), ("a", "train", ""), ("b", "train", ""), ("b", "train", ""),
             ("c", "test", "query"), ("c", "test", "gallery"), ("d", "test", "query"), ("d", "test", "gallery")]
    for number, (label, split, role) in enumerate(specs):
        relative = f"pictures/{label}{number}.png"
        write_image(base / relative, 5000 + number)
        rows.append(f"{relative},{label},{split}" + (f",{role}" if roles else ""))
    (base / "labels.csv").write_text("\n".join(rows) + "\n")
    return base / "labels.csv"


def emoji(root: Path, classes: int = 160) -> Path:
    """``data fetch emoji``'s layout: ``emoji.json`` and ``img/<vendor>/64/*.png`` of four vendors, the
    README's commands' ``~/data/emoji``; every fifth emoji drawn by two vendors only, as many real ones
    are (so that a sampler asking 4 images of every class is refused, as on the real data)."""
    base = root / "emoji"
    vendors = ("apple", "google", "twitter", "facebook")
    entries = []
    for index in range(classes):
        unified = f"{0x1F300 + index:X}"
        drawn = vendors[1:3] if index % 5 == 4 else vendors
        entries.append({"unified": unified, "name": unified, "image": f"{unified.lower()}.png", "sort_order": index,
                        "category": "Objects", "subcategory": "x",
                        **{f"has_img_{vendor}": vendor in drawn for vendor in vendors}})
        for number, vendor in enumerate(drawn):
            path = base / "img" / vendor / "64" / f"{unified.lower()}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            pixels = np.random.default_rng(10 * index + number).integers(0, 256, (64, 64, 4), dtype=np.uint8)
            Image.fromarray(pixels, "RGBA").save(path)
    # A vendor drawing two emoji alike, as on the real data: data check reports it and exits 1.
    first, last = (base / "img" / "google" / "64" / f"{entry['unified'].lower()}.png" for entry in (entries[0], entries[-1]))
    last.write_bytes(first.read_bytes())
    (base / "emoji.json").write_text(json.dumps(entries))
    return base


# The data the documentation's commands read, by the name a block's ``replica=NAME`` marker gives;
# each builder writes under the folder it is given, which the block sees as ``~/data``.
def benchmarks(root: Path) -> Path:
    """The standard benchmarks' folders side by side, as ``~/data`` holds them in docs/usage.md."""
    for build in (cub200, cars196, sop, inshop):
        build(root)
    return root


DOC_REPLICAS = {"emoji": emoji, "benchmarks": benchmarks}


BUILDERS = {"cub200": cub200, "cars196": cars196, "sop": sop, "inshop": inshop, "folder": folder, "csv": csv}


def write_png16(path: Path, pixels: np.ndarray) -> None:
    """A 16-bit PNG of ``pixels`` (uint16 ``[H, W]`` grey or ``[H, W, 3]`` colour), written byte by byte (Pillow
    writes no 16-bit colour PNG)."""
    import struct
    import zlib

    rows = pixels if pixels.ndim == 3 else pixels[:, :, None]
    height, width, channels = rows.shape
    raw = b"".join(b"\x00" + rows[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 16, {1: 0, 3: 2}[channels], 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
