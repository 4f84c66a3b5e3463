"""Building a stream: the videos a config names, checked (index or probe), cut into clips and sharded.

    stream = build_stream(data_cfg, stream_cfg, rank=0, world_size=1)   # resolves and probes every video first
    heldout = build_heldout_stream(data_cfg, stream_cfg)               # one pass over held-out videos

Which videos a config names is data/named.py's rule (`data.videos` None: the generated demo videos). Bad videos
raise DataError naming each file and its problem, or are skipped with a warning (`data.on_bad_video`).
"""

from __future__ import annotations

import copy
import warnings

from omegaconf import OmegaConf

from raystream.data.errors import DataError
from raystream.data.named import heldout_videos, training_videos
from raystream.data.stream.batches import ClipStream
from raystream.data.stream.clips import ClipGeometry
from raystream.data.stream.orders import shard_places
from raystream.data.videos.index import describe_videos
from raystream.data.videos.listing import resolve_videos


def build_stream(data_cfg, stream_cfg, rank: int = 0, world_size: int = 1) -> ClipStream:
    """The stream of `data_cfg.videos` (or the demo videos when None) for worker `rank` of `world_size`.

    Every video is probed first; bad ones raise DataError naming each file and its problem
    (`data.on_bad_video=error`) or are skipped with a warning and listed in `stream.skipped` (`skip`).
    """
    videos = training_videos(data_cfg)
    return _stream_over(videos.spec, videos.key, data_cfg, stream_cfg, rank, world_size)


def build_heldout_stream(data_cfg, stream_cfg) -> ClipStream:
    """One pass (rank 0 of 1) over held-out videos for out-of-stream evaluation: `data.heldout_videos`, or for
    the demo the same generator with another seed and held-out digits.

    The pass is read in one order for every run, shuffled with seed 0, whatever the run's own order and seed: an
    evaluation reads its first `eval.heldout_batches` batches, which are then the same sample of all held-out videos
    for every run, so runs batched along time, along video or shuffled are compared on the same clips (read in the
    run's order, along time they were the first clips of one held-out video, and along video a held-out set needed
    a video for every slot)."""
    videos = heldout_videos(data_cfg)
    if videos is None:
        raise DataError("`data.heldout_videos` is not set: out-of-stream evaluation on your own videos needs "
                        "held-out videos (a list, directory or manifest)")
    return _stream_over(videos.spec, videos.key, data_cfg, _heldout_pass(stream_cfg), 0, 1)


HELDOUT_PASS = {"epochs": 1, "order": "shuffled", "seed": 0}  # the held-out pass, the same for every run


def _heldout_pass(stream_cfg):
    """A copy of `stream_cfg` (DictConfig, dataclass or namespace) with HELDOUT_PASS's values."""
    if OmegaConf.is_config(stream_cfg):
        return OmegaConf.merge(stream_cfg, HELDOUT_PASS)
    out = copy.copy(stream_cfg)
    for key, value in HELDOUT_PASS.items():
        object.__setattr__(out, key, value)
    return out


def _stream_over(spec, key: str, data_cfg, stream_cfg, rank: int, world_size: int) -> ClipStream:
    try:  # before probing: an uneven shard fails at once
        places = shard_places(int(stream_cfg.batch_size), world_size, rank)
    except ValueError as exc:
        raise DataError(str(exc)) from None
    entries = resolve_videos(spec, key)
    good, bad = describe_videos(entries, data_cfg, key)
    usable = []
    for info in good:
        g = ClipGeometry.from_config(stream_cfg, info.fps)
        if g.num_clips(info.num_frames) < 1:
            bad.append((info.given, f"has {info.num_frames} frames, shorter than one clip (a clip spans "
                                    f"{g.span + 1} source frames at {info.fps:g} fps: stream.frames_per_clip="
                                    f"{stream_cfg.frames_per_clip}, stream.fps={stream_cfg.fps}"
                                    + (f", stream.target_frames={stream_cfg.target_frames}" if g.target_frames
                                       else "") + ")"))
        else:
            usable.append(info)
    if bad:
        order = {e.path: i for i, e in enumerate(entries)}
        bad.sort(key=lambda pb: order.get(pb[0], 0))
        listing = "\n".join(f"  {path}: {problem}" for path, problem in bad)
        if str(data_cfg.on_bad_video) == "error":
            raise DataError(f"{len(bad)} bad video(s) in `{key}` (set data.on_bad_video=skip to skip them):\n"
                            f"{listing}")
        for path, problem in bad:
            warnings.warn(f"skipping bad video {path}: {problem}", stacklevel=3)
    if not usable:
        raise DataError(f"`{key}` has no usable video" + (f"; skipped:\n{listing}" if bad else ""))
    return ClipStream(usable, stream_cfg, data_cfg, places, rank, skipped=bad)
