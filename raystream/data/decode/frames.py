"""Frame geometry: a frame is center-cropped to a square and resized to `resolution` x `resolution`.

The stream asks the decoder for frames already scaled (`scaled_size`: the whole frame scaled so its short side is
`resolution`, in libswscale inside decord or PyAV) and crops the square out of that (`crop_square`): no per-frame
Python resize. `square_resize` is the reference the other way round (crop at full size, then PIL's antialiased
bilinear resize); the two agree within a few grey levels (tests/data/decode/test_decode.py) and it still serves
the probe set, whose few frames are read once.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
from PIL import Image


def scaled_size(width: int, height: int, resolution: int) -> Tuple[int, int]:
    """(width, height) to decode a width x height frame at: the short side at `resolution` pixels, the long side
    `resolution` plus twice the source crop's offset scaled (rounded), so the centered square starts where
    `square_resize`'s starts (to within half a pixel; a plain aspect-keeping size can be a pixel off)."""
    side = min(width, height)
    if side <= 0:
        return resolution, resolution

    def scaled(length: int) -> int:
        return resolution + 2 * int(round((length - side) // 2 * resolution / side))

    return scaled(width), scaled(height)


def crop_square(frames: np.ndarray, resolution: int, out: Optional[np.ndarray] = None) -> np.ndarray:
    """uint8 (n, h, w, 3) decoded at `scaled_size` -> uint8 (n, 3, r, r): the centered r x r square, channels first
    (written into `out` when given). Frames decoded on the GPU (a CUDA tensor, torchcodec_reader.py) are cropped
    there and only the square is copied to the host.

    The offset is the source crop's offset scaled, so the square covers the same part of the frame as
    `square_resize`'s (to within a scaled pixel)."""
    n, h, w = frames.shape[:3]
    if min(h, w) < resolution:
        raise ValueError(f"frames of {w}x{h} are smaller than the {resolution} px square cropped from them")
    top, left = (h - resolution) // 2, (w - resolution) // 2
    square = frames[:, top:top + resolution, left:left + resolution]
    if not isinstance(square, np.ndarray):  # a torch tensor from the GPU decoder
        square = square.cpu().numpy()
    square = square.transpose(0, 3, 1, 2)
    if out is None:
        return np.ascontiguousarray(square)
    out[...] = square
    return out


def square_resize(frames: np.ndarray, resolution: int) -> np.ndarray:
    """uint8 (n, H, W, 3) at full size -> uint8 (n, 3, r, r): center crop to a square, then an antialiased bilinear
    resize (Pillow, single-threaded)."""
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
