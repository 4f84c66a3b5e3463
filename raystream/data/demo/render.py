"""Rendering the demo videos' frames from images bundled in installed packages (no downloads, no codec).

- `moving_digits`: scikit-learn's 8x8 handwritten digits, upscaled and tinted, drifting and bouncing over a black
  canvas; every `scene_frames` frames one digit on screen is swapped for a new one, so the set changes slowly and
  the stream is highly temporally correlated.
- `walking_tour`: a slow camera pan along a strip of scikit-image's photographs (each photo lasts `scene_frames`
  frames: one scene), with digit sprites drifting in the scene, after the paper's WalkingTour Venice video.

Every 5th digit image is held out: the stream videos never show it; held-out videos and the labelled demo probe set
(which draws its clips with `Sprites` directly) use only held-out digits.
videos.py writes the rendered frames as mp4 files.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Tuple

import numpy as np
from PIL import Image

DEMO_KINDS = ("moving_digits", "walking_tour", "photo_pans")  # the values data.demo.kind takes (index seeds a video)
PHOTOS = {"astronaut": "astronaut.png", "coffee": "coffee.png", "chelsea": "chelsea.png", "rocket": "rocket.jpg",
          "hubble_deep_field": "hubble_deep_field.jpg", "immunohistochemistry": "ihc.png", "retina": "retina.jpg"}
# The Table 1 miniature's stand-in for ImageNet: scikit-image's other bundled photos (none is in the walking tour).
# `photo_pans` videos look at their left halves; the held-out probe's val crops come from their right halves.
PROBE_PHOTOS = ("brick.png", "camera.png", "coins.png", "grass.png", "gravel.png", "horse.png", "moon.png",
                "page.png", "text.png", "motorcycle_left.png")


# ---------------------------------------------------------------------------------------------- bundled data


@lru_cache(maxsize=1)
def digit_images() -> Tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as float images in [0, 1] (1797, 8, 8) and their labels.

    Read straight from the CSV that scikit-learn bundles (importing sklearn.datasets takes seconds)."""
    csv = _package_file("sklearn", "datasets", "data", "digits.csv.gz")
    if csv is not None:
        table = np.loadtxt(csv, delimiter=",")
        images, labels = table[:, :-1].reshape(-1, 8, 8), table[:, -1]
    else:  # pragma: no cover - a layout we do not know: the public loader
        from sklearn.datasets import load_digits  # lazy: takes seconds, and only for an unknown sklearn layout

        d = load_digits()
        images, labels = d.images, d.target
    return (images / 16.0).astype(np.float32), labels.astype(np.int64)


def _package_file(package: str, *parts: str):
    """A data file inside an installed package, found without importing the package (None if absent)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0], *parts)
    return path if path.is_file() else None


def digit_pool(heldout: bool) -> np.ndarray:
    """Indices of the digit images the stream videos (heldout=False) or held-out videos and probes may use."""
    n = len(digit_images()[1])
    idx = np.arange(n)
    return idx[idx % 5 == 0] if heldout else idx[idx % 5 != 0]


@lru_cache(maxsize=4)
def photo_strip(height: int) -> Tuple[np.ndarray, np.ndarray]:
    """scikit-image's photos resized to `height` rows and laid side by side: (strip uint8 (h, W, 3), start column
    of each photo plus the total width). Files are read with Pillow from skimage's data folder (fast, no skimage
    import); skimage.data is the fallback."""
    parts, starts, x = [], [], 0
    for name, file in PHOTOS.items():
        path = _package_file("skimage", "data", file)
        if path is not None:
            img = Image.open(path).convert("RGB")
        else:  # pragma: no cover
            import skimage.data  # lazy: slow to import, and only for an unknown skimage layout

            img = Image.fromarray(getattr(skimage.data, name)()).convert("RGB")
        parts.append(_at_height(img, height))
        starts.append(x)
        x += parts[-1].shape[1]
    return np.concatenate(parts, axis=1), np.asarray(starts + [x])


def _at_height(img: Image.Image, height: int) -> np.ndarray:
    """`img` resized to `height` rows (aspect kept, at least square): uint8 (height, W, 3)."""
    w = max(height, int(round(img.width * height / img.height)))
    return np.asarray(img.resize((w, height), Image.Resampling.LANCZOS), dtype=np.uint8)


@lru_cache(maxsize=4)
def photo_halves(height: int) -> Tuple[Tuple[np.ndarray, np.ndarray], ...]:
    """PROBE_PHOTOS resized to `height` rows (uint8 RGB), each split into its (left, right) halves."""
    halves = []
    for file in PROBE_PHOTOS:
        path = _package_file("skimage", "data", file)
        if path is None:
            raise FileNotFoundError(f"scikit-image's bundled photo {file!r} is not in skimage/data: the photo_pans "
                                    "demo and the held-out photo probe need a scikit-image that bundles it")
        photo = _at_height(Image.open(path).convert("RGB"), height)
        w = photo.shape[1]
        halves.append((photo[:, : w // 2], photo[:, w // 2:]))
    return tuple(halves)


def bounce(pos: np.ndarray, vel: np.ndarray, room) -> np.ndarray:
    """`pos + vel`, kept in [0, room[a]] on each axis a: an axis that leaves it is clipped back and its velocity
    (`vel`, changed in place) reversed."""
    pos = pos + vel
    for a in range(2):
        if not 0 <= pos[a] <= room[a]:
            vel[a] = -vel[a]
            pos[a] = float(np.clip(pos[a], 0, room[a]))
    return pos


class PhotoPan:
    """A `canvas` px camera over the left half of a random PROBE_PHOTOS photo (drawn `2 * canvas` px high), drifting
    at `speed` px/frame and bouncing off the half's edges; `jump()` moves it to another photo and spot."""

    def __init__(self, rng: np.random.Generator, canvas: int, speed: float):
        self.rng, self.canvas, self.speed = rng, canvas, speed
        self.halves = photo_halves(2 * canvas)
        self.jump()

    def jump(self) -> None:
        self.photo = self.halves[int(self.rng.integers(len(self.halves)))][0]
        self.room = np.array([self.photo.shape[0] - self.canvas, max(0, self.photo.shape[1] - self.canvas)], float)
        self.pos = self.rng.uniform(0, 1, 2) * self.room
        angle = self.rng.uniform(0, 2 * np.pi)
        self.vel = self.speed * np.array([np.cos(angle), np.sin(angle)])

    def view(self) -> np.ndarray:
        y, x = (int(round(c)) for c in self.pos)
        return self.photo[y:y + self.canvas, x:x + self.canvas].astype(np.float32) / 255.0

    def move(self) -> None:
        self.pos = bounce(self.pos, self.vel, self.room)


