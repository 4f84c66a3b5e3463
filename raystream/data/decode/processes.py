"""Decode workers as processes: `data.decode_workers` child processes decoding into shared memory, for when threads
would share one interpreter lock with the trainer.

    workers = DecodeProcesses(n, recipes, settings, max_open=8, pin=lambda video: nullcontext())
    future = workers.submit(job)    # -> Future of a uint8 array (len(job.frames), 3, r, r) in shared memory
    workers.close()                 # ends every child; also at exit, and after a child died

Why: every decoder here releases the interpreter lock for most of its work (workers.py says how much), but a node
feeding a GPU runs many decode workers beside a trainer whose Python holds the lock, and each worker's Python between
decoder calls (the reader's, the crop) then waits its turn. A child process has an interpreter of its own.

How: each child (`python -m raystream.data.decode.processes_child`, spawned fresh: no fork of a threaded trainer;
processes_child.py is its side) gets one message per job over a Unix socket: a small descriptor (job id, video,
frames, how to open the video's reader: `ReaderRecipe`, opened with backends.open_scaled_reader as a thread opens
it) and, passed with it, the descriptor of a nameless shared-memory file (memfd) the parent made for the job's
frames at r x r and mapped. The child maps it, decodes and crops straight into it (the one copy of the frames it
makes, as a thread does into its array), unmaps it and answers with the job id. No frame is pickled, and no segment
has a name: its memory goes when the last process holding it lets go, so nothing is left in /dev/shm however a
process ends. The stream hands a job's segment back (`release`) once its last batch is made, and the next job of
that size class reuses it: fresh shared pages cost 3 ms of page faults and zeroing per 4.5 MiB job, 7x a reused one
(2026-11-28, this machine). Jobs go to workers as threads' do (workers.Router), so the batches are the same whatever
the kind or number of workers.

Faults: a child that dies (killed, a segfault in a corrupt file) closes its socket; the parent's reader thread then
fails the job it was decoding at once with a DataError naming the video, the frames, the worker and how it ended
(and the jobs queued behind it likewise). `close()` (which the stream calls when it ends, fails or is closed) ends
the children (end of input, then SIGKILL after CLOSE_WAIT_S); an exit handler does the same for workers never closed;
a child whose parent died sees its socket close, or, stuck in a decode, notices its parent pid change, and exits.
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, ContextManager, Dict, List, Optional, Sequence

import numpy as np

from raystream.data.decode import processes_child
from raystream.data.decode.plan import Job
from raystream.data.decode.processes_child import MESSAGE_BYTES
from raystream.data.decode.workers import Router
from raystream.data.errors import DataError

CLOSE_WAIT_S = 2.0  # close(): how long children may finish the job in hand before they are killed
SIZE_CLASS = 16  # segments hold a multiple of this many frames, so jobs of similar length reuse them
KEEP_FREE = 8  # released segments kept per size class for reuse


@dataclass(frozen=True)
class ReaderRecipe:
    """What a child needs to open one video's reader (backends.open_scaled_reader's `info`): its local path, its
    frame size and the decoder chosen for it; plain values, so the recipe pickles without the stream's objects."""

    path: str
    width: int
    height: int
    chosen: str  # the decoder that reads this file (VideoInfo.decoder(data.decoder))

    def decoder(self, configured: str) -> str:
        return self.chosen


@dataclass(frozen=True)
class ReaderSettings:
    """The stream-wide arguments of backends.open_scaled_reader."""

    resolution: int
    max_read_through: int = 250
    decord_reset_frames: int = 1
    device: str = "cpu"


