"""Decode workers: `data.decode_workers` threads, each with its own readers, running the plan's jobs at once.

    workers = DecodeWorkers(n, open_reader=lambda video: reader, resolution=r, max_open=8)
    future = workers.submit(job)    # -> Future of a uint8 array (len(job.frames), 3, r, r)
    workers.close()

decord's decoding and libswscale's scaling release the GIL, so threads decode in parallel; PyAV releases it for
part of its work, so its workers overlap less (benchmarks/stream_decode.py measures both). A job goes to the worker
that decoded the previous piece of its keyframe interval, whose reader already stands there (no seek back);
other jobs go round-robin. Readers are not thread-safe, so each lives and is closed on its own worker's thread.
The threads are daemons, not a ThreadPoolExecutor (whose threads are joined at exit): a decode stuck in a corrupt
file must not hang the process after the stream gave up on it.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Callable, Dict, Tuple

import numpy as np

from raystream.data.decode.frames import crop_square
from raystream.data.decode.plan import Job

_CHUNK = 64  # frames per reader call


def available_cores() -> int:
    """The CPUs this process may run on (its affinity where the OS tells it, else all of the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_decode_workers() -> int:
    """What this process's CPUs allow: the CPUs it may run on, capped by OMP_NUM_THREADS when that is set (Ray sets
    it to the CPUs it gave the worker), at most 8."""
    n = available_cores()
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        n = min(n, int(omp))
    return max(1, min(8, n))


class _Worker:
    """One daemon thread running submitted calls in order, with its own open readers (LRU)."""

    def __init__(self, name: str):
        self.calls: "queue.Queue" = queue.Queue()
        self.readers: "OrderedDict[int, object]" = OrderedDict()
        self.thread = threading.Thread(target=self._run, daemon=True, name=name)
        self.thread.start()

    def submit(self, fn: Callable, *args) -> Future:
        future: Future = Future()
        self.calls.put((future, fn, args))
        return future

    def _run(self) -> None:
        while True:
            call = self.calls.get()
            if call is None:
                return
            future, fn, args = call
            try:
                future.set_result(fn(self, *args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)


class DecodeWorkers:
    """See the module docstring."""

    def __init__(self, n: int, open_reader: Callable[[int], object], resolution: int, max_open: int = 8,
                 name: str = "raystream-decode"):
        self.open_reader, self.resolution, self.max_open = open_reader, int(resolution), max(1, int(max_open))
        self._workers = [_Worker(f"{name}-{i}") for i in range(max(1, int(n)))]
        self._next = 0
        self._route: Dict[Tuple[int, int], Tuple[int, int]] = {}  # (video, gop) -> (piece, worker) routed last

    def submit(self, job: Job) -> Future:
        key = (job.video, job.gop)
        last = self._route.get(key)
        if last is not None and last[0] == job.piece - 1:
            w = last[1]
        else:
            w, self._next = self._next, (self._next + 1) % len(self._workers)
        self._route[key] = (job.piece, w)
        return self._workers[w].submit(self._decode, job.video, list(job.frames))

    def _decode(self, worker: _Worker, video: int, frames) -> np.ndarray:
        reader = worker.readers.pop(video, None)
        if reader is None:
            reader = self.open_reader(video)
        worker.readers[video] = reader
        while len(worker.readers) > self.max_open:
            worker.readers.popitem(last=False)[1].close()
        r = self.resolution
        out = np.empty((len(frames), 3, r, r), dtype=np.uint8)
        try:
            for k in range(0, len(frames), _CHUNK):
                part = frames[k:k + _CHUNK]
                crop_square(reader.get(part), r, out=out[k:k + len(part)])
        except BaseException:
            worker.readers.pop(video).close()  # its position is unknown now: the next job opens a fresh one
            raise
        return out

    def close(self) -> None:
        """Close every reader on its own thread once the job in flight there is done, and end the threads; never
        waits (a stuck decode must not hang close)."""
        for w in self._workers:
            w.calls.put((Future(), _close_readers, ()))
            w.calls.put(None)


def _close_readers(worker: _Worker) -> None:
    while worker.readers:
        worker.readers.popitem()[1].close()
