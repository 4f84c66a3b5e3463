"""Clip streams: the frames of the clips `orders.py` puts at each (step, place), decoded once, sharded, resumable.

    stream = build_stream(data_cfg, stream_cfg, rank=0, world_size=1)   # build.py: resolves and probes every video
    for batch in stream.batches(start_step=0): ...                     # this rank's places of each global batch
    stream.state_dict() / stream.load_state_dict(d); iter(stream) continues after the last batch it yielded

A stream is a pure function of (config, seed, step): `clip_refs(step)` says which source frames every place of a
global batch holds without decoding anything (used by `raystream data inspect`). Decoding (decode/): `plan.py`
groups the frames the next steps need into jobs (one segment of one video each), `data.decode_workers` threads or
processes (`data.decode_backend`; processes decode into shared memory) decode them at once, already scaled by the
decoder (`frames.py`), and a background thread assembles batches from them `data.prefetch` batches ahead. A batch
that takes longer than `data.decode_timeout_s` raises DataError naming the video instead of hanging the run. None of
this changes which frames a batch holds. What a batch is (Batch, ClipRef) and its assembly from decoded frames:
batch.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import time
import warnings
from concurrent.futures import Future
from contextlib import nullcontext
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from raystream.data.decode.backends import open_reader, open_scaled_reader
from raystream.data.decode.torchcodec_reader import decode_device
from raystream.data.decode.plan import Job, Plan, Segments
from raystream.data.decode.processes import DecodeProcesses, ReaderRecipe, ReaderSettings
from raystream.data.decode.workers import DecodeWorkers, choose_backend, default_decode_workers
from raystream.data.errors import DataError
from raystream.data.stream.batch import Batch, ClipRef, assemble
from raystream.data.stream.clips import ClipGeometry
from raystream.data.stream.orders import Order
from raystream.data.videos.cache import NodeCache
from raystream.data.videos.listing import VideoInfo
from raystream.data.videos.prefetch import VideoPrefetcher

_SEGMENT_BYTES = 32 << 20  # a job decodes at most ~32 MiB of frames at the stream's resolution


class ClipStream:
    """The clips of `videos` in `stream_cfg.order`, at `places` of each global batch. Build it with `build_stream`."""

    def __init__(self, videos: Sequence[VideoInfo], stream_cfg, data_cfg, places: Sequence[int], rank: int = 0,
                 skipped: Sequence[Tuple[str, str]] = ()):
        self.videos = list(videos)
        self.skipped = list(skipped)
        self.places = list(places)
        self.rank = int(rank)
        self.batch_size = int(stream_cfg.batch_size)
        self.resolution = int(stream_cfg.resolution)
        self.dtype = str(stream_cfg.dtype)
        self.epochs = int(stream_cfg.epochs)
        self.decoder = str(data_cfg.decoder)
        self.decode_device, why = decode_device(str(data_cfg.decode_device), self.decoder)
        if why is not None:
            warnings.warn(why, stacklevel=2)
        self.timeout_s = float(data_cfg.decode_timeout_s)
        self.prefetch = int(data_cfg.prefetch)
        self.max_read_through = int(data_cfg.max_read_through)
        self.max_open = int(data_cfg.max_open_videos)
        self.decord_reset_frames = int(data_cfg.decord_reset_frames)
        self.read_ahead = bool(data_cfg.read_ahead)
        self.decode_workers = int(data_cfg.decode_workers or default_decode_workers())
        try:
            self.decode_backend = choose_backend(str(data_cfg.decode_backend), self.decode_workers,
                                                 self.decode_device)
        except ValueError as exc:
            raise DataError(str(exc)) from None
        self.shuffle_horizon = int(data_cfg.shuffle_horizon)
        self.prefetch_videos = int(data_cfg.prefetch_videos)
        # videos from an object store: fetched into this node's cache ahead of the steps that read them
        self.cache = NodeCache.from_config(data_cfg) if any(v.source for v in self.videos) else None
        self._fetcher: Optional[VideoPrefetcher] = None
        self.geometry = [ClipGeometry.from_config(stream_cfg, v.fps) for v in self.videos]
        counts = [g.num_clips(v.num_frames) for g, v in zip(self.geometry, self.videos)]
        self.order = Order(str(stream_cfg.order), counts, self.batch_size, int(stream_cfg.seed), self.epochs)
        if self.order.num_steps == 0:
            raise DataError(
                f"stream.order = {stream_cfg.order}: {len(self.videos)} videos with {sum(counts)} clips in all "
                f"do not fill one global batch of stream.batch_size = {self.batch_size}"
                + (" (batch_along_video needs at least batch_size videos)" if self.order.along_video else ""))
        self._fingerprint = _fingerprint(stream_cfg, self.videos, counts)
        self._step = 0
        self.frames_decoded = 0  # frames the decode workers returned (each one once per pass in sequential orders)
        self.frames_held = 0  # most decoded frames held at once, done or in flight (benchmarks, tests)
        self._segments: Dict[int, Segments] = {}
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
    def batches(self, start_step: int = 0, *, uint8: bool = False, pin_memory: bool = False) -> Iterator[Batch]:
        """This rank's Batch for every global step from `start_step` to the end; state follows what is yielded.

        `uint8`: frames stay uint8 whatever `stream.dtype` (a device prefetcher converts them on the device);
        `pin_memory`: batches are assembled straight into page-locked memory (for asynchronous copies to a GPU)."""
        self._check_step(int(start_step))
        self._stop_producer()
        self._step = int(start_step)
        stop = threading.Event()
        made = self._make_batches(int(start_step), stop, uint8 or self.dtype == "uint8", pin_memory)
        if self.prefetch <= 0:
            return self._batches_inline(made)
        return self._batches_prefetched(int(start_step), made, stop)

    def _batches_inline(self, made: Iterator[Batch]) -> Iterator[Batch]:
        try:
            for batch in made:
                self._step = batch.step + 1
                yield batch
        finally:
            made.close()

    def _batches_prefetched(self, start: int, made: Iterator[Batch], stop: threading.Event) -> Iterator[Batch]:
        items: "queue.Queue" = queue.Queue(maxsize=self.prefetch)
        thread = threading.Thread(target=self._produce, args=(made, items, stop), daemon=True,
                                  name=f"raystream-batches-r{self.rank}")
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

    @staticmethod
    def _produce(made: Iterator[Batch], items: "queue.Queue", stop: threading.Event) -> None:
        def hand_over(item) -> bool:
            while not stop.is_set():
                try:
                    items.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for batch in made:
                if not hand_over(batch):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            hand_over(exc)
        finally:
            made.close()

    def _stop_producer(self, thread: Optional[threading.Thread] = None,
                       stop: Optional[threading.Event] = None) -> None:
        """Stop `thread` (default: the current batch thread) and wait for it (a stuck decode is abandoned)."""
        if thread is None:
            thread, stop = self._thread, self._stop
        if thread is None:
            return
        stop.set()
        thread.join(timeout=min(self.timeout_s, 30.0))
        if thread is self._thread:
            self._thread = self._stop = None

    def _make_batches(self, start: int, stop: threading.Event, uint8: bool, pin_memory: bool) -> Iterator[Batch]:
        """Batches from `start` on: jobs submitted as the steps need them (plus `decode_workers` jobs ahead with
        data.read_ahead), each job's frames dropped after the last step that uses them."""
        plan = Plan(self._needs, self.num_steps, start, self._segments_of, self.order.sequential,
                    self.shuffle_horizon)
        self._fetcher = fetcher = VideoPrefetcher(
            self.cache, [v.source for v in self.videos], self._first_uses(start), self.prefetch_videos, start,
            [v.path for v in self.videos])
        workers = self._start_workers()
        futures: Dict[int, Future] = {}  # job id -> its decoded frames, from submission until the job's last step
        jobs: Dict[int, Job] = {}
        rows: Dict[int, Dict[int, np.ndarray]] = {}  # job id -> frame -> (3, r, r) pixels, once decoded
        ahead = self.decode_workers if self.read_ahead else 0

        def submit_next() -> bool:
            job = plan.next_closed()
            if job is None:
                return False
            jobs[job.id], futures[job.id] = job, workers.submit(job)
            self.frames_held = max(self.frames_held, sum(len(j.frames) for j in jobs.values()))
            return True

        try:
            for t in range(start, self.num_steps):
                uses = plan.uses(t)
                fetcher.reached(t, {v for v, _ in uses})
                while any(j.id not in futures for j in uses.values()) and submit_next():
                    pass
                while sum(1 for j in jobs.values() if j.first > t) < ahead and submit_next():
                    pass
                for job in sorted({j.id: j for j in uses.values()}.values(), key=lambda j: j.id):
                    if job.id not in rows:
                        pixels = self._wait(job, futures[job.id], stop)
                        rows[job.id] = {f: pixels[i] for i, f in enumerate(job.frames)}
                        self.frames_decoded += len(job.frames)
                batch = self._assemble(t, {vf: rows[job.id][vf[1]] for vf, job in uses.items()}, uint8, pin_memory)
                plan.forget(t)
                for job in [j for j in jobs.values() if j.last <= t]:
                    del jobs[job.id], futures[job.id]
                    rows.pop(job.id, None)
                    workers.release(job.id)  # the batch holds copies: nothing reads the job's frames again
                yield batch
        finally:
            workers.close()
            fetcher.close()

    def _start_workers(self):
        """`decode_workers` threads or processes (`decode_backend`), which decode the same frames either way."""
        name = f"raystream-decode-r{self.rank}"
        if self.decode_backend == "threads":
            return DecodeWorkers(self.decode_workers, self._open_reader, self.resolution, self.max_open, name=name)
        recipes = [ReaderRecipe(v.path, v.width, v.height, v.decoder(self.decoder)) for v in self.videos]
        settings = ReaderSettings(self.resolution, self.max_read_through, self.decord_reset_frames,
                                  self.decode_device)
        return DecodeProcesses(self.decode_workers, recipes, settings, self.max_open, name=name,
                               pin=self._local if self.cache is not None else None)

    def _wait(self, job: Job, future: Future, stop: threading.Event) -> np.ndarray:
        path = self.videos[job.video].path
        self._activity = f"decoding frames {job.frames[0]}..{job.frames[-1]} of {path}"
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                out = future.result(timeout=max(0.0, min(0.1, deadline - time.monotonic())))
                break
            except TimeoutError:
                if stop.is_set():
                    raise DataError("stream stopped") from None
                if time.monotonic() > deadline:
                    raise DataError(f"{path}: decoding frames {job.frames[0]}..{job.frames[-1]} took longer than "
                                    f"data.decode_timeout_s = {self.timeout_s}s") from None
        self._activity = "idle"
        return out

    def _assemble(self, step: int, pixels: Dict[Tuple[int, int], np.ndarray], uint8: bool,
                  pin_memory: bool) -> Batch:
        """The batch of `step` from `pixels[(video, frame)]` (batch.py `assemble`)."""
        return assemble(step, self.clip_refs(step), self.places, pixels, self.resolution, uint8, pin_memory)

    def _needs(self, step: int) -> Dict[int, List[int]]:
        need: Dict[int, List[int]] = {}
        for v, _, ref in self.clip_refs(step):
            need.setdefault(v, []).extend(ref.frames + ref.target)
        return need

    def _segments_of(self, v: int) -> Segments:
        if v not in self._segments:
            info = self.videos[v]
            with self._local(v):
                reader = open_reader(info.path, info.decoder(self.decoder), self.max_read_through)
            try:
                keys = reader.keyframes
            finally:
                reader.close()
            # sequential jobs hold every frame of their segment: cap it; shuffled ones only the clips' frames, and
            # a piece not starting at a keyframe would decode from the keyframe again
            cap = max(16, _SEGMENT_BYTES // (3 * self.resolution ** 2)) if self.order.sequential else info.num_frames
            self._segments[v] = Segments(keys, info.num_frames, cap)
        return self._segments[v]

    def _open_reader(self, v: int):
        with self._local(v):
            return open_scaled_reader(self.videos[v], self.resolution, self.decoder, self.max_read_through,
                                      self.decord_reset_frames, self.decode_device)

    def _local(self, v: int):
        """Video `v` on this node's disk while the block opens it (a no-op for local files)."""
        if self._fetcher is not None:
            return self._fetcher.local(v)
        source = self.videos[v].source  # outside batches(): no steps yet, so nothing to keep or pass first
        return self.cache.opened(source) if source is not None and self.cache is not None else nullcontext()

    def _first_uses(self, start: int) -> Iterator[Tuple[int, int]]:
        """(step, video) for each video this rank reads from `start` on, at the first step that reads it."""
        seen = set()
        for t in range(start, self.num_steps):
            for v in self.order.clips_at(t, self.places)[0].tolist():
                if v not in seen:
                    seen.add(v)
                    yield t, v
            if len(seen) == len(self.videos):
                return

    def close(self) -> None:
        """Stop the batch thread (its decode workers close their readers)."""
        self._stop_producer()

    def __getstate__(self) -> dict:  # threads stay in the process that made them
        state = dict(self.__dict__)
        state.update(_stop=None, _thread=None, _fetcher=None)
        return state

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _fingerprint(stream_cfg, videos: Sequence[VideoInfo], counts: Sequence[int]) -> str:
    keys = ("order", "batch_size", "frames_per_clip", "fps", "clip_shift", "target_frames", "target_offset_s",
            "epochs", "seed")
    desc = {k: getattr(stream_cfg, k) for k in keys}
    desc["videos"] = [(os.path.basename(v.path), v.num_frames, round(v.fps, 3), c) for v, c in zip(videos, counts)]
    return hashlib.sha1(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()[:16]
