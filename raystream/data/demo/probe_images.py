"""Labelled image probe sets generated from packages, written as ImageFolders (`eval.dataset` takes them).

`ensure_generated_probe(root)` writes the set that `root`'s folder name names (GENERATED), on first use.

`ensure_photo_probe(root)` (`heldout_photos`): 10 classes, one per scikit-image photo of PROBE_PHOTOS (none is in
the walking tour); `train` holds 40 random crops of each photo's left half, `val` 40 of its right half, each crop
half the photo's height (PHOTO_CROP px of a photo drawn twice as high). The `photo_pans` demo videos, the Table 1
miniature's start, look at the left halves only, so no val pixel is ever trained on: the role of ImageNet's val set.

`ensure_jittered_photo_probe(root)` (`heldout_photos_jittered`, the Table 1 miniature's probe): the same kind of
crops, each colour-jittered as DoRA's views are (`jitter_colours`). A random backbone tells the plain crops apart by
their brightness and contrast (kNN 0.62); the jitter takes that cue away (0.36), which the start learned to ignore.

`ensure_digit_probe(root)` (`heldout_digits`) writes `root/train/<digit>/*.png` and `root/val/<digit>/*.png` on first
use, then finds it (`demo.write_once`: a `DONE` marker, a private temporary folder renamed into place, as the demo
videos; the photo sets are written the same way). The images are scikit-learn's held-out digits (every 5th image:
the demo videos never show them, raystream/data/demo/render.py), tinted and placed at a random spot on a black
canvas, as they appear in the moving-digits demo. Of each class's held-out images, alternate ones go to `train` and
`val`, each drawn twice (720 images in all): no digit image is in both. It was the held-out set of the Table 1
miniature's first presets; the jittered photo set is its held-out set now (sweeps/experiment/table1_mini.yaml):
labelled images that are not the video being trained on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

from raystream.data.demo.render import PROBE_PHOTOS, digit_images, digit_pool, photo_halves
from raystream.data.demo.videos import write_once

PROBE_VERSION = 4
CANVAS = 32
COPIES = 2  # renderings (spot, tint) of each digit image
SCALE = 2  # 8 px digits drawn at 16 px, as the start's digits at stream.resolution (table1_start.yaml)
PHOTO_VERSION = 1
PHOTO_CROP = 64  # px: the photo_pans demo's canvas (photos drawn 128 px high), as table1_start.yaml renders it
PHOTO_CROPS = 40  # per class and split
JITTERED_VERSION = 1
JITTER = 0.8  # probability of DINO's colour jitter (brightness 0.4, contrast 0.4, saturation 0.2), as DoRA's views
GRAY = 0.2  # probability of grayscale, as DoRA's views


def render_digit(index: int, rng: np.random.Generator, canvas: int = CANVAS, scale: int = SCALE) -> np.ndarray:
    """Digit image `index` tinted and placed at a random spot of a black (canvas, canvas, 3) uint8 image."""
    glyph = np.kron(digit_images()[0][index], np.ones((scale, scale), np.float32))
    room = canvas - glyph.shape[0]
    if room < 0:
        raise ValueError(f"canvas {canvas} px is smaller than a digit drawn at scale {scale} ({glyph.shape[0]} px)")
    y, x = (int(v) for v in rng.integers(0, room + 1, 2))
    image = np.zeros((canvas, canvas, 3), np.float32)
    image[y:y + glyph.shape[0], x:x + glyph.shape[1]] = glyph[:, :, None] * rng.uniform(0.5, 1.0, 3)
    return (image * 255).round().astype(np.uint8)


def ensure_digit_probe(root) -> Path:
    """The ImageFolder of held-out digits at `root` (written on first use; safe when several processes race)."""
    final = Path(os.path.expanduser(str(root)))

    def fill(tmp: Path) -> None:
        labels = digit_images()[1]
        rng = np.random.default_rng(PROBE_VERSION)
        seen: dict = {}
        for index in digit_pool(heldout=True):
            label = int(labels[index])
            seen[label] = seen.get(label, 0) + 1
            folder = tmp / ("train" if seen[label] % 2 else "val") / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            for copy in range(COPIES):
                Image.fromarray(render_digit(int(index), rng)).save(folder / f"digit_{int(index):04d}_{copy}.png")
        (tmp / "config.json").write_text(json.dumps({"version": PROBE_VERSION, "canvas": CANVAS, "scale": SCALE,
                                                     "copies": COPIES}))

    write_once(final, fill)
    return final


def photo_crop(image: np.ndarray, rng: np.random.Generator, size: int = PHOTO_CROP) -> np.ndarray:
    """A random `size` px square of `image` (H, W, 3) uint8."""
    y = int(rng.integers(0, image.shape[0] - size + 1))
    x = int(rng.integers(0, max(0, image.shape[1] - size) + 1))
    return np.ascontiguousarray(image[y:y + size, x:x + size])


def jitter_colours(image: np.ndarray, rng: np.random.Generator, jitter: float = JITTER,
                   gray: float = GRAY) -> np.ndarray:
    """`image` (H, W, 3) uint8 with DoRA's photometric changes (raystream/models/dora/augment.py), drawn with PIL:
    with probability `jitter` brightness, contrast and saturation each scaled by a factor drawn from
    [0.6, 1.4], [0.6, 1.4], [0.8, 1.2]; then, with probability `gray`, made grey."""
    view = Image.fromarray(image)
    if rng.random() < jitter:
        for enhance, spread in ((ImageEnhance.Brightness, 0.4), (ImageEnhance.Contrast, 0.4),
                                (ImageEnhance.Color, 0.2)):
            view = enhance(view).enhance(float(rng.uniform(1 - spread, 1 + spread)))
    if rng.random() < gray:
        view = view.convert("L").convert("RGB")
    return np.asarray(view)


def _photo_set(root, version: int, draw, settings: dict) -> Path:
    """The ImageFolder of PHOTO_CROPS `draw(half, rng)` images of each photo's left half (train) and right half
    (val) at `root`, written on first use (safe when several processes race)."""
    final = Path(os.path.expanduser(str(root)))

    def fill(tmp: Path) -> None:
        rng = np.random.default_rng(version)
        for file, halves in zip(PROBE_PHOTOS, photo_halves(2 * PHOTO_CROP)):
            label = Path(file).stem
            for split, half in zip(("train", "val"), halves):
                folder = tmp / split / label
                folder.mkdir(parents=True, exist_ok=True)
                for i in range(PHOTO_CROPS):
                    Image.fromarray(draw(half, rng)).save(folder / f"{label}_{i:03d}.png")
        (tmp / "config.json").write_text(json.dumps({"version": version, "crop": PHOTO_CROP, "crops": PHOTO_CROPS,
                                                     "photos": list(PROBE_PHOTOS), **settings}))

    write_once(final, fill)
    return final


def ensure_photo_probe(root) -> Path:
    """The ImageFolder of held-out photo crops at `root` (`heldout_photos`)."""
    return _photo_set(root, PHOTO_VERSION, photo_crop, {})


def ensure_jittered_photo_probe(root) -> Path:
    """The ImageFolder of held-out photo crops with DoRA's colour jitter at `root` (`heldout_photos_jittered`)."""
    return _photo_set(root, JITTERED_VERSION, lambda half, rng: jitter_colours(photo_crop(half, rng), rng),
                      {"jitter": JITTER, "gray": GRAY})


GENERATED = {"heldout_digits": ensure_digit_probe, "heldout_photos": ensure_photo_probe,
             "heldout_photos_jittered": ensure_jittered_photo_probe}


def _probe_name(root) -> str:
    return Path(os.path.expanduser(str(root))).name


def is_generated_probe(root) -> bool:
    """Whether `root`'s folder name is one of the probe sets raystream generates (GENERATED)."""
    return _probe_name(root) in GENERATED


def ensure_generated_probe(root) -> Path:
    """The generated probe set that `root`'s folder name names (a key of GENERATED), written there on first use."""
    if not is_generated_probe(root):
        raise ValueError(f"eval.dataset = {root}: raystream generates only probe sets in folders named "
                         f"{' or '.join(sorted(GENERATED))}, not {_probe_name(root)!r}")
    return GENERATED[_probe_name(root)](root)
