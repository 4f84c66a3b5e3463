"""The held-out probe images of the Table 1 miniature (raystream/data/demo/probe_images.py): ImageFolders that
eval.dataset reads, written once and then found: digits with no digit image in both splits, and photo crops whose
val split comes from the photos' right halves, which the start's source (photo_pans) never shows."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from raystream.data.demo.probe_images import ensure_digit_probe, ensure_generated_probe, jitter_colours
from raystream.data.demo.render import PROBE_PHOTOS, photo_halves
from raystream.eval.probe_sets import list_probe_set


def test_the_held_out_probe_is_an_image_folder_with_no_image_in_both_splits(tmp_path):
    root = ensure_digit_probe(tmp_path / "probe")
    listing = list_probe_set(str(root))
    assert listing.kind == "images" and listing.num_classes == 10
    assert len(listing.train) + len(listing.test) == 720 and min(len(listing.train), len(listing.test)) > 350

    def digit(p):
        return os.path.basename(p).rsplit("_", 1)[0]
    assert not {digit(s.path) for s in listing.train} & {digit(s.path) for s in listing.test}
    marker = (root / "DONE").stat().st_mtime_ns
    assert ensure_digit_probe(tmp_path / "probe") == root and (root / "DONE").stat().st_mtime_ns == marker


def test_the_photo_probe_crops_left_halves_for_train_and_right_halves_for_val(tmp_path):
    root = ensure_generated_probe(tmp_path / "heldout_photos")
    listing = list_probe_set(str(root))
    assert listing.kind == "images" and listing.num_classes == len(PROBE_PHOTOS) == 10
    assert len(listing.train) == len(listing.test) == 400
    halves = dict(zip((os.path.splitext(f)[0] for f in PROBE_PHOTOS), photo_halves(128)))

    def from_half(path, side):
        crop = np.asarray(Image.open(path))
        half = halves[os.path.basename(os.path.dirname(path))][side]
        h, w = half.shape[:2]
        return any((half[y:y + 64, x:x + 64] == crop).all() for y in range(h - 63) for x in range(w - 63))

    for samples, side in ((listing.train, 0), (listing.test, 1)):
        for s in samples[::37]:
            assert from_half(s.path, side), (s.path, side)
    marker = (root / "DONE").stat().st_mtime_ns
    assert ensure_generated_probe(tmp_path / "heldout_photos") == root and (root / "DONE").stat().st_mtime_ns == marker


def test_jitter_colours_changes_brightness_contrast_saturation_and_greys_as_doras_views():
    image = np.ascontiguousarray(photo_halves(128)[PROBE_PHOTOS.index("motorcycle_left.png")][1][:64, :64])
    rng = np.random.default_rng(0)
    assert (jitter_colours(image, rng, jitter=0.0, gray=0.0) == image).all()
    grey = jitter_colours(image, rng, jitter=0.0, gray=1.0)
    assert (grey[..., 0] == grey[..., 1]).all() and (grey[..., 1] == grey[..., 2]).all()
    means = [jitter_colours(image, np.random.default_rng(i), jitter=1.0, gray=0.0).mean() for i in range(20)]
    assert max(means) - min(means) > 0.2 * image.mean()  # brightness is drawn from [0.6, 1.4]


def test_the_jittered_photo_probe_is_the_photo_probe_with_doras_colour_changes(tmp_path):
    root = ensure_generated_probe(tmp_path / "heldout_photos_jittered")
    plain_root = ensure_generated_probe(tmp_path / "heldout_photos")
    plain, listing = list_probe_set(str(plain_root)), list_probe_set(str(root))
    assert listing.kind == "images" and listing.num_classes == plain.num_classes == 10
    assert len(listing.train) == len(listing.test) == 400
    assert sorted(os.path.relpath(s.path, root) for s in listing.test) == \
        sorted(os.path.relpath(s.path, plain_root) for s in plain.test)

    def spread(samples):  # of each image's mean brightness, within its class
        by_class: dict = {}
        for s in samples:
            by_class.setdefault(s.label, []).append(np.asarray(Image.open(s.path), np.float32).mean())
        return np.mean([np.std(v) for v in by_class.values()])

    assert spread(listing.test) > 1.5 * spread(plain.test)  # brightness no longer tells the photo apart
    config = (root / "config.json").read_text()
    assert '"jitter": 0.8' in config and '"gray": 0.2' in config
    marker = (root / "DONE").stat().st_mtime_ns
    assert ensure_generated_probe(tmp_path / "heldout_photos_jittered") == root
    assert (root / "DONE").stat().st_mtime_ns == marker


def test_only_the_generated_probe_names_are_generated(tmp_path):
    names = "heldout_digits or heldout_photos or heldout_photos_jittered"
    with pytest.raises(ValueError, match=f"{names}, not 'my_images'"):
        ensure_generated_probe(tmp_path / "my_images")
