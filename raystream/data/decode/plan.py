"""Which frames each decode job reads, and which job every frame of every step's batch comes from. No decoding.

A video is cut into segments: from each keyframe to the next, in pieces of at most `max_frames` frames. Walking the
order step by step, the plan gathers the frames each step needs into one job per (video, segment), which stays open
while later steps keep adding frames to it:
- sequential orders close a job once the video's earliest needed frame has passed the segment's end (or the video
  left this worker's places): every frame is decoded once per pass, and a job holds at most one segment;
- the shuffled order closes a job `horizon` steps after it opened: the clips drawn from one segment within that
  many batches are decoded in one pass over it, instead of one seek-and-decode from the keyframe per clip.
A closed job knows the last step that uses it, so its frames are dropped right after that step's batch is made.
Jobs are independent (each starts at or after a keyframe), so decode workers can run them in any order and at once;
the batches never depend on how they ran.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, Iterable, List, Optional, Sequence, Tuple


class Segments:
    """The segments of one video: keyframe intervals, split into pieces of at most `max_frames` frames."""

    def __init__(self, keyframes: Sequence[int], num_frames: int, max_frames: int):
        keys = sorted({int(k) for k in keyframes if 0 < int(k) < num_frames})
        gop_starts = [0] + keys
        self.starts: List[int] = []
        self.gop: List[int] = []
        self.piece: List[int] = []
        for g, (a, b) in enumerate(zip(gop_starts, gop_starts[1:] + [int(num_frames)])):
            for p, s in enumerate(range(a, b, max(1, int(max_frames)))):
                self.starts.append(s)
                self.gop.append(g)
                self.piece.append(p)
        self.ends = self.starts[1:] + [int(num_frames)]

    def of(self, frame: int) -> int:
        return bisect.bisect_right(self.starts, int(frame)) - 1


@dataclass(eq=False)
class Job:
    """Decode `frames` (ascending, all in one segment) of video `video`; used by steps `first`..`last`."""

    id: int
    video: int
    segment: int
    gop: int
    piece: int
    first: int
    last: int
    frames: List[int] = field(default_factory=list)
    closed: bool = False


class Plan:
    """Walks steps from `start`; `jobs_at(step)` and `next_closed()` drive the decoding (see the module docstring).

    `needs(step)` -> {video: frames that step needs}; `segments(video)` -> its Segments.
    """

    def __init__(self, needs: Callable[[int], Dict[int, Iterable[int]]], num_steps: int, start: int,
                 segments: Callable[[int], Segments], sequential: bool, horizon: int):
        self.needs, self.num_steps, self.segments = needs, int(num_steps), segments
        self.sequential, self.horizon = bool(sequential), max(1, int(horizon))
        self.walked = int(start)  # the next step to walk
        self._open: Dict[Tuple[int, int], Job] = {}
        self._ready: Deque[Job] = deque()  # closed, not yet taken by next_closed
        self._uses: Dict[int, Dict[Tuple[int, int], Job]] = {}  # step -> (video, frame) -> job
        self._ids = 0

    def uses(self, step: int) -> Dict[Tuple[int, int], Job]:
        """(video, frame) -> the job that decodes it, for every frame `step` needs (walks up to `step`)."""
        while self.walked <= step:
            self._walk()
        return self._uses[step]

    def forget(self, step: int) -> None:
        self._uses.pop(step, None)

    def next_closed(self) -> Optional[Job]:
        """The next job to close, walking on as far as that takes; None once every job was handed out."""
        while not self._ready and (self.walked < self.num_steps or self._open):
            self._walk()
        return self._ready.popleft() if self._ready else None

    def _walk(self) -> None:
        s = self.walked
        if s >= self.num_steps:  # past the end: whatever is open is complete
            self._close(sorted(self._open.values(), key=lambda j: j.id))
            return
        self.walked += 1
        need = {v: sorted(set(int(f) for f in frames)) for v, frames in self.needs(s).items()}
        uses: Dict[Tuple[int, int], Job] = {}
        for v, frames in need.items():
            seg = self.segments(v)
            for f in frames:
                k = seg.of(f)
                job = self._open.get((v, k))
                if job is None:
                    job = Job(self._ids, v, k, seg.gop[k], seg.piece[k], first=s, last=s)
                    self._ids += 1
                    self._open[(v, k)] = job
                if not job.frames or job.frames[-1] != f:
                    if job.frames and f < job.frames[-1]:
                        job.frames = sorted(set(job.frames) | {f})
                    else:
                        job.frames.append(f)
                job.last = s
                uses[(v, f)] = job
        self._uses[s] = uses
        done = []
        for (v, k), job in self._open.items():
            if self.sequential:
                seg, frames = self.segments(v), need.get(v)
                if not frames or frames[0] >= seg.ends[k] or frames[-1] < seg.starts[k]:
                    done.append(job)
            elif s - job.first + 1 >= self.horizon:
                done.append(job)
        if s + 1 >= self.num_steps:
            done = list(self._open.values())
        self._close(sorted(done, key=lambda j: j.id))

    def _close(self, jobs: List[Job]) -> None:
        for job in jobs:
            job.closed = True
            del self._open[(job.video, job.segment)]
            self._ready.append(job)
