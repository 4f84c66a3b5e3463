"""`raystream data inspect`: which source frames each global batch (or each rank's shard) holds, as JSON lines.

    {"step": t, "clips": [{"video": "<path>", "frames": [i0, i1, ...]}, ...]}             # one per global batch
    {"step": t, "rank": r, "clips": [...]}                                              # with --world-size W

Each clip's video is named as the user gave it: a video from a bucket by its URI (`s3://b/p/x.mp4`), not by its
place in the node cache. Clips of future prediction also carry `"target": [...]`. `--start-step S` prints what a stream restored at step S
yields. Nothing is decoded: the videos are only probed (frame counts), then the order's arithmetic is printed.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

from raystream.data.errors import DataError
from raystream.data.stream.build import build_stream


def _clip_json(video: str, ref) -> dict:
    d = {"video": video, "frames": list(ref.frames)}
    if ref.target:
        d["target"] = list(ref.target)
    return d


def main(cfg, batches: int = 3, start_step: int = 0, world_size: Optional[int] = None) -> int:
    try:
        stream = build_stream(cfg.data, cfg.stream, rank=0, world_size=world_size or 1)
        if not 0 <= start_step <= stream.num_steps:
            raise DataError(f"--start-step {start_step} is outside the stream's {stream.num_steps} steps")
    except DataError as exc:
        print(f"raystream: {exc}", file=sys.stderr)
        return 2
    b = stream.batch_size // (world_size or 1)
    for step in range(start_step, min(stream.num_steps, start_step + max(0, batches))):
        if world_size is None:
            refs = stream.clip_refs(step, range(stream.batch_size))
            clips = [_clip_json(stream.videos[v].given, r) for v, _, r in refs]
            print(json.dumps({"step": step, "clips": clips}))
            continue
        for rank in range(world_size):
            refs = stream.clip_refs(step, range(rank * b, (rank + 1) * b))
            clips = [_clip_json(stream.videos[v].given, r) for v, _, r in refs]
            print(json.dumps({"step": step, "rank": rank, "clips": clips}))
    stream.close()
    return 0
