"""The ``emoji`` dataset on generated replicas of the npm packages' layout, and its fetch/check commands."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cli_runner import run_cli
from dmlbench import data
from dmlbench.data import emoji_fetch
from dmlbench.data.base import content_hash
from dmlbench.errors import UserInputError

# (unified, sort_order, category, vendors with an image, skin tones)
ENTRIES = [
    ("1F600", 3, "Smileys & Emotion", ("apple", "google", "twitter"), ()),
    ("1F44B", 1, "People & Body", ("apple", "google", "twitter"), ("1F3FB", "1F3FF")),
    ("1F431", 2, "Animals & Nature", ("google", "twitter"), ()),
    ("1F680", 5, "Travel & Places", ("twitter",), ()),  # one image: dropped
    ("1F4A1", 4, "Objects", ("apple", "google", "twitter"), ()),
    ("2764-FE0F", 6, "Smileys & Emotion", ("apple", "google", "twitter"), ()),
]
MISSING = "img/google/64/1f4a1.png"  # listed, never written
TRUNCATED = "img/apple/64/2764-fe0f.png"


def _rgba(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (64, 64, 4), dtype=np.uint8)
    pixels[:16, :, 3] = 0  # a transparent band: what shows there is the background
    return Image.fromarray(pixels, "RGBA")


def write_replica(root: Path) -> Path:
    entries = []
    seed = 0
    for unified, order, category, vendors, tones in ENTRIES:
        image = unified.lower() + ".png"
        entry = {"unified": unified, "name": unified, "image": image, "sort_order": order, "category": category,
                 "subcategory": "x", **{f"has_img_{vendor}": vendor in vendors for vendor in ("apple", "google", "twitter", "facebook")}}
        if tones:
            entry["skin_variations"] = {
                tone: {"unified": f"{unified}-{tone}", "image": f"{unified}-{tone}".lower() + ".png",
                       **{f"has_img_{vendor}": vendor in vendors for vendor in ("apple", "google", "twitter", "facebook")}}
                for tone in tones}
        entries.append(entry)
        for vendor in vendors:
            for name in [image, *(variant["image"] for variant in entry.get("skin_variations", {}).values())]:
                relative = f"img/{vendor}/64/{name}"
                if relative == MISSING:
                    continue
                seed += 1
                path = root / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                _rgba(seed).save(path)
    (root / TRUNCATED).write_bytes((root / TRUNCATED).read_bytes()[:60])
    _rgba(999).save(root / "img/twitter/64/unlisted.png")
    (root / "emoji.json").write_text(json.dumps(entries))
    return root


@pytest.fixture()
def replica(tmp_path: Path) -> Path:
    return write_replica(tmp_path / "emoji")


def build(root: Path, tmp_path: Path, **options: object) -> data.ImageDataset:
    return data.build("emoji", root=str(root), cache_dir=str(tmp_path / "cache"), **options)


def test_classes_follow_sort_order_and_domains_are_vendors(replica: Path, tmp_path: Path) -> None:
    dataset = build(replica, tmp_path)
    # 1F680 has one image (dropped); 1F4A1 keeps apple and twitter; 2764 keeps google and twitter.
    assert dataset.class_names == ["1F44B", "1F431", "1F600", "1F4A1", "2764-FE0F"]
    assert np.bincount(dataset.labels.numpy()).tolist() == [9, 2, 3, 2, 2]
    assert dataset.domains is not None
    assert dataset.domains[dataset.labels.numpy() == 3].tolist() == ["apple", "twitter"]
    # Within a class: vendor by vendor, the base image before its variants.
    assert dataset.domains[:9].tolist() == ["apple"] * 3 + ["google"] * 3 + ["twitter"] * 3
    report = dataset.metadata["source_report"]
    assert report["missing"] == {"count": 1, "files": [MISSING]}
    assert report["unreadable"] == {"count": 1, "files": [TRUNCATED]}
    assert report["unlisted"]["count"] == 1 and report["unlisted"]["per_vendor"]["twitter"] == 1
    assert report["dropped_classes"]["count"] == 1 and report["dropped_classes"]["examples"] == ["1F680"]
    assert report["images_per_vendor"] == {"apple": 5, "google": 6, "twitter": 7}
    assert len(report["problems"]) == 2
    assert dataset.subset([0, 8]).domains.tolist() == ["apple", "twitter"]


def test_a_benchmark_records_the_vendors_images_and_licences(replica: Path, tmp_path: Path) -> None:
    """``benchmark.json``'s data source (``protocol.design.prepare.data_source``): images per vendor, each
    vendor's licence, the images of the test classes; a vendor not chosen has no licence there."""
    from dmlbench.data.emoji import LICENCES
    from dmlbench.protocol.design.folds import fold_layout
    from dmlbench.protocol.design.prepare import data_source

    dataset = build(replica, tmp_path)
    layout = fold_layout(dataset, k=2, mode="contiguous")
    test_images = sum(int((dataset.labels == c).sum()) for c in layout.test_classes)
    assert data_source(dataset, layout) == {
        "test_images": test_images, "images_per_domain": {"apple": 5, "google": 6, "twitter": 7},
        "licences": {vendor: LICENCES[vendor] for vendor in ("apple", "google", "twitter")}}
    chosen = build(replica, tmp_path, vendors="google,twitter")
    assert data_source(chosen, fold_layout(chosen, k=2, mode="contiguous"))["licences"] == {
        vendor: LICENCES[vendor] for vendor in ("google", "twitter")}


