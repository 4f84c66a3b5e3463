"""DoRA's multi-object discovery and tracking on the teacher (no gradients), after the official `utils.MOT`.

1. `teacher_forward`: the teacher ViT (raystream/models/vit.py, image layout) on every frame; besides the output
   tokens it returns, from the LAST block, the [CLS]->patch attention of every head and the patch queries and keys
   (heads concatenated), which the ViT itself does not expose.
2. `discover_objects` (first frame of each clip): K prototypes = the [CLS] attention maps of K chosen heads
   weighting the patch queries; Sinkhorn-Knopp (epsilon 0.05, 30 iterations) balances the assignment of the
   frame's L2-normalised output patch features to them; the refined prototypes are the assignment-weighted sums
   of those features.
3. `track_masks` (every frame): each prototype attends to the frame's patch keys (softmax, scale D^-1/2); the map
   is thresholded at its mean, giving one patch mask per object and frame.
4. `mask_clips`: each object gives one masked copy of the clip (pixels outside its patches set to 0 in the
   normalised input, i.e. the mean colour, as the official code multiplies the normalised frames).

The official code thresholds at the mean over the whole batch; here each map uses its own mean (a softmax map's
mean is 1/N, so this is "attention above uniform"). A map with nothing above its mean (a uniform map) keeps
every patch instead of blanking the frame.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F

from raystream.models.dora.sinkhorn import sinkhorn_knopp
from raystream.models.vit import VisionTransformer


class TeacherOutput(NamedTuple):
    tokens: torch.Tensor  # (B, 1 + N, D) normalised output tokens ([CLS] first)
    cls_attn: torch.Tensor  # (B, heads, N) last block's [CLS] -> patch attention
    query: torch.Tensor  # (B, N, D) last block's patch queries, heads concatenated
    key: torch.Tensor  # (B, N, D) last block's patch keys


def teacher_forward(vit: VisionTransformer, images: torch.Tensor) -> TeacherOutput:
    """Run the image ViT on (B, C, H, W) and expose the last block's attention, queries and keys."""
    if vit.video:
        raise ValueError("DoRA needs an image ViT (one [CLS] per frame): set scenario.backbone.tubelet_size=1")
    x = vit.prepare_tokens(images)
    for block in vit.blocks[:-1]:
        x = block(x)
    last = vit.blocks[-1]
    b, n, d = x.shape
    heads = last.attn.num_heads
    qkv = last.attn.qkv(last.norm1(x)).reshape(b, n, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
    q, k = qkv[0], qkv[1]  # (B, heads, 1 + N, d_head)
    scale = (d // heads) ** -0.5
    cls_attn = torch.softmax((q[:, :, :1].float() @ k.float().transpose(-2, -1)) * scale, dim=-1)[:, :, 0, 1:]
    x = vit.norm(last(x))  # the block as the ViT defines it (recomputes its attention)
    query = q[:, :, 1:].transpose(1, 2).reshape(b, n - 1, d)
    key = k[:, :, 1:].transpose(1, 2).reshape(b, n - 1, d)
    return TeacherOutput(x, cls_attn, query, key)


def discover_objects(cls_attn: torch.Tensor, query: torch.Tensor, patch_features: torch.Tensor,
                     heads: Sequence[int], *, epsilon: float = 0.05, iterations: int = 30) -> torch.Tensor:
    """Refined object prototypes (B, K, D), K = len(heads), from the first frame's teacher outputs.

    cls_attn (B, H, N), query (B, N, D), patch_features (B, N, D) (the teacher's output patch tokens).
    """
    # one view per head, stacked: indexing by a list would copy the list to the GPU and wait for it every step
    maps = torch.stack([cls_attn[:, h] for h in heads], dim=1).float()  # (B, K, N)
    prototypes = torch.einsum("bkn,bnd->bkd", maps, query.float())
    features = F.normalize(patch_features.float(), dim=-1)
    assignment = sinkhorn_knopp(features @ prototypes.transpose(-2, -1), epsilon, iterations)  # (B, N, K)
    return assignment.transpose(-2, -1) @ features


def track_masks(prototypes: torch.Tensor, keys: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """Patch masks (B, K, T, h, w) bool, True = the object's patches, from prototypes (B, K, D) and every frame's
    patch keys (B, T, N, D), N = h * w."""
    b, k, d = prototypes.shape
    t, n = keys.shape[1], keys.shape[2]
    h, w = grid
    if h * w != n:
        raise ValueError(f"patch grid {tuple(grid)} does not hold {n} patches")
    logits = torch.einsum("bkd,btnd->bktn", prototypes.float(), keys.float()) * d ** -0.5
    attn = torch.softmax(logits, dim=-1)
    masks = attn > attn.mean(dim=-1, keepdim=True)
    masks = masks | ~masks.any(dim=-1, keepdim=True)  # a uniform map keeps the whole frame
    return masks.reshape(b, k, t, h, w)


def mask_clips(frames: torch.Tensor, masks: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(K, B, T, C, H, W): `frames` (B, T, C, H, W) times each object's patch mask (B, K, T, h, w) upsampled to
    pixels (nearest)."""
    pixel = masks.repeat_interleave(patch_size, dim=-2).repeat_interleave(patch_size, dim=-1)  # (B, K, T, H, W)
    pixel = pixel.permute(1, 0, 2, 3, 4).unsqueeze(3).to(frames.dtype)  # (K, B, T, 1, H, W)
    return frames.unsqueeze(0) * pixel
