"""Helpers of tests/data (imported by name: tests/ has no packages). Test videos whose frames encode (video id, frame index) as a 4x4 grid of black/white blocks.

16 bits: the low 12 bits are the frame index, the high 4 bits the video id. Written losslessly (libx264 crf 0) with
short GOPs so seeks and read-through both happen; the decoded grid reads back exactly even after cropping/resizing.
"""

from __future__ import annotations

from pathlib import Path
import numpy as np
import torch

from raystream.data.config import DataConfig, StreamConfig
from raystream.data.demo.encode import write_video

# (video id, frames, width, height, gop): one non-square video (center-cropped by the stream)
BLOCK_VIDEOS = [(1, 40, 32, 32, 10), (2, 25, 32, 32, 7), (3, 33, 40, 32, 12), (4, 21, 32, 32, 5)]


def block_frame(video_id: int, index: int, width: int = 32, height: int = 32) -> np.ndarray:
    code = (video_id << 12) | index
    bits = np.array([(code >> b) & 1 for b in range(16)], dtype=np.uint8).reshape(4, 4) * 255
    side = min(width, height)
    grid = np.kron(bits, np.ones((side // 4, side // 4), dtype=np.uint8))
    frame = np.full((height, width), 128, dtype=np.uint8)
    top, left = (height - side) // 2, (width - side) // 2
    frame[top:top + side, left:left + side] = grid
    return np.repeat(frame[:, :, None], 3, axis=2)


def read_block(frame: torch.Tensor) -> tuple:
    """(video id, frame index) of a decoded (C, H, W) frame, uint8 or float in [0, 1]."""
    x = frame.float()
    if frame.dtype == torch.uint8:
        x = x / 255.0
    gray = x.mean(0)
    cell = gray.shape[-1] // 4
    code = 0
    for b in range(16):
        r, c = divmod(b, 4)
        inner = gray[r * cell + cell // 4: (r + 1) * cell - cell // 4, c * cell + cell // 4: (c + 1) * cell - cell // 4]
        code |= int(inner.mean() > 0.5) << b
    return code >> 12, code & 0xFFF


def write_block_video(path: Path, video_id: int, frames: int, width: int = 32, height: int = 32, gop: int = 10,
                      **kw) -> Path:
    return write_video(path, (block_frame(video_id, i, width, height) for i in range(frames)), 30, crf=0, gop=gop,
                       **kw)


def data_cfg(videos, **kw) -> DataConfig:
    base = dict(videos=videos, decode_timeout_s=60.0,
                decord_reset_frames=6)  # small: decord readers are flushed at keyframes all through the tests
    base.update(kw)
    return DataConfig(**base)


def stream_cfg(**kw) -> StreamConfig:
    base = dict(order="batch_along_time", batch_size=4, frames_per_clip=3, fps=15.0, clip_shift=1, target_frames=0,
                target_offset_s=0.0, resolution=32, dtype="uint8", epochs=1, seed=0)
    base.update(kw)
    return StreamConfig(**base)


def naive_time(counts, B, epochs):
    flat = [(v, k) for v, n in enumerate(counts) for k in range(n)]
    steps = len(flat) // B
    return [flat[t * B:(t + 1) * B] for t in range(steps)] * epochs


def naive_video(counts, B, epochs):
    """Step by step: every slot takes the next clip of its video; a finished slot takes the next video in the queue
    (slot 0 first); the pass ends when a slot finds the queue empty."""
    queue = list(range(len(counts)))
    slots = [None] * B  # [video, next clip]
    batches = []
    while True:
        batch = []
        for s in range(B):
            if slots[s] is None or slots[s][1] == counts[slots[s][0]]:
                if not queue:
                    return batches * epochs
                slots[s] = [queue.pop(0), 0]
            batch.append((slots[s][0], slots[s][1]))
            slots[s][1] += 1
        batches.append(batch)