def test_skin_tone_modes(replica: Path, tmp_path: Path) -> None:
    dropped = build(replica, tmp_path, skin_tones="drop")
    assert np.bincount(dropped.labels.numpy()).tolist() == [3, 2, 3, 2, 2]
    classes = build(replica, tmp_path, skin_tones="classes")
    # Each variant is a class of its own, right after its base emoji.
    assert classes.class_names[:3] == ["1F44B", "1F44B-1F3FB", "1F44B-1F3FF"]
    assert np.bincount(classes.labels.numpy()).tolist()[:3] == [3, 3, 3]
    with pytest.raises(UserInputError, match="skin_tones"):
        build(replica, tmp_path, skin_tones="merge")


def test_vendors_option_and_unknown_vendor(replica: Path, tmp_path: Path) -> None:
    dataset = build(replica, tmp_path, vendors="twitter,google")
    assert sorted(set(dataset.domains.tolist())) == ["google", "twitter"]
    assert dataset.metadata["source_report"]["vendors"] == ["google", "twitter"]
    with pytest.raises(UserInputError, match="unknown emoji vendor 'samsung'"):
        build(replica, tmp_path, vendors=["google", "samsung"])
    with pytest.raises(UserInputError, match="no img/facebook/64"):
        build(replica, tmp_path, vendors="facebook")


def test_alpha_is_composited_on_the_background(replica: Path, tmp_path: Path) -> None:
    dataset = build(replica, tmp_path, image_size=64, background=[10, 200, 30], skin_tones="drop")
    first = Image.open(replica / "img/apple/64/1f44b.png").convert("RGBA")
    rgba = np.asarray(first, dtype=np.float64)
    alpha = rgba[..., 3:] / 255.0
    expected = rgba[..., :3] * alpha + np.array([10, 200, 30]) * (1 - alpha)
    got = dataset.images[0].permute(1, 2, 0).numpy().astype(np.float64)
    assert np.abs(got - expected).max() <= 1.0  # Pillow rounds in integer arithmetic
    assert (got[:16] == [10, 200, 30]).all()  # fully transparent rows show the background
    small = build(replica, tmp_path, image_size=16, background="black")
    assert small.images.shape[1:] == (3, 16, 16)


def test_cache_returns_the_same_dataset(replica: Path, tmp_path: Path) -> None:
    first, second = build(replica, tmp_path), build(replica, tmp_path)
    assert first.content_hash == second.content_hash
    assert torch.equal(first.images, second.images) and second.domains.tolist() == first.domains.tolist()
    other = build(replica, tmp_path, background="black")
    assert other.content_hash != first.content_hash


