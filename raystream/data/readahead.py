"""One chunk of read-ahead for loading video frames, so the next frames are decoded and resized while the stream
assembles the current batch.

    frames = ReadAhead(load, num_frames, close=reader.close)   # load(ascending indices) -> array (n, ...)
    frames.get(indices); frames.close()

After each forward `get(indices)` whose indices are evenly spaced, the next chunk (as many frames, same spacing,
right after the last frame loaded) is loaded in a background thread. A `get` takes what it asks for from the frames
loaded ahead and loads only the rest; frames loaded ahead and not yet asked for are kept until a `get` passes them,
so a differently sized next request never makes the reader seek back. Only sequential orders use it (their next
read is predictable); memory is at most two chunks of frames. Readers are not thread-safe, so every `load` (and the
final `close`) runs on the one read-ahead thread, one at a time. A speculative load that fails is dropped: only a
`get` that needs the frames raises (DataError naming the file, from the reader).
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np


class _ReaderThread:
    """One daemon thread that runs submitted calls in order. Not a ThreadPoolExecutor: its threads are joined at
    interpreter exit, so a decode stuck in a corrupt file would hang the process after the stream gave up on it."""

    def __init__(self):
        self._calls: "queue.Queue" = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True, name="raystream-readahead")
        self.thread.start()

    def submit(self, fn: Callable, *args) -> Future:
        future: Future = Future()
        self._calls.put((future, fn, args))
        return future

    def stop(self) -> None:
        self._calls.put(None)

    def _run(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                return
            future, fn, args = call
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)


class ReadAhead:
    """`load` with one chunk of background read-ahead; see the module docstring."""

    def __init__(self, load: Callable[[List[int]], np.ndarray], num_frames: int,
                 close: Optional[Callable[[], None]] = None):
        self.load, self.num_frames, self._close = load, int(num_frames), close
        self._pool = _ReaderThread()
        self._ahead: Optional[Future] = None
        self._ahead_indices: List[int] = []
        self._held: Dict[int, np.ndarray] = {}  # frames read ahead and not yet asked for
        self.hits = self.misses = 0  # frames taken from read-ahead / read on demand (tests, benchmarks)

    def get(self, indices: Sequence[int]) -> np.ndarray:
        indices = [int(i) for i in indices]
        if not indices:
            raise ValueError("ReadAhead.get needs at least one frame index")
        self._collect()
        missing = [i for i in indices if i not in self._held]
        if missing:
            for i, frame in zip(missing, self._pool.submit(self.load, missing).result()):
                self._held[i] = frame
        self.hits += len(indices) - len(missing)
        self.misses += len(missing)
        out = np.stack([self._held[i] for i in indices])
        for i in [i for i in self._held if i <= indices[-1]]:  # the caller keeps what it asked for
            del self._held[i]
        self._schedule_after(indices)
        return out

    def _collect(self) -> None:
        """Wait for the read-ahead in flight and keep its frames; a failed one is dropped."""
        future, indices = self._ahead, self._ahead_indices
        self._ahead, self._ahead_indices = None, []
        if future is None:
            return
        try:
            frames = future.result()
        except Exception:  # noqa: BLE001 - speculative: a get that needs these frames reads them and raises
            return
        self._held.update(zip(indices, frames))

    def _schedule_after(self, indices: List[int]) -> None:
        """Read the chunk after `indices` (same length and spacing), past the frames already held."""
        step = indices[1] - indices[0] if len(indices) > 1 else 1
        if step <= 0 or any(b - a != step for a, b in zip(indices, indices[1:])):
            return  # not an evenly spaced forward run: no guess
        if len(self._held) >= len(indices):
            return  # a chunk is held already: no further ahead
        start = max([indices[-1], *self._held]) + step
        nxt = [i for i in range(start, start + step * len(indices), step) if i < self.num_frames]
        if nxt:
            self._ahead, self._ahead_indices = self._pool.submit(self.load, nxt), nxt

    def close(self) -> None:
        """Run `close` (the reader's) once a load in flight has finished; never waits (a stuck decode must not hang
        close)."""
        self._ahead, self._ahead_indices, self._held = None, [], {}
        if self._close is not None:
            self._pool.submit(self._close)
        self._pool.stop()