def shared_frames(size: int) -> int:
    """A nameless shared-memory file of `size` bytes (memfd; elsewhere an unlinked temporary file): its descriptor."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("raystream-decode", os.MFD_CLOEXEC)
    else:  # pragma: no cover - not Linux
        import tempfile  # lazy: only without memfd

        fd = os.dup(tempfile.TemporaryFile().fileno())
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Segment:
    """A nameless shared-memory file of `frames` frames' room, its descriptor and the parent's mapping of it."""

    def __init__(self, frames: int, frame_bytes: int):
        self.frames = frames
        self.fd = shared_frames(frames * frame_bytes)
        try:
            self.mapping = mmap.mmap(self.fd, frames * frame_bytes)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a view still held: the mapping goes with it
            self.mapping.close()
        os.close(self.fd)


class _Pending:
    """A job sent to a child: its future, its frames' segment, and the pin holding its video on local disk."""

    def __init__(self, job: Job, future: Future, segment: _Segment, pin: contextlib.ExitStack):
        self.job, self.future, self.segment, self.pin = job, future, segment, pin


class _Child:
    """One decode process, the socket to it, and the thread reading its answers."""

    def __init__(self, owner: "DecodeProcesses", index: int, setup: dict):
        self.owner, self.index = owner, index
        self.name = f"{owner.name}-{index}"
        self.pending: "OrderedDict[int, _Pending]" = OrderedDict()  # job id -> pending, in the order sent
        self.lock = threading.Lock()
        self.ended: Optional[str] = None  # how the child ended, once it did
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", processes_child.__name__, str(theirs.fileno())],
                                         stdin=subprocess.DEVNULL, stdout=2, pass_fds=(theirs.fileno(),), env=env)
        finally:
            theirs.close()
        self.sock.sendall(pickle.dumps(setup, protocol=pickle.HIGHEST_PROTOCOL))
        self.thread = threading.Thread(target=self._read_answers, daemon=True, name=f"{self.name}-answers")
        self.thread.start()

    def send(self, pending: _Pending, message: bytes, fd: int) -> None:
        job = pending.job
        with self.lock:
            ended = self.ended
            if ended is None:
                self.pending[job.id] = pending
        if ended is not None:
            self.owner.finish(pending, self.owner.died(self, job, ended, queued=False))
            return
        try:
            socket.send_fds(self.sock, [message], [fd])
        except OSError as exc:
            # The child is gone (a closed peer: it is exiting, perhaps not yet reaped): its answer thread fails the
            # job, saying how it ended.
            if isinstance(exc, (BrokenPipeError, ConnectionResetError)) or self.proc.poll() is not None:
                return
            with self.lock:  # alive, but the job did not go (a descriptor too large for one message)
                self.pending.pop(job.id, None)
            self.owner.finish(pending, DataError(
                f"{self.owner.recipes[job.video].path}: frames {_span(job)} could not be sent to decode worker "
                f"{self.name} (pid {self.proc.pid}): {exc}"))

    def _read_answers(self) -> None:
        while True:
            try:
                message = self.sock.recv(MESSAGE_BYTES)
            except OSError:
                break
            if not message:
                break
            job_id, error = pickle.loads(message)
            with self.lock:
                pending = self.pending.pop(job_id, None)
            if pending is not None:
                self.owner.finish(pending, error)
        how = self.owner.how_it_ended(self)
        with self.lock:
            self.ended = how
            left, self.pending = list(self.pending.values()), OrderedDict()
        for k, pending in enumerate(left):
            self.owner.finish(pending, self.owner.died(self, pending.job, how, queued=k > 0))


