"""What a stream yields: one rank's shard of a global batch (Batch), the clips in it (ClipRef), and its assembly from
decoded frames (`assemble`: uint8 pixels copied into place, in pinned memory when asked, then float in [0, 1] unless
the frames stay uint8). batches.py's ClipStream decides which frames and decodes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch


@dataclass
class ClipRef:
    """One clip: its video file and the source-frame indices of its input (and target) frames."""

    video: str
    frames: List[int]
    target: List[int] = field(default_factory=list)


@dataclass
class Batch:
    """This rank's shard of global batch `step` (b = batch_size // world_size clips)."""

    step: int
    frames: torch.Tensor  # (b, T, C, H, W) float32 in [0, 1], or uint8
    target: Optional[torch.Tensor]  # (b, T_target, C, H, W) when stream.target_frames > 0
    index: torch.Tensor  # (b,) global place of each clip in the global batch
    video_index: torch.Tensor  # (b,) index of each clip's video in the stream's video list
    clips: List[ClipRef]

    def model_inputs(self, device: Optional[torch.device] = None) -> Dict[str, object]:
        """The dict a scenario's model takes (`frames`, `target`, `index`, `step`), on `device` when given; `index`
        stays on the host, where the models read it (seeded masks and views: reading it off a GPU syncs the step)."""

        def move(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return t if t is None or device is None else t.to(device, non_blocking=True)

        return {"frames": move(self.frames), "target": move(self.target), "index": self.index,
                "step": int(self.step)}


def assemble(step: int, refs: Sequence[Tuple[int, int, ClipRef]], places: Sequence[int],
             pixels: Dict[Tuple[int, int], np.ndarray], resolution: int, uint8: bool, pin_memory: bool) -> Batch:
    """The Batch of global step `step` at `places`, its clips `refs` ((video, clip, ClipRef) as
    ClipStream.clip_refs gives them) from `pixels[(video, frame)]` ((3, r, r) uint8 each): uint8 (in pinned memory
    when asked) or float32 in [0, 1]."""
    r = resolution

    def stack(frames_of: List[Tuple[int, List[int]]]) -> torch.Tensor:
        out = torch.empty((len(frames_of), len(frames_of[0][1]), 3, r, r), dtype=torch.uint8, pin_memory=pin_memory)
        x = out.numpy()  # numpy, not torch ops, in this thread: it must not compete for torch's intra-op pool
        for i, (v, frames) in enumerate(frames_of):
            for j, f in enumerate(frames):
                x[i, j] = pixels[(v, f)]
        if uint8:
            return out
        return torch.from_numpy(np.multiply(x, np.float32(1.0 / 255.0), dtype=np.float32))

    return Batch(
        step=step,
        frames=stack([(v, ref.frames) for v, _, ref in refs]),
        target=stack([(v, ref.target) for v, _, ref in refs]) if refs[0][2].target else None,
        index=torch.tensor(list(places), dtype=torch.long),
        video_index=torch.tensor([v for v, _, _ in refs], dtype=torch.long),
        clips=[ref for _, _, ref in refs],
    )


__all__ = ["Batch", "ClipRef", "assemble"]
