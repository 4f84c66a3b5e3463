"""Demo videos generated from data bundled in installed packages (no downloads), written as real mp4 files.

- `moving_digits`: scikit-learn's 8x8 handwritten digits, upscaled and tinted, drifting and bouncing over a black
  canvas; every `scene_frames` frames one digit on screen is swapped for a new one, so the set changes slowly and
  the stream is highly temporally correlated.
- `walking_tour`: a slow camera pan along a strip of scikit-image's photographs (each photo lasts `scene_frames`
  frames: one scene), with digit sprites drifting in the scene, after the paper's WalkingTour Venice video.

Every 5th digit image is held out: the stream videos never show it; held-out videos (`heldout=True`, another seed)
and the labelled probe set (`raystream.data.probe`) use only held-out digits. Videos are a deterministic function
of the DemoConfig and cached under `demo.cache_dir/<kind>-<hash of the config>/`.

    raystream data make-demo [overrides]     # writes (or finds) them and prints their paths
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, is_dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator, List, Tuple

import numpy as np

from raystream.data.config import DEMO_KINDS as _KINDS
from raystream.data.errors import DataError

GENERATOR_VERSION = 1
PHOTOS = {"astronaut": "astronaut.png", "coffee": "coffee.png", "chelsea": "chelsea.png", "rocket": "rocket.jpg",
          "hubble_deep_field": "hubble_deep_field.jpg", "immunohistochemistry": "ihc.png", "retina": "retina.jpg"}
_VIDEO_KEYS = ("kind", "num_videos", "frames_per_video", "fps", "canvas", "objects_per_frame", "drift_speed",
               "scene_frames", "digit_scale", "crf", "seed")


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
        from sklearn.datasets import load_digits

        d = load_digits()
        images, labels = d.images, d.target
    return (images / 16.0).astype(np.float32), labels.astype(np.int64)


def _package_file(package: str, *parts: str):
    """A data file inside an installed package, found without importing the package (None if absent)."""
    import importlib.util

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
    from PIL import Image

    parts, starts, x = [], [], 0
    for name, file in PHOTOS.items():
        path = _package_file("skimage", "data", file)
        if path is not None:
            img = Image.open(path).convert("RGB")
        else:  # pragma: no cover
            import skimage.data

            img = Image.fromarray(getattr(skimage.data, name)()).convert("RGB")
        w = max(height, int(round(img.width * height / img.height)))
        parts.append(np.asarray(img.resize((w, height), Image.Resampling.LANCZOS), dtype=np.uint8))
        starts.append(x)
        x += w
    return np.concatenate(parts, axis=1), np.asarray(starts + [x])


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
            it["pos"] = it["pos"] + it["vel"]
            for a in range(2):
                if not 0 <= it["pos"][a] <= room:
                    it["vel"][a] = -it["vel"][a]
                    it["pos"][a] = float(np.clip(it["pos"][a], 0, room))


def render_video(cfg, index: int, heldout: bool = False) -> Iterator[np.ndarray]:
    """The frames (canvas, canvas, 3) uint8 of demo video `index` (deterministic in cfg and index)."""
    rng = np.random.default_rng([int(cfg.seed), int(index), _KINDS.index(cfg.kind), int(heldout)])
    canvas = int(cfg.canvas)
    sprites = Sprites(rng, digit_pool(heldout), int(cfg.objects_per_frame), canvas, int(cfg.digit_scale),
                      float(cfg.drift_speed))
    if cfg.kind == "walking_tour":
        strip, starts = photo_strip(canvas)
        widths = np.diff(starts)
        scene = int(rng.integers(len(PHOTOS)))
    for t in range(int(cfg.frames_per_video)):
        if t and t % int(cfg.scene_frames) == 0:
            sprites.replace(t // int(cfg.scene_frames) - 1)
        if cfg.kind == "walking_tour":
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


# ---------------------------------------------------------------------------------------------- files


def _as_dict(cfg) -> dict:
    if is_dataclass(cfg):
        return asdict(cfg)
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(cfg):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return {f: getattr(cfg, f) for f in dir(cfg) if not f.startswith("_")}


def demo_dir(cfg, heldout: bool = False) -> Path:
    """Where the demo videos of `cfg` live: cache_dir/<kind>[-heldout]-<hash of what shapes the videos>."""
    if cfg.kind not in _KINDS:
        raise DataError(f"data.demo.kind = {cfg.kind!r}: expected one of {', '.join(_KINDS)}")
    d = _as_dict(cfg)
    desc = {k: d.get(k) for k in _VIDEO_KEYS}
    desc.update(version=GENERATOR_VERSION, heldout=heldout,
                num_videos=int(cfg.heldout_videos) if heldout else int(cfg.num_videos))
    digest = hashlib.sha1(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:12]
    name = f"{cfg.kind}{'-heldout' if heldout else ''}-{digest}"
    return Path(os.path.expanduser(str(cfg.cache_dir))) / name


def ensure_demo_videos(demo_cfg, heldout: bool = False) -> List[Path]:
    """The demo mp4 files of `demo_cfg` (held-out ones with heldout=True), written on first use, then cached.

    Safe when several workers call it at once: each writes a private temporary folder and renames it into place.
    """
    from raystream.data.encode import write_video

    if int(demo_cfg.canvas) % 2:
        raise DataError(f"data.demo.canvas = {demo_cfg.canvas}: expected an even number of pixels (yuv420p)")
    final = demo_dir(demo_cfg, heldout)
    count = int(demo_cfg.heldout_videos) if heldout else int(demo_cfg.num_videos)
    paths = [final / f"video_{i:03d}.mp4" for i in range(count)]

    def fill(tmp: Path) -> None:
        for i in range(count):
            write_video(tmp / paths[i].name, render_video(demo_cfg, i, heldout), float(demo_cfg.fps),
                        crf=int(demo_cfg.crf))
        (tmp / "config.json").write_text(json.dumps(_as_dict(demo_cfg), indent=1, sort_keys=True, default=str))

    write_once(final, fill)
    return paths


def write_once(final: Path, fill: Callable[[Path], None]) -> None:
    """Make the folder `final` once: `fill(tmp)` writes a private temporary folder beside it, which is marked
    `DONE` and renamed into place. Found done, nothing is written; safe when several processes race (the loser's
    copy is dropped: it is identical)."""
    if (final / "DONE").exists():
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        fill(tmp)
        (tmp / "DONE").write_text("ok\n")
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished first: theirs is identical
            if not (final / "DONE").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(cfg) -> int:
    """`raystream data make-demo`: write the demo (stream and held-out) videos of cfg.data.demo; print paths."""
    try:
        paths = ensure_demo_videos(cfg.data.demo) + ensure_demo_videos(cfg.data.demo, heldout=True)
    except DataError as exc:
        print(f"raystream: {exc}", file=__import__("sys").stderr)
        return 2
    for p in paths:
        print(p)
    return 0
