"""The built-in glyphs dataset: determinism, the cache, homoglyph handling, rendering and augmentation."""

from __future__ import annotations

import math
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import ndimage

from dmlbench import data
from dmlbench.data import glyphs
from dmlbench.data.base import ImageDataset
from dmlbench.data.cache import cache_directory
from dmlbench.data.check import raw_pixel_precision_at_1
from dmlbench.data.splits import train_test_split
from dmlbench.errors import UserInputError

SMALL = {"image_size": 16, "augmentations_per_font": 1, "max_classes": 12}


@pytest.fixture(scope="session")
def default_classes() -> ImageDataset:
    """The default dataset's class set (clean renderings only: augmentations do not change classes)."""
    return data.build("glyphs", augmentations_per_font=0)


def build_small(cache_dir: Path, **options) -> ImageDataset:
    return data.build("glyphs", cache_dir=cache_dir, **{**SMALL, **options})


class CountingGenerate:
    """Wraps ``glyphs.generate`` to count real generations (cache misses)."""

    def __init__(self) -> None:
        self.calls = 0
        self.original = glyphs.generate

    def __call__(self, options):
        self.calls += 1
        return self.original(options)


@pytest.fixture()
def counting(monkeypatch: pytest.MonkeyPatch) -> CountingGenerate:
    counter = CountingGenerate()
    monkeypatch.setattr(glyphs, "generate", counter)
    return counter


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    first = build_small(tmp_path / "a", seed=1)
    second = build_small(tmp_path / "b", seed=1)
    other = build_small(tmp_path / "c", seed=2)
    assert first.content_hash == second.content_hash
    assert torch.equal(first.images, second.images) and torch.equal(first.labels, second.labels)
    assert other.content_hash != first.content_hash
    # Only the augmentations depend on the seed: the clean renderings (first of each font) do not.
    per_font = 1 + SMALL["augmentations_per_font"]
    assert torch.equal(first.images[::per_font], other.images[::per_font])
    assert not torch.equal(first.images[1::per_font], other.images[1::per_font])


def test_layout_of_the_items(tmp_path: Path) -> None:
    dataset = build_small(tmp_path)
    fonts, per_font = len(glyphs.FONT_FILES), 1 + SMALL["augmentations_per_font"]
    assert dataset.images.shape == (12 * fonts * per_font, 1, 16, 16)
    assert dataset.images.dtype == torch.uint8
    assert dataset.labels.tolist() == np.repeat(np.arange(12), fonts * per_font).tolist()
    assert dataset.class_names == [chr(code) for code in glyphs._classes(16, 0.005)[0][:12]]
    assert dataset.name == "glyphs"
    assert dataset.metadata["options"]["seed"] == 0 and dataset.metadata["fonts"] == list(glyphs.FONT_FILES)


def test_cache_hit_returns_identical_data_without_generating(tmp_path: Path, counting: CountingGenerate) -> None:
    generated = build_small(tmp_path)
    assert counting.calls == 1
    cached = build_small(tmp_path)
    assert counting.calls == 1
    assert cached.content_hash == generated.content_hash
    assert torch.equal(cached.images, generated.images) and torch.equal(cached.labels, generated.labels)
    assert cached.class_names == generated.class_names
    assert cached.metadata == generated.metadata
    assert [path.name for path in tmp_path.iterdir()] == [Path(generated.metadata["cache_file"]).name]


