"""The demo videos as real mp4 files: rendered (render.py), encoded (encode.py), cached by their config.

Videos are a deterministic function of the DemoConfig and cached under `demo.cache_dir/<kind>-<hash of the
config>/`; held-out videos (`heldout=True`) use another seed and only held-out digits.

    raystream data make-demo [overrides]     # writes (or finds) them and prints their paths
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Callable, List

from omegaconf import OmegaConf

from raystream.data.demo.encode import write_video
from raystream.data.demo.render import DEMO_KINDS, render_video
from raystream.data.errors import DataError

# 2: a keyframe every second and none at scene cuts. In version 1 x264 chose the keyframes; at the photo_pans cuts
# decord's index disagreed with the container's, so those videos were read by PyAV (exact, slower).
GENERATOR_VERSION = 2
_VIDEO_KEYS = ("kind", "num_videos", "frames_per_video", "fps", "canvas", "objects_per_frame", "drift_speed",
               "scene_frames", "digit_scale", "crf", "seed")


# ---------------------------------------------------------------------------------------------- files


def _as_dict(cfg) -> dict:
    if is_dataclass(cfg):
        return asdict(cfg)
    if OmegaConf.is_config(cfg):
        return OmegaConf.to_container(cfg, resolve=True)
    return {f: getattr(cfg, f) for f in dir(cfg) if not f.startswith("_")}


def demo_dir(cfg, heldout: bool = False) -> Path:
    """Where the demo videos of `cfg` live: cache_dir/<kind>[-heldout]-<hash of what shapes the videos>."""
    if cfg.kind not in DEMO_KINDS:
        raise DataError(f"data.demo.kind = {cfg.kind!r}: expected one of {', '.join(DEMO_KINDS)}")
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
    if int(demo_cfg.canvas) % 2:
        raise DataError(f"data.demo.canvas = {demo_cfg.canvas}: expected an even number of pixels (yuv420p)")
    final = demo_dir(demo_cfg, heldout)
    count = int(demo_cfg.heldout_videos) if heldout else int(demo_cfg.num_videos)
    paths = [final / f"video_{i:03d}.mp4" for i in range(count)]

    def fill(tmp: Path) -> None:
        for i in range(count):
            write_video(tmp / paths[i].name, render_video(demo_cfg, i, heldout), float(demo_cfg.fps),
                        crf=int(demo_cfg.crf), gop=max(1, round(float(demo_cfg.fps))))
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
        print(f"raystream: {exc}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0
