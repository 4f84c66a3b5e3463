"""The views a probe sees of an image: DINO's evaluation transforms, on PIL images (image files) and on tensors
(clips already in memory).

- centre: resize the short side to `resize` px (bicubic), centre crop `crop` px (DINO's eval_knn / eval_linear val).
- augment: a random resized crop (scale 0.08-1, aspect 3/4-4/3, as torchvision's RandomResizedCrop) to `crop` px,
  flipped horizontally with probability 1/2 (DINO's eval_linear train transform).
"""

from __future__ import annotations

import math
from typing import Tuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image


def dino_sizes(resolution: int, resize: int, crop: int) -> Tuple[int, int]:
    """(resize, crop) px for a model of `resolution` px: DINO's 256 / 224 scaled so the crop is the model's size."""
    return int(round(resolution * resize / crop)), int(resolution)


def random_box(height: int, width: int, rng: np.random.Generator, scale=(0.08, 1.0),
               ratio=(3 / 4, 4 / 3)) -> Tuple[int, int, int, int]:
    """(top, left, h, w) of a random resized crop, as torchvision's RandomResizedCrop.get_params (10 tries, then
    the centre crop at the nearest allowed aspect)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def image_view(image, view: str, resize: int, crop: int, rng: np.random.Generator) -> np.ndarray:
    """A PIL image -> uint8 (3, crop, crop): its centre view, or (`view="augment"`) a random one."""
    image = image.convert("RGB")
    if view == "augment":
        top, left, h, w = random_box(image.height, image.width, rng)
        image = image.resize((crop, crop), Image.BILINEAR, box=(left, top, left + w, top + h))
        if rng.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
    else:
        scale = resize / min(image.width, image.height)
        image = image.resize((max(resize, round(image.width * scale)), max(resize, round(image.height * scale))),
                             Image.BICUBIC)
        left, top = (image.width - crop) // 2, (image.height - crop) // 2
        image = image.crop((left, top, left + crop, top + crop))
    return np.asarray(image, dtype=np.uint8).transpose(2, 0, 1)


def clip_view(clip: torch.Tensor, view: str, rng: np.random.Generator) -> torch.Tensor:
    """A clip (T, C, H, W) already at the model's size: itself, or (`view="augment"`) one random resized crop and
    flip for all its frames, resized back to H x W (bilinear)."""
    if view != "augment":
        return clip
    h, w = clip.shape[-2:]
    top, left, bh, bw = random_box(h, w, rng)
    out = F.interpolate(clip[..., top:top + bh, left:left + bw].float(), size=(h, w), mode="bilinear",
                        align_corners=False)
    return out.flip(-1) if rng.random() < 0.5 else out
