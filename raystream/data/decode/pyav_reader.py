"""PyAV's reader (FFmpeg through PyAV), behind backends.py's interface: the decoder that is everywhere (a
requirement), frame-exact on variable frame rates, the last that `auto` tries.
"""

from __future__ import annotations

import bisect
import os
from collections import OrderedDict
from fractions import Fraction
from typing import List, Optional, Sequence, Tuple

import numpy as np

from raystream.data.errors import DataError, first_line, span


class PyAVReader:
    """PyAV (FFmpeg) decoding with thread_count=1. Frame i is the i-th frame in presentation order, whatever its
    timestamp: indices come from the stream's packet timestamps, sorted (`frame_table`, one demuxing pass, no
    decoding), so a variable-frame-rate file is indexed as exactly as a constant-rate one. A stream whose packets
    carry no timestamps falls back to timestamp x frame rate."""

    def __init__(self, path: str, max_read_through: int = 250, size: Optional[Tuple[int, int]] = None):
        import av  # lazy: a decoder library loads with its first reader (the probe child imports only one)

        self.path = str(path)
        self.max_read_through = int(max_read_through)
        self._size = size
        try:
            self._container = av.open(self.path)
        except (av.FFmpegError, OSError, UnicodeDecodeError) as exc:
            raise DataError(f"{self.path}: PyAV cannot open it as a video: {first_line(exc)}") from None
        if not self._container.streams.video:
            self._container.close()
            raise DataError(f"{self.path}: has no video stream")
        self._stream = self._container.streams.video[0]
        self._stream.thread_type = "SLICE"
        self._stream.codec_context.thread_count = 1
        rate = self._stream.average_rate or self._stream.guessed_rate or Fraction(0)
        self.fps = float(rate)
        self._rate = Fraction(rate) if rate else None
        self._tb = self._stream.time_base
        self.height, self.width = int(self._stream.height), int(self._stream.width)
        if size is not None:
            self.width, self.height = int(size[0]), int(size[1])
        self._table: Optional[Tuple[List[int], List[int]]] = None  # (frame pts sorted, keyframe pts)
        # the container's count where it keeps one (a shorter table then means a truncated file), else the packets'
        self.num_frames = int(self._stream.frames) or len(self._frame_table()[0])
        self._start_pts = None
        self._iter = None
        self._pos = 0  # index of the next frame the decoder yields
        self._rewind()

    def _frame_table(self) -> Tuple[List[int], List[int]]:
        """(pts of every frame in presentation order, pts of the keyframes), from one pass over the packets of a
        second container (no decoding); empty lists when a packet has no timestamp."""
        import av  # lazy: as in __init__

        if self._table is None:
            self._table = _TABLES.get(_file_key(self.path))
        if self._table is None:
            pts, keys = [], []
            try:
                with av.open(self.path) as container:
                    for packet in container.demux(container.streams.video[0]):
                        if not packet.size:
                            continue
                        if packet.pts is None:
                            pts, keys = [], []
                            break
                        pts.append(packet.pts)
                        if packet.is_keyframe:
                            keys.append(packet.pts)
            except av.FFmpegError as exc:
                raise DataError(f"{self.path}: PyAV cannot demux it: {first_line(exc)}") from None
            self._table = (sorted(pts), sorted(keys))
            _remember_table(self.path, self._table)
        return self._table

    @property
    def frame_times(self) -> List[float]:
        """Seconds from the first frame to each frame, in presentation order (empty without packet timestamps)."""
        pts = self._frame_table()[0]
        return [float((p - pts[0]) * self._tb) for p in pts]

    def truncation(self) -> Optional[str]:
        """What the container states of its video that its packets lack (a truncated file), or None. A container
        that keeps a frame count (mp4, avi) must hold that many frames; one that keeps none (webm, mkv) must hold
        frames up to the video's stated duration, within two frame intervals and 50 ms."""
        times = self.frame_times
        if not times:
            return None
        claimed = int(self._stream.frames)
        if claimed:
            return None if len(times) >= claimed else \
                f"the container claims {claimed} frames, its packets hold {len(times)}"
        stated = self._stated_duration()
        gaps = sorted(b - a for a, b in zip(times, times[1:]))
        if stated is None or not gaps:
            return None
        gap = gaps[len(gaps) // 2]
        end = times[-1] + gap
        if stated - end > 2 * gap + 0.05:
            return f"the container says its video lasts {stated:.2f} s, its {len(times)} frames end at {end:.2f} s"
        return None

    def _stated_duration(self) -> Optional[float]:
        """Seconds the container says the video stream lasts: its duration, its DURATION tag (Matroska), or the
        file's duration when the video is its only stream; None when it says nothing."""
        if self._stream.duration:
            return float(self._stream.duration * self._tb)
        tag = self._stream.metadata.get("DURATION")
        if tag:
            try:
                h, m, sec = tag.split(":")
                return int(h) * 3600 + int(m) * 60 + float(sec)
            except ValueError:
                return None
        if len(self._container.streams) == 1 and self._container.duration:
            return self._container.duration / 1e6
        return None

    def _rewind(self) -> None:
        if self._start_pts is not None:  # something was decoded already: go back to the start
            self._container.seek(0, stream=self._stream)
        self._iter = self._container.decode(self._stream)
        self._pos = 0

    def _index_of(self, frame) -> int:
        """The frame's index from its timestamp; -1 when it has none (the caller counts frames instead)."""
        if frame.pts is None:
            return -1
        pts = self._frame_table()[0]
        if pts:
            i = bisect.bisect_left(pts, frame.pts)
            return i if i < len(pts) and pts[i] == frame.pts else -1
        if self._rate is None:
            return -1
        return int(round(float((frame.pts - self._start_pts) * self._tb * self._rate)))

    def _next(self):
        frame = next(self._iter)
        if self._start_pts is None:
            self._start_pts = frame.pts if frame.pts is not None else 0
        idx = self._index_of(frame)
        if idx >= 0:
            self._pos = idx
        self._pos += 1
        return frame

    def _seek_to(self, index: int) -> None:
        """Position the decoder at or before `index` (keyframe seek), then decode forward in `get`."""
        pts = self._frame_table()[0]
        if index == 0 or (not pts and (self._start_pts is None or self._rate is None)):
            self._rewind()
            return
        if pts:
            target = pts[min(index, len(pts) - 1)]
        else:
            target = self._start_pts + int(Fraction(index) / self._rate / self._tb)
        self._container.seek(target, stream=self._stream, backward=True, any_frame=False)
        self._iter = self._container.decode(self._stream)
        self._pos = -1  # unknown until the first frame is decoded

    def get(self, indices: Sequence[int]) -> np.ndarray:
        import av  # lazy: as in __init__

        indices = [int(i) for i in indices]
        out: List[np.ndarray] = []
        try:
            for target in indices:
                if target < self._pos or target - self._pos > self.max_read_through:
                    self._seek_to(target)
                rewound = False
                while True:
                    frame = self._next()
                    idx = self._pos - 1
                    if idx > target:  # the seek landed past the target: go back to the start of the stream
                        if rewound:  # read from the start and still past it: no frame has this index
                            raise DataError(f"{self.path}: PyAV finds no frame {target} (the frames' timestamps "
                                            f"skip it)")
                        self._rewind()
                        rewound = True
                        continue
                    if idx == target:
                        out.append(self._pixels(frame))
                        break
        except StopIteration:
            raise DataError(f"{self.path}: PyAV ran out of frames before frame {target} "
                            f"(container claims {self.num_frames})") from None
        except av.FFmpegError as exc:
            raise DataError(f"{self.path}: PyAV failed to decode frames {span(indices)}: {first_line(exc)}") from None
        if not out:
            return np.zeros((0, self.height, self.width, 3), dtype=np.uint8)
        return np.stack(out)

    def _pixels(self, frame) -> np.ndarray:
        if self._size is None:
            return frame.to_ndarray(format="rgb24")
        return frame.to_ndarray(format="rgb24", width=self._size[0], height=self._size[1], interpolation="BILINEAR")

    @property
    def keyframes(self) -> List[int]:
        """Indices of the keyframes (where a decode can start), from the frame table."""
        pts, keys = self._frame_table()
        if not pts:
            return [0]
        return sorted({bisect.bisect_left(pts, k) for k in keys} | {0})

    def close(self) -> None:
        if self._container is not None:
            self._container.close()
            self._container = None


# Frame tables of the files this process read lately (one demuxing pass costs ~45 us a packet here: 5 s for an
# hour at 30 fps), shared by the readers of one file (decode workers, reopened readers); keyed by path, size, mtime.
_TABLES: "OrderedDict[tuple, Tuple[List[int], List[int]]]" = OrderedDict()
_TABLES_KEPT = 64


def _file_key(path: str) -> tuple:
    try:
        st = os.stat(path)
    except OSError:
        return (path,)
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns)


def _remember_table(path: str, table: Tuple[List[int], List[int]]) -> None:
    _TABLES[_file_key(path)] = table
    while len(_TABLES) > _TABLES_KEPT:
        _TABLES.popitem(last=False)
