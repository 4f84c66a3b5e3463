"""Structured configs of the `data` and `stream` groups (`sweeps/data/*.yaml`, `sweeps/stream/*.yaml`).

Plain data: no torch, no Ray. `data` says which videos and how to decode them; `stream` says how clips are cut
from them and in which order they reach the optimizer (the paper's Figure 4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from raystream.checks import Check, one_of
from raystream.data.cache_root import cache_interpolation
from raystream.data.decode.backends import DECODERS
from raystream.data.decode.workers import DECODE_BACKENDS
from raystream.data.demo.render import DEMO_KINDS
from raystream.data.stream.orders import ORDERS


@dataclass
class DemoConfig:
    """Knobs of the generated demo videos (`raystream data make-demo`); they set the stream's temporal correlation.

    `moving_digits`: scikit-learn digits drifting over a `canvas` x `canvas` frame; every `scene_frames` frames one
    digit of the `objects_per_frame` on screen is swapped for another, so the set changes slowly.
    `walking_tour`: a slow pan across scikit-image's photographs (one photo = one scene of `scene_frames` frames)
    with `objects_per_frame` digit sprites moving in the scene.
    `photo_pans`: a camera drifting at `drift_speed` over the left half of one of scikit-image's other photos, jumping
    to another photo and spot every `scene_frames` frames (the Table 1 miniature's varied source for its start).
    """

    kind: str = "moving_digits"  # moving_digits | walking_tour | photo_pans
    num_videos: int = 4
    frames_per_video: int = 240
    fps: float = 30.0
    canvas: int = 64  # frame side in pixels
    objects_per_frame: int = 3  # digit sprites on screen (0: none)
    drift_speed: float = 0.5  # pixels per frame
    scene_frames: int = 120  # frames a digit set / scene lasts before it changes
    digit_scale: int = 2  # an 8x8 digit is drawn as (8*scale) x (8*scale) pixels
    crf: int = 0  # libx264 quality (0 = lossless: the only setting whose output we found to be reproducible)
    probe_per_class: int = 40  # labelled probe clips per class (half train, half test)
    heldout_videos: int = 2  # videos of the held-out stream (same generator, other seed, held-out digits)
    seed: int = 0
    cache_dir: str = cache_interpolation("demo")  # <$RAYSTREAM_CACHE_DIR, else ~/.cache/raystream>/demo


@dataclass
class DataConfig:
    """Where the videos come from and how they are decoded.

    `videos` is a list of paths, a directory, or a manifest file (one path per line, or CSV with `path`[,`label`]).
    When it is None the demo videos described by `demo` are generated on first use and used.
    `heldout_videos` (same forms) feeds `build_heldout_stream`; None with the demo means held-out demo videos.
    Any of these may be or hold URIs of an object store (s3://bucket/prefix/, a manifest object, a video object;
    raystream/data/videos/remote.py): each node fetches the videos into its cache (`cache_dir`) ahead of the stream.
    """

    name: str = "moving_digits"
    videos: Optional[Any] = None
    heldout_videos: Optional[Any] = None
    decoder: str = "auto"  # auto (per file the first installed of decord, torchcodec, pyav that reads it exactly) |
    # torchcodec | decord | pyav; docs/videos.md
    decode_device: str = "cpu"  # cpu | cuda: torchcodec decodes on the GPU (NVDEC) and scales there; says why not
    fps: Optional[float] = None  # overrides the container's fps when it lies
    on_bad_video: str = "error"  # error | skip
    decode_timeout_s: float = 120.0  # a probe or a batch taking longer than this is a DataError, not a hang
    prefetch: int = 2  # batches decoded ahead by the background thread (0 = decode in the caller's thread)
    max_read_through: int = 250  # a forward gap of at most this many frames is decoded through instead of seeking
    max_open_videos: int = 8  # readers kept open per stream (shuffled order revisits videos)
    decode_workers: Optional[int] = None  # decoding threads per training worker (raystream.data.decode.workers); None =
    # what this process's CPUs allow. The batches do not depend on it.
    decode_backend: str = "auto"  # auto | threads | processes (child processes decoding into shared memory); auto:
    # processes from 4 CPU decode workers on, else threads (data/decode/workers.py). The batches do not depend on it.
    read_ahead: bool = True  # decode workers start on the segments of later steps (one job per worker ahead) while
    # the stream waits for and assembles the current batch; false: only what the current step needs
    shuffle_horizon: int = 4  # shuffled order: batches planned together, so the clips of one video segment drawn
    # within them are decoded in one pass over it (data/decode/plan.py); frames of up to this many batches are held
    decord_reset_frames: int = 1  # >0: after this many frames, flush decord's decoder at the next keyframe (a seek,
    # nothing decoded twice), so the frames decord queues ahead stay bounded by the GOP, not the video's length
    # (see backends.DecordReader); 0 = never (decord's memory then rises to an erratic, higher level)
    # videos from an object store (s3://, gs://; raystream/data/videos/cache.py): each node downloads each video once
    # the node cache; None = $RAYSTREAM_CACHE_DIR/videos, else ~/.cache/raystream/videos, read on each node
    cache_dir: Optional[str] = None
    cache_limit_gb: Optional[float] = None  # bound on the node cache's videos (None = no bound); passed videos go first
    prefetch_videos: int = 2  # videos fetched ahead of those the current step reads
    download_retries: int = 3  # retries of a failed download (with back-off) before a DataError naming the object
    demo: DemoConfig = field(default_factory=DemoConfig)


@dataclass
class StreamConfig:
    """How clips are cut from the videos and batched (see `raystream/data/stream/orders.py`).

    A clip is `frames_per_clip` frames `stride = round(source_fps / fps)` source frames apart; clip k of a video
    starts at source frame k * `clip_shift`. With `target_frames` > 0 it also carries that many target frames at
    the same stride, the first one `target_offset_s` seconds after the clip's last input frame.
    """

    order: str = "batch_along_time"  # batch_along_time | batch_along_video | shuffled
    batch_size: int = 8  # global batch size, split over data-parallel workers
    frames_per_clip: int = 4
    fps: float = 15.0  # frames per second of video time sampled into a clip
    clip_shift: int = 2  # source frames between the starts of consecutive clips of a video
    target_frames: int = 0  # future prediction: frames to predict after the clip (0 = none)
    target_offset_s: float = 0.64  # future prediction: how far after the clip's last frame the targets start
    resolution: int = 32  # frames center-cropped to a square and resized to resolution x resolution
    dtype: str = "float"  # float (in [0, 1]) | uint8
    epochs: int = 1
    seed: int = 0


# The options a `data` / `stream` key takes (DECODERS, DEMO_KINDS and ORDERS live with the code that implements them).
ON_BAD_VIDEO = ("error", "skip")
DECODE_DEVICES = ("cpu", "cuda")
STREAM_DTYPES = ("float", "uint8")

STREAM_CHECKS = [
    one_of("order", ORDERS),
    Check("batch_size", lambda v: v >= 1, "an integer >= 1"),
    Check("frames_per_clip", lambda v: v >= 1, "an integer >= 1"),
    Check("fps", lambda v: v > 0, "a positive number of frames per second"),
    Check("clip_shift", lambda v: v >= 1, "an integer >= 1 (source frames)"),
    Check("target_frames", lambda v: v >= 0, "an integer >= 0"),
    Check("resolution", lambda v: v >= 8, "an integer >= 8 (pixels)"),
    one_of("dtype", STREAM_DTYPES),
    Check("epochs", lambda v: v >= 1, "an integer >= 1"),
    Check("target_offset_s", lambda v: v >= 0, "a time >= 0 (seconds)"),
]

DATA_CHECKS = [
    one_of("decoder", DECODERS),
    one_of("decode_device", DECODE_DEVICES),
    one_of("on_bad_video", ON_BAD_VIDEO),
    Check("fps", lambda v: v is None or v > 0, "null or a positive source frame rate"),
    Check("decode_timeout_s", lambda v: v > 0, "a positive number of seconds"),
    Check("prefetch", lambda v: v >= 0, "an integer >= 0 (batches decoded ahead)"),
    Check("max_read_through", lambda v: v >= 0, "an integer >= 0 (frames)"),
    Check("max_open_videos", lambda v: v >= 1, "an integer >= 1"),
    Check("decode_workers", lambda v: v is None or v >= 1, "null (what the CPUs allow) or an integer >= 1"),
    one_of("decode_backend", DECODE_BACKENDS),
    Check("read_ahead", lambda v: isinstance(v, bool), "true or false"),
    Check("shuffle_horizon", lambda v: v >= 1, "an integer >= 1 (batches)"),
    Check("decord_reset_frames", lambda v: v >= 0, "an integer >= 0 (0 = never flush decord at keyframes)"),
    Check("cache_dir", lambda v: v is None or (isinstance(v, str) and v.strip() != "" and "://" not in v),
          "null ($RAYSTREAM_CACHE_DIR/videos) or a local directory on each node"),
    Check("cache_limit_gb", lambda v: v is None or v > 0, "null (no bound) or a positive size in GB"),
    Check("prefetch_videos", lambda v: v >= 0, "an integer >= 0 (videos fetched ahead)"),
    Check("download_retries", lambda v: v >= 0, "an integer >= 0"),
]
# Demo canvas sides whose encoded videos decord 0.6 fails to read (DECORDArrayCopyFromTo size mismatch); measured
# over every even side from 16 to 256 (tests/test_config.py checks the ones on each side of the bound).
DECORD_UNREADABLE_CANVAS = (16, 24, 48, 72)

DEMO_CHECKS = [
    one_of("kind", DEMO_KINDS),
    Check("num_videos", lambda v: v >= 1, "an integer >= 1"),
    Check("frames_per_video", lambda v: v >= 1, "an integer >= 1"),
    Check("fps", lambda v: v > 0, "a positive frame rate"),
    Check("canvas", lambda v: v >= 18 and v % 2 == 0 and v not in DECORD_UNREADABLE_CANVAS,
          f"an even integer >= 18 (pixels) other than {DECORD_UNREADABLE_CANVAS}: decord cannot read those back"),
    Check("objects_per_frame", lambda v: v >= 0, "an integer >= 0 (0: no digit sprites)"),
    Check("drift_speed", lambda v: v >= 0, "a speed >= 0 (pixels per frame)"),
    Check("scene_frames", lambda v: v >= 1, "an integer >= 1 (frames)"),
    Check("digit_scale", lambda v: v >= 1, "an integer >= 1"),
    Check("crf", lambda v: 0 <= v <= 51, "an x264 crf in [0, 51]"),
    Check("probe_per_class", lambda v: v >= 2, "an integer >= 2"),
    Check("heldout_videos", lambda v: v >= 1, "an integer >= 1"),
]
