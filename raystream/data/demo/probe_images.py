"""A labelled image probe set generated from packages, written as an ImageFolder (`eval.dataset` takes it).

`ensure_digit_probe(root)` writes `root/train/<digit>/*.png` and `root/val/<digit>/*.png` on first use, then finds
it (`demo.write_once`: a `DONE` marker, a private temporary folder renamed into place, as the demo videos). The images
are scikit-learn's held-out digits (every 5th image: the demo videos never show them, raystream/data/demo/render.py),
tinted and placed at a random spot on a black canvas, as they appear in the moving-digits demo. Of each class's
held-out images, alternate ones go to `train` and `val`, each drawn twice (720 images in all): no digit image is in
both. It is the held-out set of the Table 1 miniature (sweeps/experiment/table1_mini.yaml): labelled images that
are not the video being trained on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from PIL import Image

from raystream.data.demo.render import digit_images, digit_pool
from raystream.data.demo.videos import write_once

PROBE_VERSION = 4
CANVAS = 32
COPIES = 2  # renderings (spot, tint) of each digit image
SCALE = 2  # 8 px digits drawn at 16 px, as the start's digits at stream.resolution (table1_start.yaml)


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
