"""Writing mp4 files with PyAV (FFmpeg's libx264): the demo videos and the tests' frame-index videos."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Iterable, Optional

import numpy as np


def write_video(path, frames: Iterable[np.ndarray], fps: float, crf: int = 18, gop: Optional[int] = None,
                faststart: bool = False) -> Path:
    """Encode RGB uint8 frames (H, W, 3) (an array or any iterable) as H.264 yuv420p into `path`.

    `gop` sets the keyframe interval (None: x264's default); `faststart` puts the index at the front of the file.
    Sides must be even (yuv420p).
    """
    import av  # lazy: PyAV (FFmpeg) is slow to import and only needed when videos are written

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"crf": str(int(crf)), "preset": "veryfast"}
    if gop is not None:
        options.update({"g": str(int(gop)), "keyint_min": str(int(gop)), "sc_threshold": "0"})
    container_options = {"movflags": "+faststart"} if faststart else {}
    with av.open(str(path), mode="w", options=container_options) as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001), options=options)
        stream.codec_context.time_base = 1 / Fraction(fps).limit_denominator(1001)
        stream.pix_fmt = "yuv420p"
        stream.thread_count = 1
        started = False
        rate = Fraction(fps).limit_denominator(1001)
        for i, frame in enumerate(frames):
            frame = np.ascontiguousarray(frame, dtype=np.uint8)
            if not started:
                stream.height, stream.width = frame.shape[:2]
                started = True
            # from_ndarray may wrap the array's memory without owning it, and x264 keeps frames for lookahead:
            # reformat into a frame FFmpeg allocated, so no frame can change after the array is freed.
            owned = av.VideoFrame.from_ndarray(frame, format="rgb24").reformat(format="yuv420p")
            owned.pts, owned.time_base = i, 1 / rate  # explicit timestamps: x264's rate control reads them
            for packet in stream.encode(owned):
                container.mux(packet)
        if started:
            for packet in stream.encode():
                container.mux(packet)
    return path
