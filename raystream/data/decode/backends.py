"""Decoders behind one small interface, so the rest of raystream.data never touches torchcodec, decord or PyAV.

    reader = open_reader(path, decoder="torchcodec" | "decord" | "pyav" | "auto", max_read_through=250,
                         size=None | (width, height), device="cpu" | "cuda")
    reader.num_frames, reader.fps, reader.height, reader.width     # height, width: of the frames `get` returns
    reader.get(indices)   # ascending source-frame indices -> uint8 array (n, H, W, 3), RGB
    reader.keyframes      # source-frame indices of the keyframes (where a segment can start without a seek back)
    reader.frame_times    # seconds from the first frame to each frame (decord: its index; PyAV: the packets)
    reader.close()

Frame i is the i-th frame in presentation order, whatever its timestamp (docs/videos.md), with every backend.
Each decoder's reader is a module of its own (decord_reader, torchcodec_reader, which also decodes on the GPU with
`device="cuda"`, pyav_reader); `auto` opens the
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

from typing import Optional, Tuple

from raystream.data.decode.decord_reader import DecordReader
from raystream.data.decode.frames import scaled_size
from raystream.data.decode.pyav_reader import PyAVReader
from raystream.data.decode.torchcodec_reader import TorchCodecReader, torchcodec_unavailable
from raystream.data.errors import DataError, first_line

__all__ = ["DECODERS", "PREFERENCE", "CUDA_PREFERENCE", "DecordReader", "PyAVReader", "TorchCodecReader",
           "open_reader", "open_scaled_reader", "unavailable", "installed_decoders", "auto_order", "first_installed"]

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
                _UNAVAILABLE[decoder] = f"{decoder} is not installed here ({first_line(exc)})"
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
