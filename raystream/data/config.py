"""Structured configs of the `data` and `stream` groups (`sweeps/data/*.yaml`, `sweeps/stream/*.yaml`).

Plain data: no torch, no Ray. `data` says which videos and how to decode them; `stream` says how clips are cut
from them and in which order they reach the optimizer (the paper's Figure 4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class DemoConfig:
    """Knobs of the generated demo videos (`raystream data make-demo`); they set the stream's temporal correlation."""

    kind: str = "moving_digits"  # moving_digits | walking_tour
    num_videos: int = 4
    frames_per_video: int = 240
    fps: float = 30.0
    canvas: int = 64  # frame side in pixels
    objects_per_frame: int = 3
    drift_speed: float = 0.5  # pixels per frame
    scene_frames: int = 120  # frames a digit set / scene lasts before it changes
    seed: int = 0
    cache_dir: str = "~/.cache/raystream/demo"


@dataclass
class DataConfig:
    """Where the videos come from and how they are decoded.

    `videos` is a list of paths, a directory, or a manifest file (one path per line, or CSV with `path`[,`label`]).
    When it is None the demo videos described by `demo` are generated on first use and used.
    """

    name: str = "moving_digits"
    videos: Optional[Any] = None
    decoder: str = "decord"  # decord | pyav
    fps: Optional[float] = None  # overrides the container's fps when it lies
    on_bad_video: str = "error"  # error | skip
    decode_timeout_s: float = 120.0
    demo: DemoConfig = field(default_factory=DemoConfig)


@dataclass
class StreamConfig:
    """How clips are cut from the videos and batched (see `raystream/data/orders.py`)."""

    order: str = "batch_along_time"  # batch_along_time | batch_along_video | shuffled
    batch_size: int = 8  # global batch size, split over data-parallel workers
    frames_per_clip: int = 4
    fps: float = 15.0  # frames per second of video time sampled into a clip
    clip_shift: int = 2  # source frames between the starts of consecutive clips of a video
    target_frames: int = 0  # future prediction: frames to predict after the clip (0 = none)
    target_offset_s: float = 0.64  # future prediction: how far after the clip the targets start
    resolution: int = 32  # frames resized/cropped to resolution x resolution
    dtype: str = "float"  # float (normalised) | uint8
    epochs: int = 1
    seed: int = 0