# ---------------------------------------------------------------------------------------------- rendering


class Sprites:
    """`n` tinted digit sprites drifting at `speed` px/frame and bouncing off the canvas edges."""

    def __init__(self, rng: np.random.Generator, pool: np.ndarray, n: int, canvas: int, scale: int, speed: float):
        self.rng, self.pool, self.canvas, self.scale, self.speed = rng, pool, canvas, scale, speed
        self.size = 8 * scale
        self.items = [self._new() for _ in range(n)]

    def _new(self) -> dict:
        room = max(0, self.canvas - self.size)
        angle = self.rng.uniform(0, 2 * np.pi)
        return {"digit": int(self.rng.choice(self.pool)), "pos": self.rng.uniform(0, room, 2),
                "vel": self.speed * np.array([np.cos(angle), np.sin(angle)]),
                "tint": self.rng.uniform(0.5, 1.0, 3).astype(np.float32)}

    def replace(self, i: int) -> None:
        if self.items:
            self.items[i % len(self.items)] = self._new()

    def draw(self, frame: np.ndarray) -> np.ndarray:
        """Max-blend the sprites onto a float (H, W, 3) frame in [0, 1]."""
        images = digit_images()[0]
        room = max(0, self.canvas - self.size)
        for it in self.items:
            x, y = (int(round(c)) for c in np.clip(it["pos"], 0, room))
            glyph = np.kron(images[it["digit"]], np.ones((self.scale, self.scale), np.float32))
            glyph = glyph[: self.canvas - y, : self.canvas - x, None] * it["tint"]
            region = frame[y:y + glyph.shape[0], x:x + glyph.shape[1]]
            np.maximum(region, glyph, out=region)
        return frame

    def move(self) -> None:
        room = max(0, self.canvas - self.size)
        for it in self.items:
            it["pos"] = bounce(it["pos"], it["vel"], (room, room))


def render_video(cfg, index: int, heldout: bool = False) -> Iterator[np.ndarray]:
    """The frames (canvas, canvas, 3) uint8 of demo video `index` (deterministic in cfg and index)."""
    rng = np.random.default_rng([int(cfg.seed), int(index), DEMO_KINDS.index(cfg.kind), int(heldout)])
    canvas = int(cfg.canvas)
    sprites = Sprites(rng, digit_pool(heldout), int(cfg.objects_per_frame), canvas, int(cfg.digit_scale),
                      float(cfg.drift_speed))
    if cfg.kind == "walking_tour":
        strip, starts = photo_strip(canvas)
        widths = np.diff(starts)
        scene = int(rng.integers(len(PHOTOS)))
    elif cfg.kind == "photo_pans":
        pan = PhotoPan(rng, canvas, float(cfg.drift_speed))
    for t in range(int(cfg.frames_per_video)):
        if t and t % int(cfg.scene_frames) == 0:
            sprites.replace(t // int(cfg.scene_frames) - 1)
            if cfg.kind == "photo_pans":
                pan.jump()
        if cfg.kind == "photo_pans":
            frame = pan.view()
            pan.move()
        elif cfg.kind == "walking_tour":
            # the camera crosses one photo per scene; its view wraps around the strip
            s, u = divmod(t, int(cfg.scene_frames))
            p = (scene + s) % len(PHOTOS)
            x = (starts[p] + int(u * max(1, widths[p]) / int(cfg.scene_frames))) % starts[-1]
            cols = np.arange(x, x + canvas) % starts[-1]
            frame = strip[:, cols].astype(np.float32) / 255.0
        else:
            frame = np.zeros((canvas, canvas, 3), np.float32)
        yield (sprites.draw(frame) * 255).round().astype(np.uint8)
        sprites.move()
