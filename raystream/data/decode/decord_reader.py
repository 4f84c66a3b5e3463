"""decord's reader: the fastest exact decoder on the CPU here (docs/benchmarks.md), behind backends.py's interface.

decord is imported with the first reader, so a process that never opens one never loads it. Frames it cannot scale
to the asked size inside the decoder are resized after decoding (PIL, bilinear).
"""

from __future__ import annotations

import bisect
from typing import List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from raystream.data.errors import DataError, first_line, span


def _decord_errors() -> tuple:
    from decord._ffi.base import DECORDError, DECORDLimitReachedError  # lazy: see DecordReader.__init__

    return (DECORDError, DECORDLimitReachedError, RuntimeError, IndexError, AssertionError)


class DecordReader:
    """decord.VideoReader with num_threads=1; `get` is one get_batch call (decord skips forward within a GOP).

    decord 0.6 fault: `VideoReader.next`/`get_batch` push a packet to decord's decoder thread before every pop, and
    a pop that finds the thread's frame queue momentarily empty returns without a frame and pushes another packet.
    Each such race leaves one more decoded RGB frame queued ahead of the reader for good, so its memory rises as it
    reads sequentially, to a level that varies from run to run (docs/benchmarks.md's stream benchmark measures it). Nothing
    but a seek empties that queue. So with `reset_frames` > 0, once the reader has moved that many frames forward,
    the next read that reaches a keyframe first reads up to the frame before it, then seeks to the keyframe (decord
    flushes its decoder there) and goes on from it: no frame is decoded twice, and what decord holds is bounded by
    the frames read between keyframes, not by the video's length.
    """

    def __init__(self, path: str, reset_frames: int = 1, size: Optional[Tuple[int, int]] = None):
        import decord  # lazy: a decoder library loads with its first reader (the probe child imports only one)

        self.path = str(path)
        self.reset_frames = int(reset_frames)
        self.resets = 0  # keyframe resets done (tests, benchmarks)
        self._resize: Optional[Tuple[int, int]] = None  # decord cannot scale to this size: PIL does (see _open)
        try:
            self._open(decord, size)
        except _decord_errors() as exc:
            if size is None:
                raise DataError(f"{self.path}: decord cannot open it as a video: {first_line(exc)}") from None
            try:  # decord 0.6 rejects some output sizes (16, 24, 48 px wide: it takes the padded rows for RGBA)
                self._open(decord, None)
            except _decord_errors() as exc2:
                raise DataError(f"{self.path}: decord cannot open it as a video: {first_line(exc2)}") from None
            if (self.width, self.height) != tuple(size):
                self._resize = (int(size[0]), int(size[1]))
                self.width, self.height = self._resize
        self._advanced = 0  # frames the reader moved forward since its last reset
        self._last = -1

    def get(self, indices: Sequence[int]) -> np.ndarray:
        indices = [int(i) for i in indices]
        if self.reset_frames and self._advanced >= self.reset_frames and indices and indices[0] > self._last:
            j = bisect.bisect_right(self._keys, self._last)
            if j < len(self._keys) and indices[-1] >= self._keys[j]:
                key = self._keys[j]  # read up to the keyframe, flush decord's queue there, go on from the keyframe
                head = [i for i in indices if i < key]
                first = self._get(head) if head else None
                self._reset()
                rest = self._get([i for i in indices if i >= key])
                return rest if first is None else np.concatenate([first, rest])
        return self._get(indices)

    def _open(self, decord, size: Optional[Tuple[int, int]]) -> None:
        width, height = size or (-1, -1)
        self._vr = decord.VideoReader(self.path, ctx=decord.cpu(0), num_threads=1, width=width, height=height)
        self.num_frames = len(self._vr)
        self.fps = float(self._vr.get_avg_fps())
        self._keys = [int(k) for k in self._vr.get_key_indices()] if self.num_frames > 0 else []
        if self.num_frames > 0:
            shape = self._vr.get_batch([0]).shape
            self._vr.seek(0)
            self.height, self.width = int(shape[1]), int(shape[2])
        else:
            self.height = self.width = 0

    @property
    def keyframes(self) -> List[int]:
        return self._keys or [0]

    @property
    def frame_times(self) -> List[float]:
        """Seconds from the first frame to each frame, as decord's index has them (what it seeks by)."""
        if self.num_frames <= 0:
            return []
        try:
            starts = self._vr.get_frame_timestamp(list(range(self.num_frames)))[:, 0]
        except _decord_errors() as exc:
            raise DataError(f"{self.path}: decord has no frame timestamps: {first_line(exc)}") from None
        return [float(t - starts[0]) for t in starts]

    def _reset(self) -> None:
        # decord's seek_accurate(k) returns at once when the reader already stands at k, so step back to frame 0
        # first (cheap: a demuxer seek, nothing decoded); the next get_batch then seeks to the keyframe, which
        # clears decord's decoder and its frame queue, and decodes from the keyframe on.
        try:
            self._vr.seek(0)
        except _decord_errors() as exc:
            raise DataError(f"{self.path}: decord failed to seek: {first_line(exc)}") from None
        self._advanced = 0
        self.resets += 1

    def _get(self, indices: List[int]) -> np.ndarray:
        try:
            out = self._vr.get_batch(indices).asnumpy()
        except _decord_errors() as exc:
            raise DataError(f"{self.path}: decord failed to decode frames {span(indices)}: {first_line(exc)}") from None
        self._advanced += max(0, indices[-1] - self._last)
        self._last = indices[-1]
        if self._resize is not None:
            out = np.stack([np.asarray(Image.fromarray(f).resize(self._resize, Image.Resampling.BILINEAR))
                            for f in out])
        return out

    def close(self) -> None:
        self._vr = None