class DecodeProcesses:
    """See the module docstring. `recipes[v]`: how to open video v's reader; `pin(v)`: a context holding video v on
    local disk while a child may open it (a node cache's lock; None for local files)."""

    def __init__(self, n: int, recipes: Sequence[ReaderRecipe], settings: ReaderSettings, max_open: int = 8,
                 pin: Optional[Callable[[int], ContextManager]] = None, name: str = "raystream-decode"):
        self.recipes, self.settings, self.name = list(recipes), settings, name
        self.resolution = int(settings.resolution)
        self.pin = pin
        self._router = Router(max(1, int(n)))
        self._closed = False
        self._lock = threading.Lock()
        self._held: Dict[int, _Segment] = {}  # job id -> its segment, until released
        self._free: Dict[int, List[_Segment]] = {}  # size class (frames) -> segments to reuse
        setup = {"settings": settings, "max_open": max(1, int(max_open)), "parent": os.getpid()}
        self._children: List[_Child] = []
        _LIVE.add(self)
        try:
            for i in range(self._router.n):
                self._children.append(_Child(self, i, setup))
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ the stream's side
    def submit(self, job: Job) -> Future:
        if self._closed:
            raise DataError("decode workers are closed")
        r = self.resolution
        pin = contextlib.ExitStack()
        if self.pin is not None:
            pin.enter_context(self.pin(job.video))
        size = -(-len(job.frames) // SIZE_CLASS) * SIZE_CLASS
        try:
            with self._lock:
                free = self._free.get(size)
                segment = free.pop() if free else None
            segment = segment or _Segment(size, 3 * r * r)
        except BaseException:
            pin.close()
            raise
        with self._lock:
            self._held[job.id] = segment
        future: Future = Future()
        message = pickle.dumps((job.id, self.recipes[job.video], job.video, list(job.frames)),
                               protocol=pickle.HIGHEST_PROTOCOL)
        self._children[self._router.route(job)].send(_Pending(job, future, segment, pin), message, segment.fd)
        return future

    def release(self, job_id: int) -> None:
        """The stream is done with job `job_id`'s frames (no view of them is read again): its segment serves the
        next job of its size class. Keeps at most KEEP_FREE segments per class (more are closed)."""
        with self._lock:
            segment = self._held.pop(job_id, None)
            if segment is None:
                return
            free = self._free.setdefault(segment.frames, [])
            if not self._closed and len(free) < KEEP_FREE:
                free.append(segment)
                return
        segment.close()

    def close(self) -> None:
        """End every child (the job in hand may finish within CLOSE_WAIT_S; then SIGKILL) and fail what was pending.
        Idempotent; safe from the exit handler."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        for c in self._children:
            with contextlib.suppress(OSError):
                c.sock.shutdown(socket.SHUT_WR)  # the child reads the end of its input
        deadline = time.monotonic() + CLOSE_WAIT_S
        for c in self._children:
            try:
                c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
        for c in self._children:
            c.thread.join(timeout=5.0)
            c.sock.close()
            with c.lock:
                left, c.pending = list(c.pending.values()), OrderedDict()
            for pending in left:
                self.finish(pending, self.died(c, pending.job, "closed", queued=True))
        with self._lock:
            segments = [s for free in self._free.values() for s in free] + list(self._held.values())
            self._free, self._held = {}, {}
        for segment in segments:
            segment.close()

    @property
    def pids(self) -> List[int]:
        return [c.proc.pid for c in self._children]

    # ------------------------------------------------------------------ the answer threads' side
    def finish(self, pending: _Pending, error: Optional[BaseException]) -> None:
        """Hand a job's frames (or its error) to its future."""
        pending.pin.close()
        if pending.future.done():
            return
        if error is not None:
            pending.future.set_exception(error)  # its segment goes at release or close
            return
        r = self.resolution
        pending.future.set_result(np.ndarray((len(pending.job.frames), 3, r, r), dtype=np.uint8,
                                             buffer=pending.segment.mapping))

    def how_it_ended(self, child: _Child) -> str:
        if self._closed:
            return "closed"
        try:
            rc = child.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return "closed its socket"
        if rc < 0:
            import signal  # lazy: only a death needs the name

            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-rc).name}"
            return f"killed by signal {-rc}"
        return f"exit code {rc}"

    def died(self, child: _Child, job: Job, how: str, queued: bool) -> DataError:
        path = self.recipes[job.video].path
        if how == "closed":
            return DataError(f"decode workers closed before frames {_span(job)} of {path} were decoded")
        what = "before it decoded" if queued else "while decoding"
        return DataError(f"{path}: decode worker {child.name} (pid {child.proc.pid}) died ({how}) {what} frames "
                         f"{_span(job)} of this video")


def _span(job: Job) -> str:
    return f"{job.frames[0]}..{job.frames[-1]}"


_LIVE: "weakref.WeakSet[DecodeProcesses]" = weakref.WeakSet()


@atexit.register
def _close_live() -> None:
    for workers in list(_LIVE):
        with contextlib.suppress(Exception):
            workers.close()