@pytest.mark.parametrize("damage", ["truncate", "flip_pixel_bytes", "garbage", "empty"])
def test_damaged_cache_file_is_regenerated(tmp_path: Path, counting: CountingGenerate, damage: str) -> None:
    generated = build_small(tmp_path)
    path = Path(generated.metadata["cache_file"])
    content = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(content[: len(content) // 2])
    elif damage == "flip_pixel_bytes":
        # Same size and a valid archive, but the pixels no longer match the stored content hash.
        middle = len(content) // 2
        path.write_bytes(content[:middle] + bytes(255 - b for b in content[middle : middle + 64]) + content[middle + 64 :])
    elif damage == "garbage":
        path.write_bytes(b"not an npz file at all")
    else:
        path.write_bytes(b"")
    regenerated = build_small(tmp_path)
    assert counting.calls == 2
    assert regenerated.content_hash == generated.content_hash
    # The regenerated file is whole again: the next call is a hit.
    build_small(tmp_path)
    assert counting.calls == 2
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_cache_key_follows_options_and_generator_code(
    tmp_path: Path, counting: CountingGenerate, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_small(tmp_path)
    build_small(tmp_path, augmentation_strength=0.5)
    assert counting.calls == 2 and len(list(tmp_path.iterdir())) == 2
    monkeypatch.setattr(glyphs, "GENERATOR_SOURCE_HASH", "0" * 64)
    build_small(tmp_path)
    assert counting.calls == 3


def test_default_cache_directory_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DMLBENCH_CACHE", str(tmp_path / "from-env"))
    dataset = data.build("glyphs", **SMALL)
    assert Path(dataset.metadata["cache_file"]).parent == tmp_path / "from-env"
    monkeypatch.delenv("DMLBENCH_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_directory() == tmp_path / "home" / ".cache" / "dmlbench"
    assert cache_directory(tmp_path / "given") == tmp_path / "given"


def test_default_class_count_is_several_hundred(default_classes: ImageDataset) -> None:
    counts = np.bincount(default_classes.labels.numpy())
    assert 500 <= len(default_classes.class_names) <= 727
    assert set(counts.tolist()) == {len(glyphs.FONT_FILES)}
    assert default_classes.image_size == (32, 32)


def test_known_homoglyphs_are_one_class(default_classes: ImageDataset) -> None:
    names = set(default_classes.class_names)
    homoglyphs = default_classes.metadata["homoglyphs"]
    latin_a, greek_alpha, cyrillic_a = "A", "\N{GREEK CAPITAL LETTER ALPHA}", "\N{CYRILLIC CAPITAL LETTER A}"
    assert latin_a in names and greek_alpha not in names and cyrillic_a not in names
    assert greek_alpha in homoglyphs[latin_a] and cyrillic_a in homoglyphs[latin_a]
    assert "\N{GREEK CAPITAL LETTER OMICRON}" in homoglyphs["O"]
    # Canonically equivalent characters (a singleton NFC mapping) are the same character.
    for name in names:
        normalized = unicodedata.normalize("NFC", name)
        assert normalized == name or normalized not in names, name
    # Every dropped character is accounted for exactly once.
    dropped = "".join(homoglyphs.values())
    assert len(dropped) == len(set(dropped)) and not set(dropped) & names
    assert len(names) + len(dropped) + len(default_classes.metadata["dropped_empty"]) == len(glyphs.covered_characters())


def test_no_two_classes_are_near_identical_in_any_font(default_classes: ImageDataset) -> None:
    fonts = len(glyphs.FONT_FILES)
    renders = default_classes.images.numpy().reshape(len(default_classes.class_names), fonts, 32, 32)
    distances = glyphs.rendering_distances(renders)
    off_diagonal = distances[~np.eye(len(distances), dtype=bool)]
    assert off_diagonal.min() >= 0.005


def test_rendering_distance_matches_a_loop_reference() -> None:
    renders = glyphs.render_characters([ord(c) for c in "AΑlI0O"], 16)
    distances = glyphs.rendering_distances(renders)
    for a in range(len(renders)):
        for b in range(len(renders)):
            per_font = []
            for font in range(renders.shape[1]):
                x = renders[a, font].astype(np.float64).ravel() / 255.0
                y = renders[b, font].astype(np.float64).ravel() / 255.0
                per_font.append(sum((p - q) ** 2 for p, q in zip(x, y)) / (sum(p * p for p in x) + sum(q * q for q in y)))
            assert distances[a, b] == pytest.approx(min(per_font), abs=1e-5)
    assert distances[0, 1] == 0.0  # Latin A and Greek Alpha share their outlines


def reference_select(distances: np.ndarray, threshold: float) -> list[int]:
    kept: list[int] = []
    owner = []
    for index in range(len(distances)):
        near = [k for k in kept if distances[index][k] < threshold]
        owner.append(near[0] if near else index)
        if not near:
            kept.append(index)
    return owner


@pytest.mark.parametrize("seed", range(5))
def test_greedy_selection_matches_the_loop_reference(seed: int) -> None:
    generator = np.random.default_rng(seed)
    points = generator.uniform(0, 1, (30, 2))
    distances = np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1))
    assert glyphs.select_distinct(distances, 0.2).tolist() == reference_select(distances, 0.2)


def test_greedy_selection_does_not_chain() -> None:
    # a ~ b and b ~ c but a !~ c: a and c stay, b goes to a.
    distances = np.array([[0.0, 0.1, 0.9], [0.1, 0.0, 0.1], [0.9, 0.1, 0.0]])
    assert glyphs.select_distinct(distances, 0.5).tolist() == [0, 0, 2]


def test_characters_that_render_empty_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    original = glyphs.render_characters

    def blank_hash_in_one_font(characters, image_size):
        renders = original(characters, image_size)
        renders[characters.index(ord("#")), 5] = 0
        return renders

    monkeypatch.setattr(glyphs, "render_characters", blank_hash_in_one_font)
    monkeypatch.setattr(glyphs, "covered_characters", lambda: [ord(c) for c in "!#$%&AB"])
    characters, renders, _, dropped = glyphs._classes.__wrapped__(16, 0.005)
    assert dropped == [ord("#")] and characters == [ord(c) for c in "!$%&AB"]
    assert renders.reshape(len(characters), renders.shape[1], -1).any(axis=2).all()


def test_rendering_keeps_position_and_size(default_classes: ImageDataset) -> None:
    covered = glyphs.covered_characters()
    assert all(chr(code).isprintable() and not chr(code).isspace() for code in covered)
    renders = glyphs.render_characters([ord(c) for c in ".'oO_-"], 32)
    for font in range(renders.shape[1]):
        rows = [np.flatnonzero(renders[index, font].any(axis=1)) for index in range(6)]
        period, apostrophe, small_o, capital_o, underscore, hyphen = rows
        assert period.max() > apostrophe.max()  # "." sits on the baseline, "'" high up
        assert len(small_o) < len(capital_o) and small_o.max() == pytest.approx(capital_o.max(), abs=1)
        assert underscore.min() > hyphen.max()
    assert np.all(renders.any(axis=(2, 3)))


def test_strength_zero_leaves_images_unchanged() -> None:
    images = torch.rand(20, 1, 16, 16)
    out = glyphs.augment(images, np.random.default_rng(0), 0.0)
    assert torch.allclose(out, images, atol=1e-5)


def test_augmentation_is_bounded_and_seeded() -> None:
    images = torch.from_numpy(glyphs.render_characters([ord("g")], 16)[0].astype(np.float32) / 255.0).unsqueeze(1)
    first = glyphs.augment(images, np.random.default_rng(4), 1.0)
    again = glyphs.augment(images, np.random.default_rng(4), 1.0)
    other = glyphs.augment(images, np.random.default_rng(5), 1.0)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert float(first.min()) >= 0.0 and float(first.max()) <= 1.0
    assert not torch.allclose(first, images, atol=0.05)


def test_affine_shift_moves_whole_pixels_and_matches_the_matrix_inverse() -> None:
    images = torch.rand(1, 1, 8, 8, dtype=torch.float64)
    zero = torch.zeros(1, dtype=torch.float64)
    one = torch.ones(1, dtype=torch.float64)
    # A shift of 2 pixels right and 1 down is 2 * (2, 1) / 8 in normalised coordinates.
    shifted = glyphs._affine(images, zero, zero, one, one, torch.tensor([[0.5, 0.25]], dtype=torch.float64))
    assert torch.allclose(shifted[0, 0, 1:, 2:], images[0, 0, :-1, :-2], atol=1e-12)
    assert torch.all(shifted[0, 0, 0] == 0) and torch.all(shifted[0, 0, :, :2] == 0)
    # A general warp: each output pixel centre pulls from M^-1 (p - t) with M = R Shear D.
    angle, shear, scale, aspect = (torch.tensor([v], dtype=torch.float64) for v in (0.3, 0.2, 1.1, 0.9))
    shift = torch.tensor([[0.1, -0.2]], dtype=torch.float64)
    warped = glyphs._affine(images, angle, shear, scale, aspect, shift)
    c, s, h = math.cos(0.3), math.sin(0.3), 0.2
    forward = np.array([[c, -s], [s, c]]) @ np.array([[1, h], [0, 1]]) @ np.diag([1.1 * 0.9, 1.1 / 0.9])
    inverse = np.linalg.inv(forward)
    source = images[0, 0].numpy()
    for row in range(8):
        for column in range(8):
            point = np.array([(2 * column + 1) / 8 - 1, (2 * row + 1) / 8 - 1])
            x, y = inverse @ (point - np.array([0.1, -0.2]))
            u, v = ((x + 1) * 8 - 1) / 2, ((y + 1) * 8 - 1) / 2  # pixel coordinates
            expected = 0.0
            for yy in (math.floor(v), math.floor(v) + 1):
                for xx in (math.floor(u), math.floor(u) + 1):
                    if 0 <= yy < 8 and 0 <= xx < 8:
                        expected += (1 - abs(u - xx)) * (1 - abs(v - yy)) * source[yy, xx]
            assert warped[0, 0, row, column].item() == pytest.approx(expected, abs=1e-9)


def test_stroke_extremes_are_dilation_and_erosion() -> None:
    images = torch.rand(3, 1, 9, 9, dtype=torch.float64)
    dilated = glyphs._stroke(images, torch.ones(3, dtype=torch.float64))
    eroded = glyphs._stroke(images, -torch.ones(3, dtype=torch.float64))
    half = glyphs._stroke(images, torch.full((3,), 0.5, dtype=torch.float64))
    for index in range(3):
        picture = images[index, 0].numpy()
        assert np.allclose(dilated[index, 0].numpy(), ndimage.maximum_filter(picture, size=3, mode="constant", cval=0.0))
        assert np.allclose(eroded[index, 0].numpy(), ndimage.minimum_filter(picture, size=3, mode="constant", cval=0.0))
    assert torch.allclose(half, (images + dilated) / 2)


def test_blur_matches_a_truncated_gaussian_loop() -> None:
    images = torch.rand(2, 1, 7, 7, dtype=torch.float64)
    sigma = torch.tensor([0.6, 1.3], dtype=torch.float64)
    blurred = glyphs._gaussian_blur(images, sigma)
    radius = glyphs._BLUR_RADIUS
    for index in range(2):
        weights = [math.exp(-(o * o) / (2 * sigma[index].item() ** 2)) for o in range(-radius, radius + 1)]
        weights = [w / sum(weights) for w in weights]
        picture = images[index, 0].numpy()
        for row in range(7):
            for column in range(7):
                expected = 0.0
                for dy in range(-radius, radius + 1):
                    for dx in range(-radius, radius + 1):
                        if 0 <= row + dy < 7 and 0 <= column + dx < 7:
                            expected += weights[dy + radius] * weights[dx + radius] * picture[row + dy, column + dx]
                assert blurred[index, 0, row, column].item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"image_size": 8}, "image_size"),
        ({"image_size": "32"}, "image_size"),
        ({"image_size": True}, "image_size"),
        ({"augmentations_per_font": -1}, "augmentations_per_font"),
        ({"augmentation_strength": float("nan")}, "augmentation_strength"),
        ({"augmentation_strength": 3.0}, "augmentation_strength"),
        ({"homoglyph_threshold": 1.0}, "homoglyph_threshold"),
        ({"homoglyph_threshold": -0.1}, "homoglyph_threshold"),
        ({"max_classes": 1}, "max_classes"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"cache_dir": 5}, "cache_dir"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_options_are_user_errors_naming_the_option(options: dict, name: str, tmp_path: Path) -> None:
    options = {"cache_dir": tmp_path, **options}
    with pytest.raises(UserInputError, match=name):
        data.build("glyphs", **options)


@pytest.mark.slow
def test_raw_pixel_nearest_neighbour_solves_the_test_half_about_half_the_time(tmp_path: Path) -> None:
    dataset = data.build("glyphs", cache_dir=tmp_path)
    _, test = train_test_split(dataset.labels)
    precision = raw_pixel_precision_at_1(dataset, test, max_queries=3000, seed=0)
    chance = 1 / len(np.unique(dataset.labels[test].numpy()))
    assert 0.4 <= precision <= 0.6 and precision > 50 * chance


def test_unwritable_cache_directory_is_a_user_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(UserInputError, match="cache"):
        build_small(blocker / "cache")
