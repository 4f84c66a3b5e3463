"""Probe samples -> pixels: what the probes feed the frozen encoder, one list of samples at a time.

A `ProbeSource` holds a probe set's train and test samples and `load(samples, view, rng)`, which gives clips
(B, T, 3, r, r) float32 in [0, 1] (images are clips of one frame; the encoder applies ImageNet's mean and std). The
functions over it take any list of samples, so each rank can load and encode its own shard of a probe set.

- images (an ImageFolder): DINO's views at the model's resolution;
- videos (SSv2, `path label` lists): one clip per video of `frames` frames at `fps`, the video's middle clip
  (a short video's last frame repeated), its short side resized to the model's resolution and centre-cropped,
  decoded by `data.decoder` (from the node cache for a bucket);
- clips already in memory (the demo probe set, labelled video folders).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any, Callable, List, Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from raystream.data.config import StreamConfig
from raystream.data.decode.backends import open_scaled_reader
from raystream.data.decode.frames import crop_square
from raystream.data.errors import DataError
from raystream.data.stream.clips import ClipGeometry
from raystream.data.videos.cache import NodeCache
from raystream.data.videos.index import describe_videos
from raystream.data.videos.listing import VideoEntry
from raystream.eval.labelled_videos import labelled_entries, load_probe_set
from raystream.eval.probe_sets import SSV2_LABELS, ProbeListing, Sample, list_probe_set
from raystream.eval.views import clip_view, dino_sizes, image_view

Load = Callable[[Sequence[Any], str, np.random.Generator], torch.Tensor]


@dataclass
class ProbeSource:
    """A probe set's samples (each with `.label`) and how to load them; `kind`: images | videos | clips."""

    kind: str
    train: Sequence[Any]
    test: Sequence[Any]
    num_classes: int
    load: Load


@dataclass(frozen=True)
class TensorSample:
    clip: torch.Tensor  # (T, C, H, W) in [0, 1]
    label: int


def tensor_source(probe) -> ProbeSource:
    """A data.ProbeSet (clips in memory) as a source; its "augment" view is clip_view's crop and flip."""

    def split(x, y):
        return [TensorSample(x[i], int(y[i])) for i in range(x.shape[0])]

    def load(samples, view, rng):
        return torch.stack([clip_view(s.clip, view, rng) for s in samples]).float()

    return ProbeSource("clips", split(probe.train_x, probe.train_y), split(probe.test_x, probe.test_y),
                       int(probe.num_classes), load)


def image_source(listing: ProbeListing, data_cfg, resolution: int, dino_cfg) -> ProbeSource:
    """Images of an ImageFolder, seen as DINO sees them (resize and crop scaled to `resolution`)."""


    cache = NodeCache.from_config(data_cfg)
    resize, crop = dino_sizes(resolution, int(dino_cfg.resize), int(dino_cfg.crop))

    def load(samples: Sequence[Sample], view, rng):
        out = []
        for s in samples:
            path = cache.fetch(s.source) if s.source is not None else s.path
            try:
                with Image.open(path) as im:
                    out.append(image_view(im, view, resize, crop, rng))
            except (OSError, UnidentifiedImageError) as exc:
                raise DataError(f"eval.dataset: cannot read the image {s.path} ({exc}); expected a JPEG or PNG") \
                    from None
        return torch.from_numpy(np.stack(out)).unsqueeze(1).float().div_(255.0)

    return ProbeSource("images", listing.train, listing.test, listing.num_classes, load)


def video_source(listing: ProbeListing, data_cfg, stream_cfg, frames: int, fps: float) -> ProbeSource:
    """Videos of a published list: the middle clip of `frames` frames at `fps` of each (see the module docstring)."""

    res = int(stream_cfg.resolution)
    clip_cfg = StreamConfig(batch_size=1, frames_per_clip=int(frames), fps=float(fps), clip_shift=1, resolution=res,
                            dtype="uint8")
    cache = NodeCache.from_config(data_cfg)
    said = set()  # warnings of describe_videos (videos of a store without an index), each said once, not per batch

    def load(samples: Sequence[Sample], view, rng):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            good, bad = describe_videos([VideoEntry(s.path, None, s.source) for s in samples], data_cfg,
                                        "eval.dataset")
        for w in caught:
            kind = re.sub(r"\d+", "N", str(w.message).splitlines()[0].split(" (e.g.")[0])
            if kind not in said:
                said.add(kind)
                warnings.warn(str(w.message), w.category, stacklevel=2)
        if bad:
            listing_ = "\n".join(f"  {p}: {problem}" for p, problem in bad)
            raise DataError(f"{len(bad)} bad video(s) in eval.dataset:\n{listing_}")
        out: List[np.ndarray] = []
        for v in good:
            if v.source is not None:
                cache.fetch(v.source)
            geometry = ClipGeometry.from_config(clip_cfg, v.fps)
            k = geometry.num_clips(v.num_frames) // 2
            index = [min(f, v.num_frames - 1) for f in geometry.frames(k)]
            reader = open_scaled_reader(v, res, str(data_cfg.decoder), int(data_cfg.max_read_through))
            try:
                out.append(crop_square(reader.get(index), res))
            finally:
                reader.close()
        return torch.from_numpy(np.stack(out)).float().div_(255.0)

    return ProbeSource("videos", listing.train, listing.test, listing.num_classes, load)


PROBE_LAYOUTS = (f"an ImageFolder (train/<class>/, val/<class>/), Something-Something v2 ({SSV2_LABELS} or "
                 "labels.json beside its train and validation splits), `path label` lists (train.csv or .txt beside "
                 "val, validation or test), class sub-folders of videos, or a CSV manifest with path,label")


def check_probe_set(dataset: str) -> str:
    """List the probe set `dataset` (nothing decoded) as `load_probe_source` will: a DataError naming what was
    looked for when it cannot be listed, so that a run or `raystream eval` fails before Ray starts. Its layout."""
    listing = list_probe_set(dataset)
    if listing is not None:
        return listing.layout
    try:
        found = labelled_entries(dataset)
    except DataError as exc:
        raise DataError(f"{exc}; looked for {PROBE_LAYOUTS}") from None
    if not found:
        raise DataError(f"eval.dataset = {dataset!r}: no probe set there; looked for {PROBE_LAYOUTS}")
    return "labelled videos"


def load_probe_source(data_cfg, stream_cfg, eval_cfg) -> ProbeSource:
    """The probe set of `eval.dataset` as a source: a published layout (`list_probe_set`), else the demo probe set
    or labelled video folders, in memory. Clips of videos have
    eval.vjepa's frames and fps under eval.protocol=vjepa, the stream's otherwise."""

    listing = list_probe_set(str(eval_cfg.dataset)) if eval_cfg.dataset is not None else None
    if listing is None:
        return tensor_source(load_probe_set(data_cfg, stream_cfg, eval_cfg))
    if listing.kind == "images":
        return image_source(listing, data_cfg, int(stream_cfg.resolution), eval_cfg.dino)
    vjepa = str(eval_cfg.protocol) == "vjepa"
    return video_source(listing, data_cfg, stream_cfg,
                        int(eval_cfg.vjepa.frames_per_clip if vjepa else stream_cfg.frames_per_clip),
                        float(eval_cfg.vjepa.fps if vjepa else stream_cfg.fps))
