"""Helpers of tests/data/decode/test_codecs.py (imported by name): the codecs and containers of the paper's datasets,
written by PyAV with frames that carry their own index (rs_data_helpers.block_frame, 64x64: 16 px cells that
survive lossy coding).

Each CODECS entry: (name, file name, encoder, pix_fmt, encoder options, presentation times in ms or None for a
constant 30 fps). One video id per entry, so a frame of the wrong video reads back as such.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Dict, List, Optional

import av

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
