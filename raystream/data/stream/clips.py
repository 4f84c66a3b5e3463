"""Which source frames make up clip k of one video: the arithmetic of `stream.frames_per_clip/fps/clip_shift`.

A clip holds F = `frames_per_clip` frames `stride` source frames apart, stride = round(source_fps / stream.fps)
(halves round up, at least 1); clip k starts at source frame k * `clip_shift`. For future prediction it also holds
`target_frames` frames at the same stride, the first one round(`target_offset_s` * source_fps) frames (at least 1)
after the clip's last input frame. A video of L frames has floor((L - 1 - span) / shift) + 1 clips, span being the
offset of the clip's last frame from its first, so a clip never runs past its video (nor into the next one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List


def _round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


@dataclass(frozen=True)
class ClipGeometry:
    frames_per_clip: int
    stride: int
    shift: int
    target_frames: int = 0
    target_gap: int = 0  # source frames from the last input frame to the first target frame

    @classmethod
    def from_config(cls, stream_cfg, source_fps: float) -> "ClipGeometry":
        """The geometry of `stream_cfg` on a video of `source_fps` frames per second."""
        stride = max(1, _round_half_up(float(source_fps) / float(stream_cfg.fps)))
        targets = int(stream_cfg.target_frames)
        gap = max(1, _round_half_up(float(stream_cfg.target_offset_s) * float(source_fps)))
        return cls(int(stream_cfg.frames_per_clip), stride, int(stream_cfg.clip_shift), targets, gap if targets else 0)

    @property
    def span(self) -> int:
        """Offset of the clip's last source frame (input or target) from its first."""
        last_input = (self.frames_per_clip - 1) * self.stride
        if not self.target_frames:
            return last_input
        return last_input + self.target_gap + (self.target_frames - 1) * self.stride

    @property
    def lattice(self) -> int:
        """Every frame any clip uses is a multiple of this (gcd of shift, stride and target offset)."""
        g = math.gcd(self.shift, self.stride)
        if self.target_frames:
            g = math.gcd(g, (self.frames_per_clip - 1) * self.stride + self.target_gap)
        return g

    def num_clips(self, num_frames: int) -> int:
        return max(0, (num_frames - 1 - self.span) // self.shift + 1)

    def frames(self, k: int) -> List[int]:
        start = k * self.shift
        return [start + j * self.stride for j in range(self.frames_per_clip)]

    def targets(self, k: int) -> List[int]:
        if not self.target_frames:
            return []
        first = k * self.shift + (self.frames_per_clip - 1) * self.stride + self.target_gap
        return [first + j * self.stride for j in range(self.target_frames)]