def test_domains_enter_the_content_hash_only_when_present() -> None:
    images = torch.arange(24, dtype=torch.uint8).view(2, 3, 2, 2)
    labels = torch.tensor([0, 1])
    digest = hashlib.sha256(f"{tuple(images.shape)}|{tuple(labels.shape)}|".encode())
    digest.update(images.numpy().tobytes() + labels.numpy().astype("<i8").tobytes())
    assert content_hash(images, labels) == digest.hexdigest()
    assert content_hash(images, labels, np.array(["a", "b"])) != content_hash(images, labels, np.array(["b", "a"]))


def test_root_without_emoji_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match="has no emoji.json"):
        data.build("emoji", root=str(tmp_path / "empty"))
    code, _, err = run_cli(["data", "check", "emoji", "--root", str(tmp_path / "empty")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_differing_catalogs_are_refused(replica: Path, tmp_path: Path) -> None:
    package = replica / "emoji-datasource-facebook"
    package.mkdir()
    (package / "emoji.json").write_text("[]")
    with pytest.raises(UserInputError, match="differ"):
        build(replica, tmp_path)


def test_data_check_reports_problems(replica: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "check.json"
    code, out, err = run_cli(["data", "check", "emoji", "--root", str(replica), "vendors=apple,google,twitter",
                              "--json", str(report), f"cache_dir={tmp_path / 'cache'}"], capsys)
    assert code == 1, err
    summary = json.loads(report.read_text())
    assert summary["images_per_domain"] == {"apple": 5, "google": 6, "twitter": 7}
    assert summary["source"]["missing"]["count"] == 1 and summary["source"]["unreadable"]["count"] == 1
    assert summary["source"]["licences"]["twitter"].endswith("CC-BY-4.0")
    assert summary["content_hash"] == build(replica, tmp_path, vendors="apple,google,twitter").content_hash
    assert "missing on disk" in out
    code, _, err = run_cli(["data", "check", "emoji", "--root", str(replica), "vendors=samsung"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "samsung" in err


def _tarball(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, payload in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    return path


def test_fetch_unpacks_a_verified_tarball_once(replica: Path, tmp_path: Path) -> None:
    """Offline: a tarball built here stands for the registry's, its sha256 pinned for the test."""
    tarballs = tmp_path / "tarballs"
    tarballs.mkdir()
    catalog = (replica / "emoji.json").read_bytes()
    image = (replica / "img/google/64/1f600.png").read_bytes()
    path = _tarball(tarballs / emoji_fetch.tarball_name("google"), {
        "package/emoji.json": catalog, "package/img/google/64/1f600.png": image,
        "package/img/google/32/1f600.png": image, "package/README.md": b"not extracted"})
    pinned = {"google": hashlib.sha256(path.read_bytes()).hexdigest()}
    root, lines = tmp_path / "root", []
    first = emoji_fetch.fetch(root, ["google"], tarballs=tarballs, pinned=pinned, report=lines.append)
    assert [outcome.action for outcome in first] == ["unpacked"]
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == [
        ".emoji-google.sha256", "emoji.json", "img/google/64/1f600.png"]
    assert "Apache-2.0" in lines[0]
    again = emoji_fetch.fetch(root, ["google"], tarballs=tarballs, pinned=pinned, report=lines.append)
    assert [outcome.action for outcome in again] == ["present"]
    (root / "img/google/64/1f600.png").write_bytes(b"damaged")
    assert not emoji_fetch.is_present(root, "google")
    with pytest.raises(UserInputError, match="not the pinned"):
        emoji_fetch.fetch(root, ["google"], tarballs=tarballs, pinned={"google": "0" * 64}, report=lines.append)


def test_fetch_without_npm_prints_the_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # npm cannot be found: nothing is downloaded
    code, _, err = run_cli(["data", "fetch", "emoji", "--root", str(tmp_path / "root"), "--vendors", "google,twitter",
                            "--tarballs", str(tmp_path / "tarballs")], capsys)
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "curl -fLO https://registry.npmjs.org/emoji-datasource-twitter/-/" in lines[0]
    assert "dmlbench data fetch emoji --root" in lines[0]
