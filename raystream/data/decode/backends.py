"""Decoders behind one small interface, so the rest of raystream.data never touches torchcodec, decord or PyAV.

    reader = open_reader(path, decoder="torchcodec" | "decord" | "pyav" | "auto", max_read_through=250,
                         size=None | (width, height), device="cpu" | "cuda")
    reader.num_frames, reader.fps, reader.height, reader.width     # height, width: of the frames `get` returns
    reader.get(indices)   # ascending source-frame indices -> uint8 array (n, H, W, 3), RGB
    reader.keyframes      # source-frame indices of the keyframes (where a segment can start without a seek back)
    reader.frame_times    # seconds from the first frame to each frame (decord: its index; PyAV: the packets)
    reader.close()

Frame i is the i-th frame in presentation order, whatever its timestamp (docs/videos.md), with every backend.
torchcodec's reader lives in torchcodec_reader.py (it also decodes on the GPU: `device="cuda"`); `auto` opens the
first installed of PREFERENCE (the probe, videos/probing.py, picks per file the first that reads it exactly).

With `size`, frames are scaled inside the decoder (libswscale, bilinear: decord's VideoReader width/height, PyAV's
`to_ndarray(width=, height=)`), so nobody resizes them in Python. Readers are created per decode worker (never
pickled or shared across threads or processes) with one decoding thread each; decord's calls release the GIL, so
several readers decode at once in threads (PyAV's overlap less). Both backends return identical frames on H.264 test
videos at full size. `get` reads forward sequentially from the reader's
position when the next index is close, and seeks only for backward jumps or large gaps, so callers that ask for
contiguous chunks in order decode every frame once. Decoder failures come out as DataError naming the file.
"""

from __future__ import annotations

import bisect
import os
import re
from collections import OrderedDict
from fractions import Fraction
from typing import List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from raystream.data.decode.frames import scaled_size
from raystream.data.decode.torchcodec_reader import TorchCodecReader, torchcodec_unavailable
from raystream.data.errors import DataError

# What data.decoder=auto tries, in this order, where installed: on the CPU the fastest exact decoder first (decord
# read 1080p H.264 at 155 frames per CPU-second against torchcodec's 97, docs/benchmarks.md), then torchcodec (which
# reads what decord gets wrong or cannot open: HEVC's open GOP, AV1), PyAV last; with data.decode_device=cuda
# torchcodec first, whose CUDA build decodes on the GPU (NVDEC).
PREFERENCE = ("decord", "torchcodec", "pyav")
CUDA_PREFERENCE = ("torchcodec", "decord", "pyav")
DECODERS = ("auto",) + PREFERENCE  # the values data.decoder takes


def open_reader(path: str, decoder: str = "auto", max_read_through: int = 250, decord_reset_frames: int = 1,
                size: Optional[Tuple[int, int]] = None, device: str = "cpu"):
    """A reader of `path` with `decoder` (one of DECODERS; `auto`: the first installed of PREFERENCE), returning
    frames scaled to `size` = (width, height) when given, decoded on `device` (torchcodec only: "cuda" = NVDEC);
    raises DataError naming the file when it cannot be opened, and naming the decoder when it is not installed."""
    readers = {"decord": lambda: DecordReader(path, reset_frames=decord_reset_frames, size=size),
               "torchcodec": lambda: TorchCodecReader(path, size=size, device=device),
               "pyav": lambda: PyAVReader(path, max_read_through=max_read_through, size=size)}
    assert tuple(readers) == PREFERENCE, "every decoder of PREFERENCE has a reader here"
    if decoder == "auto":
        decoder = first_installed(device)
    if decoder not in readers:
        raise DataError(f"data.decoder = {decoder!r}: expected one of {', '.join(DECODERS)}")
    missing = unavailable(decoder)
    if missing is not None:
        raise DataError(f"data.decoder = {decoder}: {missing}")
    return readers[decoder]()


def unavailable(decoder: str) -> Optional[str]:
    """Why `decoder` (one of PREFERENCE) cannot decode in this environment; None when it loads (asked once)."""
    if decoder not in _UNAVAILABLE:
        if decoder == "torchcodec":
            _UNAVAILABLE[decoder] = torchcodec_unavailable()
        else:
            try:
                __import__("av" if decoder == "pyav" else decoder)
                _UNAVAILABLE[decoder] = None
            except ImportError as exc:
                _UNAVAILABLE[decoder] = f"{decoder} is not installed here ({_first_line(exc)})"
    return _UNAVAILABLE[decoder]


