"""DoRA's views of a clip, drawn from (seed, step, global sample index) so that a sample gets the same views on
whichever worker holds it (the global gradient does not depend on the number of workers).

- the global view (the teacher's input, and what the masked clips are cut from): one random resized crop (area in
  [global_crop_min, 1], aspect ratio in [3/4, 4/3]) and one horizontal flip for the whole clip, resized to the
  stream resolution, then per-frame colour jitter / grayscale;
- with `global_crops: 2` (the paper's Table 5) a second global view of the same clip frames, drawn the same way
  from its own random stream: its own resized crop, flip and jitter. DoRA's released code has one global view
  and its paper does not say how a second is made; we take DINO's (two random crops of the same image, here of
  the same frames) and track objects in each view separately, so each view's masks fit its own crop;
- `local_crops` local views: per frame an independent random resized crop (area in [local_crop_min,
  local_crop_max]) of the frame at `local_size` pixels (112 at 224), flip and colour jitter per frame.

Colour jitter is brightness 0.4, contrast 0.4, saturation 0.2 (DINO's values) with probability `color_jitter`,
then grayscale with probability `grayscale`. DINO's hue jitter and Gaussian blur are left out. Crops are bilinear
`grid_sample`s, batched over all clips and frames.
"""

from __future__ import annotations

import math
from typing import Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from raystream.models.pixels import to_device

_GLOBAL, _LOCAL, _HEADS, _GLOBAL2 = 1, 2, 3, 4  # view 1 keeps tag 1: global_crops 1 draws as before


def _rng(seed: int, tag: int, step: int, index: int = 0) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, tag, int(step), int(index)])


def choose_heads(num_heads: int, k: int, *, seed: int, step: int) -> list:
    """The K attention heads whose [CLS] maps seed the objects of step `step` (one draw per global batch, as
    the official code's `random.sample` per iteration)."""
    if not 1 <= k <= num_heads:
        raise ValueError(f"scenario.dora.num_objects = {k}: expected 1..{num_heads} (the backbone's heads)")
    return sorted(int(h) for h in _rng(seed, _HEADS, step).choice(num_heads, size=k, replace=False))


def _crop_box(rng: np.random.Generator, scale: Tuple[float, float]) -> Tuple[float, float, float, float]:
    """(cx, cy, w, h) of a random resized crop in normalised [-1, 1] coordinates (torchvision's sampling rule)."""
    for _ in range(10):
        area = rng.uniform(*scale)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = math.sqrt(area * ratio), math.sqrt(area / ratio)
        if w <= 1 and h <= 1:
            break
    else:
        w = h = math.sqrt(min(scale[1], 1.0))
    cx, cy = rng.uniform(-1 + w, 1 - w), rng.uniform(-1 + h, 1 - h)
    return cx, cy, w, h


def _theta(boxes: np.ndarray, flips: np.ndarray) -> torch.Tensor:
    """Affine grids (N, 2, 3) mapping output [-1, 1]^2 to the boxes (cx, cy, w, h), x mirrored where flipped."""
    theta = np.zeros((len(boxes), 2, 3), dtype=np.float32)
    theta[:, 0, 0] = boxes[:, 2] * np.where(flips, -1.0, 1.0)
    theta[:, 0, 2] = boxes[:, 0]
    theta[:, 1, 1] = boxes[:, 3]
    theta[:, 1, 2] = boxes[:, 1]
    return torch.from_numpy(theta)


def _jitter_params(rng: np.random.Generator, n: int, p_jitter: float, p_gray: float) -> np.ndarray:
    """(n, 4): brightness, contrast, saturation factors (1 = unchanged) and a grayscale flag."""
    on = rng.random(n) < p_jitter
    out = np.ones((n, 4), dtype=np.float32)
    out[:, 0] = np.where(on, rng.uniform(0.6, 1.4, n), 1.0)
    out[:, 1] = np.where(on, rng.uniform(0.6, 1.4, n), 1.0)
    out[:, 2] = np.where(on, rng.uniform(0.8, 1.2, n), 1.0)
    out[:, 3] = (rng.random(n) < p_gray).astype(np.float32)
    return out


