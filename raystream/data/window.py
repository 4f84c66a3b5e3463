"""A sliding window of decoded, resized frames of one video, so overlapping clips never decode a frame twice.

The stream asks for the frames of its next clips in ascending order; the window keeps the frames it decoded in
[lo, hi) (only multiples of the clip lattice: frames no clip can use are never stored), reads forward from `hi`
when the next frame is near and restarts at the frame when it is behind or far ahead, and forgets frames below
what the stream will still need (`release_below`). Memory is bounded by the clips' span, not the video's length.
With `read_ahead` (sequential orders), the next chunk is decoded and resized in a background thread
(raystream.data.readahead) while the stream assembles the current batch.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from raystream.data.readahead import ReadAhead

_RAW_CHUNK_BYTES = 16 << 20  # decode at most ~16 MiB of full-size RGB frames per reader call


def square_resize(frames: np.ndarray, resolution: int) -> np.ndarray:
    """uint8 (n, H, W, 3) -> uint8 (n, 3, r, r): center crop to a square, then an antialiased bilinear resize.

    Pillow and numpy only, single-threaded on purpose: the decode thread must not compete with the training
    step for torch's intra-op thread pool (on a busy machine a torch.stack there was 60x slower).
    """
    from PIL import Image

    n, h, w = frames.shape[:3]
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    out = np.empty((n, 3, resolution, resolution), dtype=np.uint8)
    for i in range(n):
        square = frames[i, top:top + side, left:left + side]
        if side != resolution:
            square = np.asarray(Image.fromarray(np.ascontiguousarray(square)).resize(
                (resolution, resolution), Image.Resampling.BILINEAR))
        out[i] = square.transpose(2, 0, 1)
    return out


class FrameWindow:
    """Frames of one reader kept between `lo` and `hi`; see the module docstring."""

    def __init__(self, reader, resolution: int, lattice: int = 1, dense: bool = True, max_read_through: int = 250,
                 read_ahead: bool = False):
        self.reader = reader
        self.resolution = int(resolution)
        self.lattice = max(1, int(lattice))
        self.dense = dense  # keep every lattice frame between needed ones (sequential orders) or only those asked
        self.max_read_through = int(max_read_through)
        self.frames: Dict[int, np.ndarray] = {}
        self.lo = self.hi = 0
        self.decoded = 0  # frames this window converted and stored (benchmarks, tests)
        h, w = max(1, reader.height), max(1, reader.width)
        self._chunk = max(1, min(256, _RAW_CHUNK_BYTES // (h * w * 3)))
        # dense windows read forward, so the next chunk can be decoded and resized in the background meanwhile
        self._frames = ReadAhead(self._load, reader.num_frames, close=reader.close) if read_ahead else None

    def _load(self, indices: List[int]) -> np.ndarray:
        """Frames `indices` decoded and resized: uint8 (n, 3, r, r)."""
        return square_resize(self.reader.get(indices), self.resolution)

    def fetch(self, needed: Sequence[int]) -> Dict[int, np.ndarray]:
        """frame index -> uint8 array (3, r, r) for each of `needed` (any order, all multiples of the lattice)."""
        needed = sorted(set(int(f) for f in needed))
        out: Dict[int, np.ndarray] = {}
        i = 0
        while i < len(needed):
            f = needed[i]
            if f in self.frames:
                out[f] = self.frames[f]
                i += 1
                continue
            # a run of needed frames, each within max_read_through of the previous, read in one forward pass
            j = i
            while j + 1 < len(needed) and needed[j + 1] - needed[j] <= self.max_read_through:
                j += 1
            if not (self.hi <= f <= self.hi + self.max_read_through) or f < self.lo:
                self.frames.clear()  # behind the window or far ahead: restart it at f
                self.lo = self.hi = f
            self._read(self._indices(f, needed[i:j + 1]))
            for g in needed[i:j + 1]:
                out[g] = self.frames[g]
            i = j + 1
        return out

    def _indices(self, first: int, run: List[int]) -> List[int]:
        if not self.dense:
            return [g for g in run if g not in self.frames]
        start = -(-max(self.hi, first) // self.lattice) * self.lattice
        return list(range(start, run[-1] + 1, self.lattice))

    def _read(self, indices: List[int]) -> None:
        for k in range(0, len(indices), self._chunk):
            part = indices[k:k + self._chunk]
            pixels = self._frames.get(part) if self._frames is not None else self._load(part)
            for idx, frame in zip(part, pixels):
                self.frames[idx] = frame
            self.decoded += len(part)
            self.hi = max(self.hi, part[-1] + 1)

    def release_below(self, frame: int) -> None:
        """Forget frames below `frame`: the stream needs none of them any more."""
        for f in [f for f in self.frames if f < frame]:
            del self.frames[f]
        self.lo = min(max(self.lo, frame), self.hi)

    def close(self) -> None:
        self.frames.clear()
        if self._frames is not None:
            self._frames.close()  # closes the reader after a load in flight
        else:
            self.reader.close()