_UNAVAILABLE: dict = {}  # decoder -> why it cannot load here, or None


def installed_decoders(device: str = "cpu") -> Tuple[str, ...]:
    """The decoders that load here, in auto's order for frames decoded on `device` (PREFERENCE, or CUDA_PREFERENCE
    for "cuda"); PyAV, a requirement, is everywhere."""
    return tuple(d for d in auto_order(device) if unavailable(d) is None)


def auto_order(device: str = "cpu") -> Tuple[str, ...]:
    """Every decoder in auto's order for frames decoded on `device`, installed or not."""
    return CUDA_PREFERENCE if device == "cuda" else PREFERENCE


def first_installed(device: str = "cpu") -> str:
    """The first decoder of auto's order that loads here, loading no decoder after it: importing torchcodec (and
    the FFmpeg libraries it tries) costs seconds in a fresh process that decord would serve."""
    return next(d for d in auto_order(device) if unavailable(d) is None)


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
                raise DataError(f"{self.path}: decord cannot open it as a video: {_first_line(exc)}") from None
            try:  # decord 0.6 rejects some output sizes (16, 24, 48 px wide: it takes the padded rows for RGBA)
                self._open(decord, None)
            except _decord_errors() as exc2:
                raise DataError(f"{self.path}: decord cannot open it as a video: {_first_line(exc2)}") from None
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
            raise DataError(f"{self.path}: decord has no frame timestamps: {_first_line(exc)}") from None
        return [float(t - starts[0]) for t in starts]

    def _reset(self) -> None:
        # decord's seek_accurate(k) returns at once when the reader already stands at k, so step back to frame 0
        # first (cheap: a demuxer seek, nothing decoded); the next get_batch then seeks to the keyframe, which
        # clears decord's decoder and its frame queue, and decodes from the keyframe on.
        try:
            self._vr.seek(0)
        except _decord_errors() as exc:
            raise DataError(f"{self.path}: decord failed to seek: {_first_line(exc)}") from None
        self._advanced = 0
        self.resets += 1

    def _get(self, indices: List[int]) -> np.ndarray:
        try:
            out = self._vr.get_batch(indices).asnumpy()
        except _decord_errors() as exc:
            raise DataError(f"{self.path}: decord failed to decode frames {_span(indices)}: {_first_line(exc)}") from None
        self._advanced += max(0, indices[-1] - self._last)
        self._last = indices[-1]
        if self._resize is not None:
            out = np.stack([np.asarray(Image.fromarray(f).resize(self._resize, Image.Resampling.BILINEAR))
                            for f in out])
        return out

    def close(self) -> None:
        self._vr = None


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
            raise DataError(f"{self.path}: PyAV cannot open it as a video: {_first_line(exc)}") from None
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
                raise DataError(f"{self.path}: PyAV cannot demux it: {_first_line(exc)}") from None
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
            raise DataError(f"{self.path}: PyAV failed to decode frames {_span(indices)}: {_first_line(exc)}") from None
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


def _first_line(exc: BaseException) -> str:
    """The exception's first line, without the `[hh:mm:ss] /source/file.cc:123: ` that decord puts before it."""
    text = str(exc).strip().splitlines()
    return re.sub(r"^\[\d\d:\d\d:\d\d\] \S+:\d+: ", "", text[0]) if text else type(exc).__name__


def _span(indices: Sequence[int]) -> str:
    return f"[{indices[0]}..{indices[-1]}]" if indices else "[]"


def open_scaled_reader(info, resolution: int, decoder: str, max_read_through: int = 250,
                       decord_reset_frames: int = 1, device: str = "cpu"):
    """A reader of `info.path` whose frames come out of the decoder with their short side at `resolution` (ready
    for frames.crop_square), decoded by the decoder the probe chose for it (`info.decoder(decoder)`), on `device`
    where that is torchcodec.

    `info`: a checked video (videos/listing.py's VideoInfo: path, width, height, decoder(configured))."""
    size = scaled_size(info.width, info.height, resolution)
    chosen = info.decoder(decoder)
    if chosen == "auto":
        chosen = first_installed(device)
    return open_reader(info.path, chosen, max_read_through, decord_reset_frames,
                       size=None if size == (info.width, info.height) else size,
                       device=device if chosen == "torchcodec" else "cpu")
