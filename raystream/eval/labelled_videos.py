"""Labelled probe sets for kNN / linear / attentive probes: clips (N, T, C, H, W) in [0, 1] with class labels.

- Demo data (`eval.dataset` None, `data.videos` None): `moving_digits` gives digit classes (a held-out digit
  drifting on the canvas; train and test use different digit images), `walking_tour` scene classes (a pan over one
  photograph, at random places, with held-out digits drifting over it). Rendered with the demo generator directly
  (no codec round trip), deterministic in `data.demo.seed`.
- `eval.dataset`: a folder with one sub-folder of videos per class, or a CSV manifest with `path,label`. Each video
  gives clips evenly spaced over it (T = stream.frames_per_clip at stream.fps); videos, not clips, are split
  between train and test (about 70/30 per class, seeded), so no video is in both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import torch

from raystream.data.config import StreamConfig
from raystream.data.decode.backends import open_scaled_reader
from raystream.data.decode.frames import crop_square, square_resize
from raystream.data.demo.render import PHOTOS, Sprites, digit_images, digit_pool, photo_strip
from raystream.data.errors import DataError
from raystream.data.named import uses_demo
from raystream.data.stream.clips import ClipGeometry
from raystream.data.videos.cache import NodeCache
from raystream.data.videos.index import describe_videos
from raystream.data.videos.listing import MANIFEST_EXTENSIONS, VideoEntry, class_folders, resolve_videos
from raystream.uris import is_uri


@dataclass
class ProbeSet:
    train_x: torch.Tensor  # (N, T, C, H, W) float32 in [0, 1]
    train_y: torch.Tensor  # (N,) long
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    class_names: Tuple[str, ...] = ()


def load_probe_set(data_cfg, stream_cfg, eval_cfg) -> ProbeSet:
    """The probe set of `eval_cfg.dataset`, or of the demo data when that is None (see the module docstring)."""
    dataset = eval_cfg.dataset
    limit = int(eval_cfg.max_probe_samples or 10 ** 9)  # null: every sample
    if dataset is None:
        if not uses_demo(data_cfg):
            raise DataError("`eval.dataset` is not set: probing a model trained on your own videos needs a labelled "
                            "set (a folder of class sub-folders, or a CSV manifest with path,label)")
        return _demo_probe(data_cfg.demo, stream_cfg, limit)
    return _folder_probe(str(dataset), data_cfg, stream_cfg, limit)


# ---------------------------------------------------------------------------------------------- demo


def _demo_probe(demo_cfg, stream_cfg, limit: int) -> ProbeSet:
    per_class = max(2, min(int(demo_cfg.probe_per_class), limit // (10 if demo_cfg.kind == "moving_digits"
                                                                     else len(PHOTOS))))
    rng = np.random.default_rng([int(demo_cfg.seed), 7919])
    canvas, T = int(demo_cfg.canvas), int(stream_cfg.frames_per_clip)
    pool = digit_pool(heldout=True)
    labels = digit_images()[1]
    clips: Dict[str, List[Tuple[np.ndarray, int]]] = {"train": [], "test": []}
    if demo_cfg.kind == "moving_digits":
        names = tuple(str(d) for d in range(10))
        for c in range(10):
            images = rng.permutation(pool[labels[pool] == c])
            for i in range(per_class):
                split = "train" if i % 2 == 0 else "test"
                half = images[0::2] if split == "train" else images[1::2]  # train and test never share an image
                # the probe digit fills ~5/8 of the canvas: a class must be readable from the frame for the
                # probe to measure features (a stream-sized sprite at a random place is chance even for pixels)
                sprites = Sprites(rng, np.asarray([half[(i // 2) % len(half)]]), 1, canvas,
                                  max(int(demo_cfg.digit_scale), (canvas * 5 // 8) // 8),
                                  float(demo_cfg.drift_speed) or 0.5)
                clips[split].append((_clip(sprites, lambda: np.zeros((canvas, canvas, 3), np.float32), T), c))
    else:
        names = tuple(PHOTOS)
        strip, starts = photo_strip(canvas)
        for c in range(len(PHOTOS)):
            for i in range(per_class):
                split = "train" if i % 2 == 0 else "test"
                x0 = starts[c] + int(rng.integers(0, max(1, starts[c + 1] - starts[c] - canvas // 2)))
                sprites = Sprites(rng, pool, int(demo_cfg.objects_per_frame), canvas, int(demo_cfg.digit_scale),
                                  float(demo_cfg.drift_speed))
                clips[split].append((_clip(sprites, _pan(strip, x0, canvas), T), c))
    res = int(stream_cfg.resolution)

    def stack(items):
        x = torch.from_numpy(np.stack([square_resize(frames, res) for frames, _ in items])).float().div_(255.0)
        return x, torch.tensor([y for _, y in items], dtype=torch.long)

    train_x, train_y = stack(clips["train"])
    test_x, test_y = stack(clips["test"])
    return ProbeSet(train_x, train_y, test_x, test_y, len(names), names)


def _pan(strip: np.ndarray, x0: int, canvas: int):
    """A background that moves one column right per call, starting at column x0 of the photo strip."""
    state = {"x": x0}

    def view() -> np.ndarray:
        cols = np.arange(state["x"], state["x"] + canvas) % strip.shape[1]
        state["x"] += 1
        return strip[:, cols].astype(np.float32) / 255.0

    return view


def _clip(sprites, background, T: int) -> np.ndarray:
    frames = []
    for _ in range(T):
        frames.append((sprites.draw(background()) * 255).round().astype(np.uint8))
        sprites.move()
    return np.stack(frames)


# ---------------------------------------------------------------------------------------------- folders


def labelled_entries(dataset: str):
    """The labelled videos of `eval.dataset`: a folder (or prefix) of class sub-folders, or a CSV manifest."""
    suffix = Path(dataset.rstrip("/")).suffix.lower()
    if suffix in MANIFEST_EXTENSIONS and (is_uri(dataset) or Path(dataset).expanduser().is_file()):
        entries = resolve_videos(dataset, "eval.dataset")
        missing = [e.path for e in entries if e.label is None]
        if missing:
            raise DataError(f"eval.dataset = {dataset!r}: a probe manifest needs a `label` for every row "
                            f"(none for {missing[0]})")
        return entries
    if not is_uri(dataset) and not Path(dataset).expanduser().exists():
        raise DataError(f"eval.dataset = {dataset!r}: not found (expected a folder of class sub-folders or a CSV)")
    return [VideoEntry(e.path, label, e.source) for folder, label in class_folders(dataset)
            for e in resolve_videos(folder, "eval.dataset")]


def _folder_probe(dataset: str, data_cfg, stream_cfg, limit: int) -> ProbeSet:
    res = int(stream_cfg.resolution)
    entries = labelled_entries(str(dataset))
    if not entries:
        raise DataError(f"eval.dataset = {dataset!r}: holds no labelled videos")
    good, bad = describe_videos(entries, data_cfg, "eval.dataset")
    if bad:
        listing = "\n".join(f"  {p}: {problem}" for p, problem in bad)
        raise DataError(f"{len(bad)} bad video(s) in eval.dataset = {dataset!r}:\n{listing}")
    cache = NodeCache.from_config(data_cfg)
    for v in good:  # a probe set is small: its videos from a store are all fetched before the first is read
        if v.source is not None:
            cache.fetch(v.source)
    names = tuple(sorted({v.label for v in good}))
    if len(names) < 2:
        raise DataError(f"eval.dataset = {dataset!r}: needs at least 2 classes, found {list(names)}")
    rng = np.random.default_rng(int(stream_cfg.seed))
    split: Dict[str, List] = {"train": [], "test": []}
    for name in names:
        vids = [v for v in good if v.label == name]
        vids = [vids[i] for i in rng.permutation(len(vids))]
        n_test = int(round(0.3 * len(vids))) if len(vids) > 1 else 0
        split["test"] += vids[:n_test]
        split["train"] += vids[n_test:]
    per_video = max(1, min(8, limit // max(1, len(good))))
    out = []
    for part in ("train", "test"):
        xs, ys = [], []
        for v in split[part]:
            geometry = ClipGeometry.from_config(_one_clip_cfg(stream_cfg), v.fps)
            k_all = np.unique(np.linspace(0, geometry.num_clips(v.num_frames) - 1, per_video).round().astype(int))
            reader = open_scaled_reader(v, res, str(data_cfg.decoder), int(data_cfg.max_read_through))
            try:
                for k in k_all.tolist():
                    xs.append(torch.from_numpy(crop_square(reader.get(geometry.frames(k)), res)))
                    ys.append(names.index(v.label))
            finally:
                reader.close()
        x = torch.stack(xs).float().div_(255.0) if xs else torch.zeros(0)
        out += [x, torch.tensor(ys, dtype=torch.long)]
    return ProbeSet(out[0], out[1], out[2], out[3], len(names), names)


def _one_clip_cfg(stream_cfg):
    return StreamConfig(batch_size=1, frames_per_clip=int(stream_cfg.frames_per_clip), fps=float(stream_cfg.fps),
                        clip_shift=int(stream_cfg.clip_shift), resolution=int(stream_cfg.resolution), dtype="uint8")
