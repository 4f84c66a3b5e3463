"""Clip streams: the frames of the clips `orders.py` puts at each (step, place), decoded once, sharded, resumable.

    stream = build_stream(data_cfg, stream_cfg, rank=0, world_size=1)   # resolves and probes every video first
    for batch in stream.batches(start_step=0): ...                     # this rank's places of each global batch
    stream.state_dict() / stream.load_state_dict(d); iter(stream) continues after the last batch it yielded

A stream is a pure function of (config, seed, step): `clip_refs(step)` says which source frames every place of a
global batch holds without decoding anything (used by `raystream data inspect`). Decoding runs in a background
thread `data.prefetch` batches ahead, through one FrameWindow per open video with its own reader; a batch that takes
longer than `data.decode_timeout_s` raises DataError naming the video instead of hanging the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from raystream.data.backends import open_reader
from raystream.data.clips import ClipGeometry
from raystream.data.errors import DataError
from raystream.data.orders import Order, shard_places
from raystream.data.sources import VideoInfo, probe_videos, resolve_videos
from raystream.data.window import FrameWindow


@dataclass
class ClipRef:
    """One clip: its video file and the source-frame indices of its input (and target) frames."""

    video: str
    frames: List[int]
    target: List[int] = field(default_factory=list)


@dataclass
class Batch:
    """This rank's shard of global batch `step` (b = batch_size // world_size clips)."""

    step: int
    frames: torch.Tensor  # (b, T, C, H, W) float32 in [0, 1], or uint8
    target: Optional[torch.Tensor]  # (b, T_target, C, H, W) when stream.target_frames > 0
    index: torch.Tensor  # (b,) global place of each clip in the global batch
    video_index: torch.Tensor  # (b,) index of each clip's video in the stream's video list
    clips: List[ClipRef]

    def model_inputs(self, device: Optional[torch.device] = None) -> Dict[str, object]:
        """The dict a scenario's model takes (`frames`, `target`, `index`, `step`), on `device` when given."""

        def move(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return t if t is None or device is None else t.to(device, non_blocking=True)

        return {"frames": move(self.frames), "target": move(self.target), "index": move(self.index),
                "step": int(self.step)}


class ClipStream:
    """The clips of `videos` in `stream_cfg.order`, this rank's places only. Build it with `build_stream`."""

    def __init__(self, videos: Sequence[VideoInfo], stream_cfg, data_cfg, rank: int = 0, world_size: int = 1,
                 skipped: Sequence[Tuple[str, str]] = ()):
        self.videos = list(videos)
        self.skipped = list(skipped)
        self.rank, self.world_size = int(rank), int(world_size)
        self.batch_size = int(stream_cfg.batch_size)
        self.resolution = int(stream_cfg.resolution)
        self.dtype = str(stream_cfg.dtype)
        self.epochs = int(stream_cfg.epochs)
        self.decoder = str(data_cfg.decoder)
        self.timeout_s = float(data_cfg.decode_timeout_s)
        self.prefetch = int(getattr(data_cfg, "prefetch", 2))
        self.max_read_through = int(getattr(data_cfg, "max_read_through", 250))
        self.max_open = int(getattr(data_cfg, "max_open_videos", 8))
        self.decord_reset_frames = int(getattr(data_cfg, "decord_reset_frames", 1))
        self.read_ahead = bool(getattr(data_cfg, "read_ahead", True))
        try:
            self.places = shard_places(self.batch_size, self.world_size, self.rank)
        except ValueError as exc:
            raise DataError(f"stream.batch_size / world size: {exc}") from None
        self.geometry = [ClipGeometry.from_config(stream_cfg, v.fps) for v in self.videos]
        counts = [g.num_clips(v.num_frames) for g, v in zip(self.geometry, self.videos)]
        self.order = Order(str(stream_cfg.order), counts, self.batch_size, int(stream_cfg.seed), self.epochs)
        if self.order.num_steps == 0:
            raise DataError(
                f"stream.order = {stream_cfg.order}: {len(self.videos)} videos with {sum(counts)} clips in all "
                f"do not fill one global batch of stream.batch_size = {self.batch_size}"
                + (" (batch_along_video needs at least batch_size videos)" if stream_cfg.order == "batch_along_video"
                   else ""))
        self._fingerprint = _fingerprint(stream_cfg, self.videos, counts)
        self._step = 0
        self.frames_decoded = 0  # frames converted by this stream's windows (each one once in sequential orders)
        self._windows: "OrderedDict[int, FrameWindow]" = OrderedDict()
        self._stop: Optional[threading.Event] = None
        self._thread: Optional[threading.Thread] = None
        self._activity = "starting"

    # ------------------------------------------------------------------ what the stream holds (no decoding)
    @property
    def num_steps(self) -> int:
        """Global steps over all passes."""
        return self.order.num_steps

    def clip_refs(self, step: int, places: Optional[Sequence[int]] = None) -> List[Tuple[int, int, ClipRef]]:
        """(video index, clip index, ClipRef) for `places` (default: this rank's) of global batch `step`."""
        places = self.places if places is None else places
        videos, clips = self.order.clips_at(step, places)
        out = []
        for v, k in zip(videos.tolist(), clips.tolist()):
            g = self.geometry[v]
            out.append((v, k, ClipRef(self.videos[v].path, g.frames(k), g.targets(k))))
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The step of the next batch this stream yields, and a fingerprint of what the step indexes into."""
        return {"step": self._step, "num_steps": self.num_steps, "fingerprint": self._fingerprint}

    def load_state_dict(self, state: dict) -> None:
        if state.get("fingerprint") != self._fingerprint:
            raise DataError("stream state was saved for a different stream (videos, clip settings, order, batch "
                            f"size, seed or epochs changed): fingerprint {state.get('fingerprint')!r} != "
                            f"{self._fingerprint!r}")
        self._check_step(int(state["step"]))
        self._step = int(state["step"])

    def __iter__(self) -> Iterator[Batch]:
        return self.batches(self._step)

    def _check_step(self, step: int) -> None:
        if not 0 <= step <= self.num_steps:  # num_steps itself: a finished stream, which yields nothing
            raise DataError(f"start_step = {step} is outside the stream's {self.num_steps} steps")

    # ------------------------------------------------------------------ decoding
    def batches(self, start_step: int = 0) -> Iterator[Batch]:
        """This rank's Batch for every global step from `start_step` to the end; state follows what is yielded."""
        self._check_step(int(start_step))
        self._stop_producer()
        self._step = int(start_step)
        if self.prefetch <= 0:
            return self._batches_inline(int(start_step))
        return self._batches_prefetched(int(start_step))

    def _batches_inline(self, start: int) -> Iterator[Batch]:
        for t in range(start, self.num_steps):
            batch = self._make_batch(t)
            self._step = t + 1
            yield batch

    def _batches_prefetched(self, start: int) -> Iterator[Batch]:
        items: "queue.Queue" = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        thread = threading.Thread(target=self._produce, args=(start, items, stop), daemon=True,
                                  name=f"raystream-decode-r{self.rank}")
        self._stop, self._thread = stop, thread
        thread.start()
        try:
            for t in range(start, self.num_steps):
                if self._thread is not thread:
                    raise DataError(f"this iterator of the stream was superseded by a later batches()/iter() call "
                                    f"(it stopped before step {t}); iterate the newer one")
                try:
                    item = items.get(timeout=self.timeout_s)
                except queue.Empty:
                    raise DataError(f"decoding step {t} took longer than data.decode_timeout_s = {self.timeout_s}s "
                                    f"(stuck while {self._activity})") from None
                if isinstance(item, BaseException):
                    raise item
                self._step = t + 1
                yield item
        finally:
            self._stop_producer(thread, stop)  # only this generator's own thread: a newer one may be running

    def _produce(self, start: int, items: "queue.Queue", stop: threading.Event) -> None:
        def hand_over(item) -> bool:
            while not stop.is_set():
                try:
                    items.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for t in range(start, self.num_steps):
                if not hand_over(self._make_batch(t)):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            hand_over(exc)

    def _stop_producer(self, thread: Optional[threading.Thread] = None,
                       stop: Optional[threading.Event] = None) -> None:
        """Stop `thread` (default: the current decode thread) and wait for it."""
        if thread is None:
            thread, stop = self._thread, self._stop
        if thread is None:
            return
        stop.set()
        thread.join(timeout=min(self.timeout_s, 30.0))
        if thread is self._thread:
            if thread.is_alive():  # stuck in a decode: abandon its readers, never share them with a new thread
                self._windows = OrderedDict()
            self._thread = self._stop = None

    def _make_batch(self, step: int) -> Batch:
        refs = self.clip_refs(step)
        needed: Dict[int, set] = {}
        for v, _, ref in refs:
            needed.setdefault(v, set()).update(ref.frames, ref.target)
        decoded: Dict[int, Dict[int, np.ndarray]] = {}
        for v, frames in needed.items():
            self._activity = f"decoding frames {min(frames)}..{max(frames)} of {self.videos[v].path}"
            window = self._window(v)
            before = window.decoded
            decoded[v] = window.fetch(sorted(frames))
            self.frames_decoded += window.decoded - before
        self._activity = "idle"
        # numpy, not torch, in the decode thread: see window.square_resize
        frames = np.stack([np.stack([decoded[v][f] for f in ref.frames]) for v, _, ref in refs])
        target = None
        if refs[0][2].target:
            target = np.stack([np.stack([decoded[v][f] for f in ref.target]) for v, _, ref in refs])
        self._release_after(step)
        return Batch(
            step=step,
            frames=self._convert(frames),
            target=None if target is None else self._convert(target),
            index=torch.tensor(list(self.places), dtype=torch.long),
            video_index=torch.tensor([v for v, _, _ in refs], dtype=torch.long),
            clips=[ref for _, _, ref in refs],
        )

    def _convert(self, x: np.ndarray) -> torch.Tensor:
        if self.dtype != "uint8":
            x = np.multiply(x, np.float32(1.0 / 255.0), dtype=np.float32)
        return torch.from_numpy(x)

    def _window(self, v: int) -> FrameWindow:
        if v in self._windows:
            self._windows.move_to_end(v)
            return self._windows[v]
        info = self.videos[v]
        reader = open_reader(info.path, self.decoder, self.max_read_through, self.decord_reset_frames)
        dense = self.order.name != "shuffled"  # sequential orders read forward: their next chunk is predictable
        window = FrameWindow(reader, self.resolution, lattice=self.geometry[v].lattice, dense=dense,
                             max_read_through=self.max_read_through, read_ahead=dense and self.read_ahead)
        self._windows[v] = window
        while len(self._windows) > self.max_open:
            self._windows.popitem(last=False)[1].close()
        return window

    def _release_after(self, step: int) -> None:
        """Drop decoded frames (and, for sequential orders, readers) the next step does not need."""
        nxt: Dict[int, int] = {}
        if step + 1 < self.num_steps:
            for v, _, ref in self.clip_refs(step + 1):
                nxt[v] = min(nxt.get(v, ref.frames[0]), ref.frames[0])
        for v in list(self._windows):
            if v in nxt:
                self._windows[v].release_below(nxt[v])
            elif self.order.name != "shuffled":
                self._windows.pop(v).close()  # sequential orders never come back to a video they left
            else:
                self._windows[v].release_below(1 << 62)

    def close(self) -> None:
        """Stop the decoding thread and close every reader."""
        self._stop_producer()
        for window in self._windows.values():
            window.close()
        self._windows.clear()

    def __getstate__(self) -> dict:  # readers and threads stay in the process that made them
        state = dict(self.__dict__)
        state.update(_windows=OrderedDict(), _stop=None, _thread=None)
        return state

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _fingerprint(stream_cfg, videos: Sequence[VideoInfo], counts: Sequence[int]) -> str:
    keys = ("order", "batch_size", "frames_per_clip", "fps", "clip_shift", "target_frames", "target_offset_s",
            "epochs", "seed")
    desc = {k: getattr(stream_cfg, k, None) for k in keys}
    desc["videos"] = [(os.path.basename(v.path), v.num_frames, round(v.fps, 3), c) for v, c in zip(videos, counts)]
    return hashlib.sha1(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------- building


def build_stream(data_cfg, stream_cfg, rank: int = 0, world_size: int = 1) -> ClipStream:
    """The stream of `data_cfg.videos` (or the demo videos when None) for worker `rank` of `world_size`.

    Every video is probed first; bad ones raise DataError naming each file and its problem
    (`data.on_bad_video=error`) or are skipped with a warning and listed in `stream.skipped` (`skip`).
    """
    if data_cfg.videos is None:
        from raystream.data.demo import ensure_demo_videos

        spec = [str(p) for p in ensure_demo_videos(data_cfg.demo)]
    else:
        spec = data_cfg.videos
    return _stream_over(spec, "data.videos", data_cfg, stream_cfg, rank, world_size)


def build_heldout_stream(data_cfg, stream_cfg) -> ClipStream:
    """One pass (rank 0 of 1) over held-out videos for out-of-stream evaluation: `data.heldout_videos`, or for
    the demo the same generator with another seed and held-out digits."""
    if data_cfg.heldout_videos is not None:
        spec = data_cfg.heldout_videos
    elif data_cfg.videos is None:
        from raystream.data.demo import ensure_demo_videos

        spec = [str(p) for p in ensure_demo_videos(data_cfg.demo, heldout=True)]
    else:
        raise DataError("`data.heldout_videos` is not set: out-of-stream evaluation on your own videos needs "
                        "held-out videos (a list, directory or manifest)")
    return _stream_over(spec, "data.heldout_videos", data_cfg, _one_pass(stream_cfg), 0, 1)


def _one_pass(stream_cfg):
    """A copy of `stream_cfg` (DictConfig, dataclass or namespace) with epochs = 1."""
    import copy

    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(stream_cfg):
            return OmegaConf.merge(stream_cfg, {"epochs": 1})
    except ImportError:  # pragma: no cover
        pass
    out = copy.copy(stream_cfg)
    object.__setattr__(out, "epochs", 1)
    return out


def _stream_over(spec, key: str, data_cfg, stream_cfg, rank: int, world_size: int) -> ClipStream:
    if world_size < 1 or int(stream_cfg.batch_size) % world_size != 0:
        raise DataError(f"stream.batch_size = {stream_cfg.batch_size} is not divisible by the world size "
                        f"{world_size}: every worker holds an equal shard of each global batch")
    entries = resolve_videos(spec, key)
    good, bad = probe_videos(entries, str(data_cfg.decoder), float(data_cfg.decode_timeout_s), data_cfg.fps)
    usable = []
    for info in good:
        g = ClipGeometry.from_config(stream_cfg, info.fps)
        if g.num_clips(info.num_frames) < 1:
            bad.append((info.path, f"has {info.num_frames} frames, shorter than one clip (a clip spans "
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
    return ClipStream(usable, stream_cfg, data_cfg, rank, world_size, skipped=bad)
