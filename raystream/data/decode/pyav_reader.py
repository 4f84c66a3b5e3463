"""PyAV's reader (FFmpeg through PyAV), behind backends.py's interface: the decoder that is everywhere (a
requirement), frame-exact on variable frame rates, the last that `auto` tries.

Frame i is the i-th frame in presentation order. Two kinds of MPEG-4 Part 2 file (DivX, Xvid) break the plain
"decode and match each frame's timestamp to the packets'" that serves every other file (measured on files
tests/data/rs_codecs.py writes, FFmpeg 8 through PyAV 18):
- a decoder that returns frames in decode order (an MPEG-4 stream with B-frames whose header says low delay): each
  frame carries its own presentation timestamp, so frames are put back in timestamp order (`_pull` holds the few
  that come early, up to REORDER_WINDOW);
- "packed B-frames" in AVI (a B-frame sent in the chunk of the P-frame before it, an empty N-VOP chunk in its
  place): AVI keeps no presentation times, FFmpeg guesses them from the chunks and the decoder returns the frames
  in presentation order stamped 1, 3, 2, 5, 4, ... So in such a stream (`packed`) a frame's index is its place in
  the decoder's output, counted from a keyframe (whose stamp is right), and each later keyframe checks the count.
"""

from __future__ import annotations

import bisect
import os
from collections import OrderedDict
from fractions import Fraction
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from raystream.data.errors import DataError, first_line, span

REORDER_WINDOW = 16  # frames a decoder may return ahead of an earlier one (MPEG-4's B-frames: 1-3)
_VOP = b"\x00\x00\x01\xb6"  # MPEG-4 Part 2's start code of a video object plane (a coded frame)


class _Table(NamedTuple):
    """What one demuxing pass finds (PyAVReader._frame_table)."""

    pts: List[int]  # every frame's, in presentation order
    keys: List[int]  # the keyframes'
    packed: bool  # MPEG-4 Part 2 with packed B-frames
    first_reordered: Optional[int]  # the index of the first frame decoded after one shown after it


