"""Pixels in and out of the models: input normalisation, tubelet patchify/unpatchify, VideoMAE's patch target.

Clips arrive as (B, T, C, H, W) in [0, 1] (float) or [0, 255] (uint8). Tokens are ordered (t', h', w'), the order
of the Conv3d patch embedding flattened, so patch i of `patchify` is token i of the encoder.
"""

from __future__ import annotations

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor made in the step (constants, seeded views' parameters) on `device`, without waiting for
    the device: `torch.tensor(..., device=cuda)` and `.to(cuda)` copy and then synchronise the host with the GPU."""
    return host.to(device, non_blocking=True)


def as_float(frames: torch.Tensor) -> torch.Tensor:
    """Frames in [0, 1] as float32 (uint8 streams are divided by 255)."""
    if frames.dtype == torch.uint8:
        return frames.float().div_(255.0)
    return frames.float()


def normalize_input(frames: torch.Tensor) -> torch.Tensor:
    """ImageNet mean/std normalisation of [0, 1] frames (..., C, H, W), as VideoMAE feeds its encoder."""
    c = frames.shape[-3]
    mean = to_device(torch.tensor(IMAGENET_MEAN[:c] if c == 3 else (0.5,) * c, dtype=frames.dtype), frames.device)
    std = to_device(torch.tensor(IMAGENET_STD[:c] if c == 3 else (0.5,) * c, dtype=frames.dtype), frames.device)
    return (frames - mean.view(c, 1, 1)) / std.view(c, 1, 1)


def patchify(frames: torch.Tensor, patch: int, tubelet: int) -> torch.Tensor:
    """(B, T, C, H, W) -> (B, N, tubelet * patch * patch, C), N = (T/tubelet) * (H/patch) * (W/patch)."""
    b, t, c, h, w = frames.shape
    x = frames.reshape(b, t // tubelet, tubelet, c, h // patch, patch, w // patch, patch)
    x = x.permute(0, 1, 4, 6, 2, 5, 7, 3)  # b t' h' w' tubelet p p c
    return x.reshape(b, (t // tubelet) * (h // patch) * (w // patch), tubelet * patch * patch, c)


def unpatchify(patches: torch.Tensor, frames: int, height: int, width: int, patch: int, tubelet: int,
               channels: int = 3) -> torch.Tensor:
    """Inverse of `patchify` for flat patches (B, N, tubelet * patch * patch * C) -> (B, T, C, H, W)."""
    b = patches.shape[0]
    t_, h_, w_ = frames // tubelet, height // patch, width // patch
    x = patches.reshape(b, t_, h_, w_, tubelet, patch, patch, channels)
    x = x.permute(0, 1, 4, 7, 2, 5, 3, 6)  # b t' tubelet c h' p w' p
    return x.reshape(b, frames, channels, height, width)


def patch_target(frames: torch.Tensor, patch: int, tubelet: int, normalize: bool = True) -> torch.Tensor:
    """VideoMAE's reconstruction target, (B, N, tubelet * patch * patch * C).

    With `normalize`, each tubelet patch is normalised by its own mean and (unbiased) std, per channel, over its
    tubelet x patch x patch pixels, as in VideoMAE's `run_mae_pretraining`; otherwise raw [0, 1] pixels.
    """
    x = patchify(frames, patch, tubelet)
    if normalize:
        x = (x - x.mean(dim=-2, keepdim=True)) / (x.var(dim=-2, unbiased=True, keepdim=True).sqrt() + 1e-6)
    return x.flatten(2)