def color_jitter(images: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Brightness, contrast, saturation and grayscale on (N, C, H, W) in [0, 1] with per-image `params` (N, 4)."""
    if images.shape[1] != 3:
        return images
    p = to_device(params.to(images.dtype), images.device).view(-1, 4, 1, 1)
    weights = to_device(torch.tensor([0.299, 0.587, 0.114], dtype=images.dtype), images.device).view(1, 3, 1, 1)
    x = (images * p[:, 0:1]).clamp(0, 1)
    gray = (x * weights).sum(dim=1, keepdim=True)
    x = (gray.mean(dim=(2, 3), keepdim=True) + p[:, 1:2] * (x - gray.mean(dim=(2, 3), keepdim=True))).clamp(0, 1)
    gray = (x * weights).sum(dim=1, keepdim=True)
    x = (gray + p[:, 2:3] * (x - gray)).clamp(0, 1)
    gray = (x * weights).sum(dim=1, keepdim=True).expand_as(x)
    return torch.where(p[:, 3:4] > 0.5, gray, x)


def _resample(images: torch.Tensor, theta: torch.Tensor, size: int) -> torch.Tensor:
    grid = F.affine_grid(to_device(theta.to(images.dtype), images.device),
                         [images.shape[0], images.shape[1], size, size], align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)


def make_views(frames: torch.Tensor, index: Sequence[int], *, seed: int, step: int, cfg,
               local_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(global views (G, B, T, C, R, R), local views (L, B, T, C, r, r)) of clips `frames` (B, T, C, R, R) in [0, 1].

    `cfg` holds global_crops (G), global_crop_min, local_crop_min, local_crop_max, local_crops, flip, color_jitter,
    grayscale.
    """
    b, t, c, res, _ = frames.shape
    n_local = int(cfg.local_crops)
    flat = frames.reshape(b * t, c, res, res)
    tags = (_GLOBAL, _GLOBAL2)[:int(cfg.global_crops)]
    global_views = torch.stack([_global_view(flat, index, t, tag, seed=seed, step=step, cfg=cfg) for tag in tags])
    global_views = global_views.reshape(len(tags), b, t, c, res, res)
    if n_local == 0:
        return global_views, frames.new_zeros(0, b, t, c, local_size, local_size)
    l_boxes, l_flips, l_jit = [], [], []
    for i in index:
        rng = _rng(seed, _LOCAL, step, int(i))
        l_boxes.append([_crop_box(rng, (float(cfg.local_crop_min), float(cfg.local_crop_max)))
                        for _ in range(n_local * t)])
        l_flips.append(rng.random(n_local * t) < float(cfg.flip))
        l_jit.append(_jitter_params(rng, n_local * t, float(cfg.color_jitter), float(cfg.grayscale)))
    # local crops of sample i, ordered (crop, frame); the source frame repeats for each crop
    boxes = np.array(l_boxes, dtype=np.float32).reshape(b, n_local, t, 4).transpose(1, 0, 2, 3).reshape(-1, 4)
    flips = np.array(l_flips).reshape(b, n_local, t).transpose(1, 0, 2).reshape(-1)
    jit = np.array(l_jit, dtype=np.float32).reshape(b, n_local, t, 4).transpose(1, 0, 2, 3).reshape(-1, 4)
    src = flat.unsqueeze(0).expand(n_local, -1, -1, -1, -1).reshape(n_local * b * t, c, res, res)
    local = color_jitter(_resample(src, _theta(boxes, flips), local_size), torch.from_numpy(jit))
    return global_views, local.reshape(n_local, b, t, c, local_size, local_size)


def _global_view(flat: torch.Tensor, index: Sequence[int], t: int, tag: int, *, seed: int, step: int,
                 cfg) -> torch.Tensor:
    """One global view (B * T, C, R, R) of the frames `flat` (B * T, C, R, R): per clip one random resized crop and
    flip (drawn from the stream `tag`), per frame colour jitter."""
    boxes, flips, jit = [], [], []
    for i in index:
        rng = _rng(seed, tag, step, int(i))
        boxes.append(_crop_box(rng, (float(cfg.global_crop_min), 1.0)))
        flips.append(rng.random() < float(cfg.flip))
        jit.append(_jitter_params(rng, t, float(cfg.color_jitter), float(cfg.grayscale)))
    theta = _theta(np.repeat(np.array(boxes, dtype=np.float32), t, axis=0), np.repeat(np.array(flips), t))
    return color_jitter(_resample(flat, theta, flat.shape[-1]), torch.from_numpy(np.concatenate(jit)))
