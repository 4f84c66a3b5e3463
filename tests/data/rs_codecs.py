"""Helpers of tests/data/decode/test_codecs.py, test_reordered.py and test_mpeg2.py (imported by name): the codecs
and containers of the paper's datasets and of cameras (MPEG-2 in program and transport streams), written by PyAV
with frames that carry their own index (rs_data_helpers.block_frame, 64x64: 16 px cells that survive lossy coding).

Each CODECS entry: (name, file name, encoder, pix_fmt, encoder options, presentation times in ms or None for a
constant 30 fps). One video id per entry, so a frame of the wrong video reads back as such.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Dict, List, Optional

import av
import numpy as np

from rs_data_helpers import block_frame

FRAMES = 48
SIDE = 64
# pts 0, 40, 73, 106, 156, ... ms: three frame durations (40, 33, 50 ms), as a phone camera writes them
VFR_MS = [sum((40, 33, 33, 50)[i % 4] for i in range(k)) for k in range(FRAMES)]

CODECS = [
    # (name, file, encoder, pix_fmt, options, pts_ms): the dataset each stands for in the comment
    ("h264_bframes_mp4", "h264.mp4", "libx264", "yuv420p", {"crf": "18", "bf": "3", "g": "12"}, None),  # K400, Ego4D
    ("vp9_webm", "vp9.webm", "libvpx-vp9", "yuv420p", {"crf": "20", "b": "0", "g": "12"}, None),  # SSv2
    ("vp8_webm", "vp8.webm", "libvpx", "yuv420p", {"crf": "10", "b": "1M", "g": "12"}, None),  # SSv2 (older files)
    ("hevc_mp4", "hevc.mp4", "libx265", "yuv420p", {"crf": "18", "x265-params": "log-level=error:keyint=12"}, None),
    ("hevc10_mp4", "hevc10.mp4", "libx265", "yuv420p10le",
     {"crf": "18", "x265-params": "log-level=error:keyint=12"}, None),
    ("av1_mp4", "av1.mp4", "libsvtav1", "yuv420p", {"crf": "20", "g": "12", "svtav1-params": "lp=1"}, None),
    ("mpeg4_avi", "mpeg4.avi", "mpeg4", "yuv420p", {"qscale": "2", "g": "12"}, None),
    ("mjpeg_avi", "mjpeg.avi", "mjpeg", "yuvj420p", {"q:v": "2"}, None),
    ("h264_vfr_mkv", "vfr.mkv", "libx264", "yuv420p", {"crf": "18", "bf": "3", "g": "12"}, VFR_MS),
]
NAMES = [c[0] for c in CODECS]


def write_coded(path: Path, video_id: int, encoder: str, pix_fmt: str, options: Dict[str, str],
                pts_ms: Optional[List[int]] = None) -> Path:
    """FRAMES block-coded frames of `video_id` through `encoder`; at 30 fps, or at the times `pts_ms`."""
    rate = Fraction(30)
    time_base = Fraction(1, 1000) if pts_ms is not None else 1 / rate
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(encoder, rate=rate, options=dict(options))
        stream.width = stream.height = SIDE
        stream.pix_fmt = pix_fmt
        stream.codec_context.time_base = time_base
        stream.thread_count = 1
        for i in range(FRAMES):
            frame = av.VideoFrame.from_ndarray(block_frame(video_id, i, SIDE, SIDE), format="rgb24")
            frame = frame.reformat(format=pix_fmt)
            frame.pts, frame.time_base = (pts_ms[i] if pts_ms is not None else i), time_base
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


# MPEG-4 Part 2 with B-frames as DivX and Xvid files hold it (tests/data/decode/test_reordered.py), each 48 frames:
# (name, file, how): "plain" as FFmpeg writes it to AVI (its packets' timestamps, which AVI does not keep but FFmpeg
# derives, run 1, 4, 2, 3, 7, 5, ...: out of order in decode order, the first at 1); "packed" with DivX's packed
# B-frames (each B-frame in the chunk of the P-frame before it, a not-coded VOP in its own place, and DivX's user
# data saying so: FFmpeg's decoder returns the frames in order but stamped 1, 3, 2, 5, 4, ...); "decode_order" with
# the header's low-delay bit set over B-frames, in Matroska, which keeps each frame's timestamp (FFmpeg's decoder then
# returns the frames in decode order, stamped 33, 133, 67, 100, ... ms); "late" with B-frames from a keyframe on
# (LATE_B), in Matroska (as an edit of two encodings: torchcodec 0.13 read it off by one from there when decoding
# through). "packed_untagged": packed without DivX's user data, of which FFmpeg's decoder returns no B-frame: a file
# no decoder reads exactly.
REORDERED = [("mpeg4_bframes_avi", "mpeg4_bf.avi", "plain"), ("mpeg4_packed_avi", "mpeg4_packed.avi", "packed"),
             ("mpeg4_decode_order_mkv", "mpeg4_decode_order.mkv", "decode_order"),
             ("mpeg4_late_bframes_mkv", "mpeg4_late_bframes.mkv", "late")]
LATE_B = 20  # "late": the first LATE_B frames without B-frames, the rest with (two encodings, one stream)
_VOP, _VOL, _USER_DATA = b"\x00\x00\x01\xb6", b"\x00\x00\x01\x20", b"\x00\x00\x01\xb2"


def write_reordered(path: Path, video_id: int, how: str) -> Path:
    """FRAMES block-coded frames of `video_id`, MPEG-4 Part 2 with B-frames, laid out as `how` says (REORDERED)."""
    if how == "late":
        return _write_late(path, video_id)
    plain = path if how == "plain" else path.with_name(path.stem + "_plain.avi")
    write_coded(plain, video_id, "mpeg4", "yuv420p", {"qscale": "2", "g": "12", "bf": "1" if "packed" in how else "2"})
    if how == "plain":
        return path
    with av.open(str(plain)) as src:
        stream = src.streams.video[0]
        packets = [(bytes(p), p.pts, p.dts, p.is_keyframe) for p in src.demux(stream) if p.size]
        extradata, time_base = stream.codec_context.extradata, stream.time_base
        with av.open(str(path), mode="w") as out:
            dst = out.add_stream_from_template(stream)
            if how == "decode_order":
                dst.codec_context.extradata = _low_delay(extradata)
                chunks = [(_low_delay(data), pts, dts, key) for data, pts, dts, key in packets]
            else:  # write_coded's time base is 1/30 s: a VOP's time increment takes 5 bits
                chunks = _packed(packets, (30 - 1).bit_length(), how == "packed")
            for data, pts, dts, key in chunks:
                packet = av.Packet(data)
                packet.pts, packet.dts, packet.is_keyframe, packet.time_base = pts, dts, key, time_base
                packet.stream = dst
                out.mux(packet)
    plain.unlink()
    return path


def _low_delay(data: bytes) -> bytes:
    """`data` with every video object layer header's low_delay bit set (24 bits after its start code, as FFmpeg's
    encoder writes the header: random access, type, layer id, version, priority, aspect, control, chroma)."""
    out, at = bytearray(data), data.find(_VOL)
    while at >= 0:
        out[at + 7] |= 0x80
        at = data.find(_VOL, at + 4)
    return bytes(out)


def _vop_type(data: bytes) -> int:
    return data[data.find(_VOP) + 4] >> 6  # 0 I, 1 P, 2 B


def _packed(packets, time_bits: int, tagged: bool):
    """DivX's packed B-frames: a P-frame's chunk followed by B-frames carries them, each B-frame's own chunk becomes
    a not-coded P-VOP with its time; keyframes carry DivX's user data (`tagged`) that tells decoders so. AVI keeps
    no timestamps: each chunk gets its place."""
    chunks, k = [], 0
    while k < len(packets):
        data, _, _, key = packets[k]
        j = k + 1
        while _vop_type(data) == 1 and j < len(packets) and _vop_type(packets[j][0]) == 2:
            j += 1
        if key and tagged:
            at = data.find(_VOP)
            data = data[:at] + _USER_DATA + b"DivX503b1393p" + data[at:]
        chunks.append(data + b"".join(p[0] for p in packets[k + 1:j]))
        chunks.extend(_not_coded(p[0], time_bits) for p in packets[k + 1:j])
        k = j
    return [(data, i, i, _vop_type(data) == 0) for i, data in enumerate(chunks)]


def _not_coded(b_frame: bytes, time_bits: int) -> bytes:
    """A not-coded P-VOP (DivX's placeholder) with `b_frame`'s time: start code, type P, the B-frame's modulo time
    base and time increment, vop_coded 0, stuffing."""
    at, bits = b_frame.find(_VOP) + 4, []
    read = iter((b_frame[at + i // 8] >> (7 - i % 8)) & 1 for i in range(8 * (len(b_frame) - at)))
    next(read), next(read)  # the B-frame's coding type
    seconds = 0
    while next(read):
        seconds += 1
    next(read)  # marker
    increment = [next(read) for _ in range(time_bits)]
    bits = [0, 1] + [1] * seconds + [0, 1] + increment + [1, 0]
    bits += [0] + [1] * ((-len(bits) - 1) % 8)
    return _VOP + bytes(int("".join(map(str, bits[i:i + 8])), 2) for i in range(0, len(bits), 8))


def _write_late(path: Path, video_id: int) -> Path:
    """Frames 0 to LATE_B - 1 encoded without B-frames, the rest by a second encoder with two B-frames in a row (its
    first frame a keyframe), their packets in one Matroska stream at 30 fps."""
    time_base = Fraction(1, 30)

    def encode(first: int, count: int, b_frames: int) -> list:
        codec = av.CodecContext.create("mpeg4", "w")
        codec.width = codec.height = SIDE
        codec.pix_fmt, codec.time_base, codec.framerate = "yuv420p", time_base, Fraction(30)
        codec.max_b_frames, codec.gop_size, codec.thread_count = b_frames, 12, 1
        codec.options = {"qscale": "2"}
        packets = []
        for i in range(first, first + count):
            frame = av.VideoFrame.from_ndarray(block_frame(video_id, i, SIDE, SIDE), format="rgb24")
            frame = frame.reformat(format="yuv420p")
            frame.pts, frame.time_base = i, time_base
            packets += codec.encode(frame)
        return packets + codec.encode(None)

    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("mpeg4", rate=30)
        stream.width = stream.height = SIDE
        stream.pix_fmt = "yuv420p"
        for packet in encode(0, LATE_B, 0) + encode(LATE_B, FRAMES - LATE_B, 2):
            packet.time_base, packet.stream = time_base, stream
            container.mux(packet)
    return path


# MPEG-2 video with B-frames (two in a row, a GOP of 15, 25 fps) in the containers cameras, DVDs and broadcast write
# it to (tests/data/decode/test_mpeg2.py): (name, file, PyAV's container format, closed GOP). A program stream
# ("mpeg": .mpg, .vob) and a transport stream ("mpegts": .ts, .m2ts), each with open GOPs (FFmpeg's default: the
# B-frames before a keyframe refer to the GOP before) and the transport stream with closed GOPs too.
MPEG2 = [("mpeg2_ps", "mpeg2_ps.mpg", "mpeg", False), ("mpeg2_ts", "mpeg2_ts.ts", "mpegts", False),
         ("mpeg2_ts_closed", "mpeg2_ts_closed.ts", "mpegts", True)]
MPEG2_GOP = 15


def write_mpeg2(path: Path, video_id: int, container_format: str, closed_gop: bool = False,
                frames: Optional[List[np.ndarray]] = None) -> Path:
    """FRAMES block-coded frames of `video_id` (or `frames`, rgb24) as MPEG-2 video with B-frames, muxed by PyAV as
    `container_format`; with `closed_gop`, closed GOPs (FFmpeg needs scene-change keyframes off for them)."""
    rate = Fraction(25)
    options = {"sc_threshold": "1000000000"} if closed_gop else {}
    with av.open(str(path), mode="w", format=container_format) as container:
        stream = container.add_stream("mpeg2video", rate=rate, options=options)
        stream.width = stream.height = SIDE
        stream.pix_fmt = "yuv420p"
        codec = stream.codec_context
        codec.max_b_frames, codec.gop_size, codec.qmax, codec.thread_count = 2, MPEG2_GOP, 2, 1
        if closed_gop:
            codec.flags |= av.codec.context.Flags.closed_gop
        images = frames if frames is not None else [block_frame(video_id, i, SIDE, SIDE) for i in range(FRAMES)]
        for i, image in enumerate(images):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
            frame.pts, frame.time_base = i, 1 / rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def night_frames(seed: int = 7) -> List[np.ndarray]:
    """FRAMES frames of a dark still scene under sensor noise, as a camera films at night: a frame differs from
    every other about equally (the noise), so a frame three late is no nearer the frame before or after it."""
    rng = np.random.default_rng(seed)
    scene = np.full((SIDE, SIDE, 1), 24, dtype=np.int16)
    scene[SIDE // 4: 3 * SIDE // 4, SIDE // 4: 3 * SIDE // 4] = 60
    return [np.repeat(np.clip(scene + rng.integers(0, 24, scene.shape), 0, 255).astype(np.uint8), 3, axis=2)
            for _ in range(FRAMES)]
