"""Shared fixtures of the model tests: tiny configs and a synthetic temporally correlated clip stream."""

from __future__ import annotations

import math

import torch

from raystream.data.config import StreamConfig
from raystream.models.config import ScenarioConfig


def tiny_cfg(name: str = "videomae", **kw) -> ScenarioConfig:
    cfg = ScenarioConfig(name=name)
    for key, value in kw.items():
        obj, attr = cfg, key
        if "." in key:
            head, attr = key.split(".")
            obj = getattr(cfg, head)
        setattr(obj, attr, value)
    return cfg


def stream_cfg(**kw) -> StreamConfig:
    return StreamConfig(**{"frames_per_clip": 4, "resolution": 32, **kw})


def drifting_video(num_frames: int, size: int = 32, seed: int = 0) -> torch.Tensor:
    """(F, 3, size, size) in [0, 1]: smooth random colour blobs translating slowly (a correlated stream)."""
    g = torch.Generator().manual_seed(seed)
    canvas = 2 * size
    yy, xx = torch.meshgrid(torch.arange(canvas).float(), torch.arange(canvas).float(), indexing="ij")
    img = torch.zeros(3, canvas, canvas)
    for _ in range(6):
        cy, cx = torch.rand(2, generator=g) * canvas
        colour = torch.rand(3, 1, 1, generator=g)
        img += colour * torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * (canvas / 8) ** 2))
    img = img / img.amax()
    frames = []
    for f in range(num_frames):
        dy = int(round(size / 2 + (size / 2 - 1) * math.sin(f / 40)))
        dx = int(round(f * 0.5)) % size
        frames.append(img[:, dy:dy + size, dx:dx + size])
    return torch.stack(frames)


def correlated_batches(steps: int, batch: int = 8, frames: int = 4, target: int = 0, size: int = 32):
    """Batch-along-time stream: sample i of step t is the clip starting at frame 2*t of video i."""
    need = 2 * steps + frames + target + 1
    videos = [drifting_video(need, size, seed=i) for i in range(batch)]
    for t in range(steps):
        clips = torch.stack([v[2 * t: 2 * t + frames] for v in videos])
        tgt = torch.stack([v[2 * t + frames: 2 * t + frames + target] for v in videos]) if target else None
        yield {"frames": clips, "target": tgt, "index": torch.arange(batch), "step": t}


def train_on_stream(scenario, stream, optimizer, key: str = "loss") -> list:
    """One optimizer step per batch of `stream`, as the train loop does; returns `key` of each step's output,
    measured in the forward pass before that step's update."""
    values = []
    for batch in stream.batches():
        out = scenario.model(batch.model_inputs())
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
        scenario.after_step(batch.step)
        values.append(float(out[key].detach()))
    return values