class PyAVReader:
    """PyAV (FFmpeg) decoding with thread_count=1. Frame i is the i-th frame in presentation order, whatever its
    timestamp: indices come from the stream's packet timestamps, sorted (`frame_table`, one demuxing pass, no
    decoding), so a variable-frame-rate file is indexed as exactly as a constant-rate one; frames the decoder
    returns out of timestamp order are reordered, and packed B-frames are counted (module docstring). A stream
    whose packets carry no timestamps falls back to timestamp x frame rate."""

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
        self._table: Optional[_Table] = None
        # the container's count where it keeps one (a shorter table then means a truncated file), else the packets'
        self.num_frames = int(self._stream.frames) or len(self._frame_table()[0])
        self._start_pts = None
        self._iter = None
        self._pos = 0  # one past the highest index the decoder has returned since the last seek
        self._held: dict = {}  # index -> frame: returned by the decoder ahead of an earlier frame, not yet asked for
        self._taken: set = set()  # indices (>= _pos - REORDER_WINDOW) returned since the last seek and passed on
        self._count: Optional[int] = None  # packed B-frames: the index of the next frame out of the decoder
        self._rewind()

    def _frame_table(self) -> "_Table":
        """(pts of every frame in presentation order, pts of the keyframes, ...), from one pass over the packets of a
        second container (no decoding); empty lists when a packet has no timestamp."""
        import av  # lazy: as in __init__

        if self._table is None:
            self._table = _TABLES.get(_file_key(self.path))
        if self._table is None:
            pts, keys, packed = [], [], None  # packed: the timestamp of the first packet of two frames
            mpeg4 = self._stream.codec_context.name == "mpeg4"
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
                        if mpeg4 and not packed and bytes(packet).count(_VOP) > 1:  # two frames in one packet
                            packed = packet.pts
            except av.FFmpegError as exc:
                raise DataError(f"{self.path}: PyAV cannot demux it: {first_line(exc)}") from None
            shown = sorted(pts)
            latest, first = None, None  # the latest timestamp decoded so far; the first frame shown before it
            for p in pts if packed is None else ():
                if latest is not None and p < latest:
                    first = bisect.bisect_left(shown, p)
                    break
                latest = p
            if packed is not None and shown:  # its B-frames are hidden in the packets of two frames
                first = bisect.bisect_left(shown, packed)
            self._table = _Table(shown, sorted(keys), packed is not None, first)
            _remember_table(self.path, self._table)
        return self._table

    @property
    def packed(self) -> bool:
        """Whether the stream holds packed B-frames (MPEG-4 Part 2: two frames in one packet; module docstring)."""
        return self._frame_table().packed

    @property
    def first_reordered(self) -> Optional[int]:
        """The index of the first frame decoded after a frame it is shown before (the first B-frame's, from the
        packets' order and timestamps; with packed B-frames, the first packet of two frames); None where decode
        order is presentation order."""
        return self._frame_table().first_reordered

    @property
    def frame_times(self) -> List[float]:
        """Seconds from the first frame to each frame, in presentation order (empty without packet timestamps)."""
        pts = self._frame_table().pts
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
        self._restart(0)
        self._from_start = True

    def _restart(self, pos: int) -> None:
        """The decoder starts again (from the stream's start: `pos` 0; after a keyframe seek: -1, unknown)."""
        self._pos = pos
        self._held.clear()
        self._taken.clear()
        self._count = pos if pos >= 0 else None

    def _index_of(self, frame) -> int:
        """The frame's index; -1 when unknown (no timestamp: the caller counts frames instead; or a frame of packed
        B-frames decoded before the keyframe a seek went to, which is skipped)."""
        pts = self._frame_table().pts
        if self.packed and pts:
            if self._count is None:  # after a seek: counting starts at the first keyframe out of the decoder
                if not frame.key_frame or frame.pts is None:
                    return -1
                self._count = bisect.bisect_left(pts, frame.pts)
            elif frame.key_frame and frame.pts is not None and bisect.bisect_left(pts, frame.pts) != self._count:
                raise DataError(f"{self.path}: PyAV's decoder returns keyframe {bisect.bisect_left(pts, frame.pts)} "
                                f"as frame {self._count} (packed B-frames whose frames it does not all return)")
            self._count += 1
            return self._count - 1
        if frame.pts is None:
            return -1
        if pts:
            i = bisect.bisect_left(pts, frame.pts)
            return i if i < len(pts) and pts[i] == frame.pts else -1
        if self._rate is None:
            return -1
        return int(round(float((frame.pts - self._start_pts) * self._tb * self._rate)))

    def _next(self):
        """(index, frame) of the next frame out of the decoder; index -1 for a frame to skip."""
        frame = next(self._iter)
        if self._start_pts is None:
            self._start_pts = frame.pts if frame.pts is not None else 0
        idx = self._index_of(frame)
        if idx < 0 and not self.packed and self._pos >= 0:
            idx = self._pos  # no timestamp, or one the packets lack: the frame after the last one
        if idx >= 0:
            self._pos = max(self._pos, idx + 1)
        return idx, frame

    def _seek_to(self, index: int) -> None:
        """Position the decoder at or before `index` (keyframe seek), then decode forward in `get`."""
        pts = self._frame_table().pts
        if index == 0 or (not pts and (self._start_pts is None or self._rate is None)):
            self._rewind()
            return
        if pts:
            target = pts[min(index, len(pts) - 1)]
        else:
            target = self._start_pts + int(Fraction(index) / self._rate / self._tb)
        self._container.seek(target, stream=self._stream, backward=True, any_frame=False)
        self._iter = self._container.decode(self._stream)
        self._restart(-1)  # unknown until the first frame is decoded
        self._from_start = False

    def _must_seek(self, target: int) -> bool:
        """Whether frame `target` is behind the decoder (returned already, or further back than a decoder returns
        a frame late) or too far ahead to read through to."""
        if target in self._held:
            return False
        if self._pos < 0:
            return False
        if target < self._pos:
            return target in self._taken or target < self._pos - REORDER_WINDOW
        return target - self._pos > self.max_read_through

    def _pull(self, target: int):
        """Frame `target`, decoding forward: a frame the decoder returns ahead of it is held (in timestamp order
        it comes later), one behind it is dropped; None when `target` cannot come any more (REORDER_WINDOW frames
        past it, or the end of the stream)."""
        frame = self._held.pop(target, None)
        if frame is not None:
            return frame
        while True:
            try:
                idx, frame = self._next()
            except StopIteration:
                return None
            if idx < 0:
                continue
            self._taken.add(idx)
            if idx == target:
                break
            if idx > target:
                self._held[idx] = frame
                if idx - target >= REORDER_WINDOW or len(self._held) > REORDER_WINDOW:
                    return None
        floor = self._pos - 2 * REORDER_WINDOW
        for i in [i for i in self._held if i < target]:
            del self._held[i]
        if len(self._taken) > 4 * REORDER_WINDOW:
            self._taken = {i for i in self._taken if i >= floor}
        return frame

    def get(self, indices: Sequence[int]) -> np.ndarray:
        import av  # lazy: as in __init__

        indices = [int(i) for i in indices]
        out: List[np.ndarray] = []
        target = indices[0] if indices else 0
        try:
            for target in indices:
                if self._must_seek(target):
                    self._seek_to(target)
                frame = self._pull(target)
                if frame is None and not self._from_start:
                    self._rewind()  # the seek landed past the target: read it from the start of the stream
                    frame = self._pull(target)
                if frame is None:
                    if self._pos > target:
                        raise DataError(f"{self.path}: PyAV finds no frame {target} (the frames' timestamps "
                                        f"skip it)")
                    raise StopIteration
                out.append(self._pixels(frame))
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
        pts, keys = self._frame_table()[:2]
        if not pts:
            return [0]
        return sorted({bisect.bisect_left(pts, k) for k in keys} | {0})

    def close(self) -> None:
        if self._container is not None:
            self._container.close()
            self._container = None


# Frame tables of the files this process read lately (one demuxing pass costs ~45 us a packet here: 5 s for an
# hour at 30 fps), shared by the readers of one file (decode workers, reopened readers); keyed by path, size, mtime.
_TABLES: "OrderedDict[tuple, _Table]" = OrderedDict()
_TABLES_KEPT = 64


def _file_key(path: str) -> tuple:
    try:
        st = os.stat(path)
    except OSError:
        return (path,)
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns)


def _remember_table(path: str, table: "_Table") -> None:
    _TABLES[_file_key(path)] = table
    while len(_TABLES) > _TABLES_KEPT:
        _TABLES.popitem(last=False)
