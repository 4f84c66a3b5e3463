"""Decode workers: `data.decode_workers` threads or processes, each with its own readers, running the plan's jobs at
once.

    workers = DecodeWorkers(n, open_reader=lambda video: reader, resolution=r, max_open=8)      # threads
    workers = DecodeProcesses(n, recipes, settings, max_open=8, pin=...)                        # processes.py
    future = workers.submit(job)    # -> Future of a uint8 array (len(job.frames), 3, r, r)
    workers.close()

Which kind (`data.decode_backend`, `choose_backend`): threads and processes run the same jobs through the same
`Router` and decode the same frames, so the batches never depend on the kind or the number of workers. Every
decoder releases the interpreter lock (GIL) for nearly all of a decode: one thread decoding frames at 224 px held
it for 0-1 % of py-spy's samples with torchcodec, 0.4-4 % with decord and 2-7 % with PyAV (`py-spy record --gil`,
1080p H.264 and a 256 px demo video, 2026-11-28; docs/benchmarks.md), so a few threads overlap as well as processes
do, and start at no cost. Many workers beside a trainer whose Python holds the lock queue for it between decoder
calls (16 workers at 4-7 % want most of it), so `auto` takes processes (shared memory, processes.py) from
PROCESSES_FROM workers on, and always threads where frames are decoded on the GPU (NVDEC: the frames land in this
process's device memory, and a second NVDEC worker did not help, docs/benchmarks.md).

Threads: a job goes to the worker that decoded the previous piece of its keyframe interval, whose reader already
stands there (no seek back); other jobs go round-robin. Readers are not thread-safe, so each lives and is closed on
its own worker's thread. The threads are daemons, not a ThreadPoolExecutor (whose threads are joined at exit): a
decode stuck in a corrupt file must not hang the process after the stream gave up on it.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Callable, Dict, Sequence, Tuple

import numpy as np

from raystream.data.decode.frames import crop_square
from raystream.data.decode.plan import Job

_CHUNK = 64  # frames per reader call
DECODE_BACKENDS = ("auto", "threads", "processes")  # the values data.decode_backend takes
PROCESSES_FROM = 4  # auto: decode workers from this many on are processes (on the CPU)
# decode processes pass nameless shared memory (memfd) over Unix SOCK_SEQPACKET sockets: Linux's
PROCESSES_UNSUPPORTED = (None if sys.platform.startswith("linux") else
                         f"decode processes need Linux (memfd, SOCK_SEQPACKET); this is {sys.platform}")


def choose_backend(requested: str, workers: int, device: str = "cpu") -> str:
    """"threads" or "processes" for `data.decode_backend` = `requested` (one of DECODE_BACKENDS) with `workers`
    decode workers decoding on `device`; `auto` as the module docstring says (threads where processes are not supported: not Linux)."""
    if requested not in DECODE_BACKENDS:
        raise ValueError(f"data.decode_backend = {requested!r}: expected one of {', '.join(DECODE_BACKENDS)}")
    if requested == "processes" and PROCESSES_UNSUPPORTED:
        raise ValueError(f"data.decode_backend = processes: {PROCESSES_UNSUPPORTED}; use threads or auto")
    if requested != "auto":
        return requested
    many = device == "cpu" and int(workers) >= PROCESSES_FROM
    return "processes" if many and not PROCESSES_UNSUPPORTED else "threads"


def available_cores() -> int:
    """The CPUs this process may run on (its affinity where the OS tells it, else all of the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_decode_workers() -> int:
    """What this process's CPUs allow: the CPUs it may run on, capped by OMP_NUM_THREADS when that is set (Ray sets
    it to the CPUs it gave the worker), at most 16 (a VideoMAE step of 64 clips of 16 frames per GPU needs about
    11,000 frames/s: 8 workers of one CPU decoder delivered 0.68 of it on a 16-core H200 node)."""
    n = available_cores()
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        n = min(n, int(omp))
    return max(1, min(16, n))


def decode_job(readers: "OrderedDict[int, object]", video: int, frames: Sequence[int], out: np.ndarray,
               open_reader: Callable[[], object], max_open: int) -> None:
    """Decode `frames` of `video` into `out` (n, 3, r, r) with its reader from `readers` (opened with `open_reader`
    when not there; the least recently used closed beyond `max_open`), as a worker thread or process does. A reader
    that failed is closed: its position is unknown, so the next job opens a fresh one."""
    reader = readers.pop(video, None)
    if reader is None:
        reader = open_reader()
    readers[video] = reader
    while len(readers) > max_open:
        readers.popitem(last=False)[1].close()
    r = out.shape[-1]
    try:
        for k in range(0, len(frames), _CHUNK):
            part = list(frames[k:k + _CHUNK])
            crop_square(reader.get(part), r, out=out[k:k + len(part)])
    except BaseException:
        readers.pop(video).close()
        raise


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


class Router:
    """Which of `n` workers runs a job: the one that decoded the previous piece of its keyframe interval (its reader
    stands there), else the next in turn. Both kinds of workers route alike."""

    def __init__(self, n: int):
        self.n, self._next = max(1, int(n)), 0
        self._route: Dict[Tuple[int, int], Tuple[int, int]] = {}  # (video, gop) -> (piece, worker) routed last

    def route(self, job: Job) -> int:
        key = (job.video, job.gop)
        last = self._route.get(key)
        if last is not None and last[0] == job.piece - 1:
            w = last[1]
        else:
            w, self._next = self._next, (self._next + 1) % self.n
        self._route[key] = (job.piece, w)
        return w


class DecodeWorkers:
    """Threads; see the module docstring."""

    def __init__(self, n: int, open_reader: Callable[[int], object], resolution: int, max_open: int = 8,
                 name: str = "raystream-decode"):
        self.open_reader, self.resolution, self.max_open = open_reader, int(resolution), max(1, int(max_open))
        self._router = Router(n)
        self._workers = [_Worker(f"{name}-{i}") for i in range(self._router.n)]

    def submit(self, job: Job) -> Future:
        return self._workers[self._router.route(job)].submit(self._decode, job.video, list(job.frames))

    def release(self, job_id: int) -> None:
        """The stream is done with a job's frames (processes reuse its shared memory; threads' arrays just go)."""

    def _decode(self, worker: _Worker, video: int, frames) -> np.ndarray:
        r = self.resolution
        out = np.empty((len(frames), 3, r, r), dtype=np.uint8)
        decode_job(worker.readers, video, frames, out, lambda: self.open_reader(video), self.max_open)
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
