"""A batch assembled from decoded frames (raystream/data/stream/batch.py `assemble`): each clip's frames in place,
float in [0, 1] or left uint8, targets only when the clips have them, the places and videos beside them."""

import numpy as np
import pytest
import torch

from raystream.data.stream.batch import ClipRef, assemble


@pytest.mark.parametrize("uint8", [False, True])
def test_each_clip_holds_its_own_frames_in_order(uint8):
    r = 4
    pixels = {(v, f): np.full((3, r, r), 10 * v + f, dtype=np.uint8) for v in (0, 1) for f in range(6)}
    refs = [(1, 0, ClipRef("b.mp4", [3, 4], [5])), (0, 2, ClipRef("a.mp4", [0, 1], [2]))]
    batch = assemble(7, refs, [2, 3], pixels, r, uint8, pin_memory=False)
    assert batch.step == 7 and batch.index.tolist() == [2, 3] and batch.video_index.tolist() == [1, 0]
    assert batch.frames.shape == (2, 2, 3, r, r) and batch.target.shape == (2, 1, 3, r, r)
    assert batch.frames.dtype == (torch.uint8 if uint8 else torch.float32)
    scale = 1 if uint8 else 255
    firsts = (batch.frames[:, :, 0, 0, 0].float() * scale).round().tolist()
    assert firsts == [[13, 14], [0, 1]]
    assert (batch.target[:, 0, 0, 0, 0].float() * scale).round().tolist() == [15, 2]
    assert [c.video for c in batch.clips] == ["b.mp4", "a.mp4"]


def test_clips_without_targets_have_none():
    pixels = {(0, f): np.zeros((3, 2, 2), dtype=np.uint8) for f in range(2)}
    batch = assemble(0, [(0, 0, ClipRef("a.mp4", [0, 1]))], [0], pixels, 2, False, pin_memory=False)
    assert batch.target is None and float(batch.frames.max()) == 0.0
