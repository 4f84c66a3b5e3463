"""Videos of an object store fetched into the node cache ahead of a stream, in the order its steps need them.

    fetcher = VideoPrefetcher(cache, sources, first_uses, ahead=data.prefetch_videos, start_step=t0)
    fetcher.reached(t, videos)          # the stream is at step t, which reads `videos`
    with fetcher.local(v) as path: ...  # video v on this node's disk (fetched now if the thread has not yet)
    fetcher.close()

One thread walks `first_uses` ((step, video) in the order the stream first reads each video) and fetches each
video; it runs at most `ahead` videos beyond those the current step reads, so the disk holds what the next steps
need and not the whole dataset. It also tells the cache which videos to keep (the current step's and those fetched
ahead) and which the stream has passed (evicted first under `data.cache_limit_gb`). A video without a source (a
local file) is opened where it is. A failed prefetch is not an error by itself: `local` fetches again and raises
the DataError naming the object.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from raystream.data.errors import DataError
from raystream.data.videos.cache import NodeCache
from raystream.data.videos.remote import RemoteObject


class VideoPrefetcher:
    """See the module docstring."""

    def __init__(self, cache: Optional[NodeCache], sources: Sequence[Optional[RemoteObject]],
                 first_uses: Iterator[Tuple[int, int]], ahead: int, start_step: int, paths: Sequence[str]):
        self.cache = cache
        self.sources = list(sources)
        self.paths = list(paths)
        self.ahead = max(0, int(ahead))
        self._cond = threading.Condition()
        self._step = int(start_step)
        self._now: Set[int] = set()
        self._fetched: Dict[int, int] = {}  # video -> the step that first reads it (fetched by the thread)
        self._used: Set[int] = set()
        self._passed: List[int] = []  # videos the stream has finished with, in the order it left them
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if cache is not None and any(s is not None for s in self.sources):
            self._thread = threading.Thread(target=self._run, args=(first_uses,), daemon=True,
                                            name="raystream-prefetch")
            self._thread.start()

    # ------------------------------------------------------------------ the stream's side
    def reached(self, step: int, videos: Iterable[int]) -> None:
        with self._cond:
            now = set(videos)
            for v in sorted(self._now - now):
                if v not in self._passed:
                    self._passed.append(v)
            self._passed = [v for v in self._passed if v not in now]
            self._step, self._now = int(step), now
            self._used |= now
            self._cond.notify_all()

    @contextlib.contextmanager
    def local(self, v: int) -> Iterator[str]:
        """Video `v` as a local file for the duration of the block (open it inside)."""
        source = self.sources[v]
        if source is None or self.cache is None:
            yield self.paths[v]
            return
        keep, passed = self._keep_and_passed()
        with self.cache.opened(source, keep, passed) as path:
            yield path

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    # ------------------------------------------------------------------ the thread
    def _keep_and_passed(self) -> Tuple[List[str], List[str]]:
        with self._cond:
            keep = self._now | {v for v, s in self._fetched.items() if s > self._step or v not in self._used}
            return ([self.paths[v] for v in keep],
                    [self.paths[v] for v in self._passed if v not in keep])

    def _ahead_count(self) -> int:
        return sum(1 for v, s in self._fetched.items() if s > self._step and v not in self._used)

    def _run(self, first_uses: Iterator[Tuple[int, int]]) -> None:
        for step, v in first_uses:
            with self._cond:
                while step > self._step and self._ahead_count() >= self.ahead and not self._stop.is_set():
                    self._cond.wait(timeout=0.5)
            if self._stop.is_set():
                return
            source = self.sources[v]
            if source is None:
                continue
            keep, passed = self._keep_and_passed()
            try:
                self.cache.fetch(source, keep + [self.paths[v]], passed)
            except DataError:
                continue  # `local` tries again and names the object
            with self._cond:
                self._fetched[v] = step
