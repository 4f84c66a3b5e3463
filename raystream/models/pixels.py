"""Pixels in and out of the models: input normalisation, tubelet patchify/unpatchify, VideoMAE's patch target, and
the decoders that predict tubelet pixels (VideoMAE's and future prediction's).

Clips arrive as (B, T, C, H, W) in [0, 1] (float) or [0, 255] (uint8). Tokens are ordered (t', h', w'), the order
of the Conv3d patch embedding flattened, so patch i of `patchify` is token i of the encoder.

The decoders (`scenario.decoder`):
`transformer` (PixelDecoder), the light MAE-style decoder: it projects the encoder's tokens to its own width, adds
fixed sinusoidal positions, appends one learned mask token per position to predict (with that position's
sinusoid), runs a few transformer blocks, and maps each queried token to the pixels of its tubelet patch. VideoMAE
queries the masked tokens of the clip; future prediction queries every token of the frames that follow.

`linear` (LinearDecoder, future prediction only, the paper's Table 7): encoder token i, read from the input clip, is
mapped by one linear layer to the pixels of target token i, the tubelet at the same place in the target frames.
"""

from __future__ import annotations

from typing import Tuple, Union

import torch
from torch import nn

from raystream.models.config import ScenarioConfig
from raystream.models.scenario import seeded, weight_seed
from raystream.models.vit import Block, VisionTransformer, build_vit, init_weights, sinusoid_table

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


class PixelDecoder(nn.Module):
    def __init__(self, in_dim: int, dim: int, depth: int, num_heads: int, out_dim: int, mlp_ratio: float = 4.0):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"scenario.decoder_dim = {dim} is not divisible by scenario.decoder_heads = {num_heads}")
        self.dim = dim
        self.embed = nn.Linear(in_dim, dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.blocks = nn.ModuleList(Block(dim, num_heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, out_dim)
        init_weights(self)
        nn.init.trunc_normal_(self.mask_token, std=0.02)

    def forward(self, tokens: torch.Tensor, known: torch.Tensor, query: torch.Tensor, total: int) -> torch.Tensor:
        """Predict the patches at positions `query` from encoder `tokens` at positions `known`.

        tokens: (B, Nk, in_dim); known: (B, Nk) and query: (B, Nq) long positions in [0, total).
        Returns (B, Nq, out_dim).
        """
        b, nq = query.shape
        x = self.embed(tokens)
        pos = sinusoid_table(total, self.dim, x.device, x.dtype).expand(b, -1, -1)
        x = x + torch.gather(pos, 1, known.unsqueeze(-1).expand(-1, -1, self.dim))
        q = self.mask_token.to(x.dtype) + torch.gather(pos, 1, query.unsqueeze(-1).expand(-1, -1, self.dim))
        x = torch.cat([x, q.expand(b, -1, -1)], dim=1)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, -nq:]))


class LinearDecoder(nn.Module):
    """Target token i from encoder token i through one linear layer (no attention, no positions of its own)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.head = nn.Linear(in_dim, out_dim)
        init_weights(self)

    def forward(self, tokens: torch.Tensor, known: torch.Tensor, query: torch.Tensor, total: int) -> torch.Tensor:
        """The PixelDecoder call: predict the patches at positions `query` (B, Nq) from `tokens` (B, Nk, in_dim);
        needs Nq == Nk (token i answers query i)."""
        if query.shape[1] != tokens.shape[1]:
            raise ValueError(f"a linear decoder maps each of the {tokens.shape[1]} input tokens to one target token, "
                             f"but {query.shape[1]} target tokens were asked for (stream.target_frames must equal "
                             "stream.frames_per_clip)")
        return self.head(tokens)


Decoder = Union[PixelDecoder, LinearDecoder]


def build_decoder(scenario_cfg: ScenarioConfig, encoder: VisionTransformer, out_dim: int) -> Decoder:
    """The decoder `scenario.decoder` names. The transformer's width and heads default to half the encoder's
    (VideoMAE: 192/3 for ViT-S, 384/6 for ViT-B, 512/8 for ViT-L)."""
    if scenario_cfg.decoder == "linear":
        return LinearDecoder(encoder.embed_dim, out_dim)
    dim = scenario_cfg.decoder_dim or encoder.embed_dim // 2
    heads = scenario_cfg.decoder_heads or max(1, encoder.num_heads // 2)
    return PixelDecoder(encoder.embed_dim, int(dim), int(scenario_cfg.decoder_depth), int(heads), out_dim)


def build_encoder_decoder(scenario_cfg: ScenarioConfig, stream_cfg, seed: int) -> Tuple[VisionTransformer, Decoder]:
    """The seeded video encoder for the stream's clips and a decoder predicting tubelet pixels."""
    with seeded(weight_seed(scenario_cfg, seed)):
        encoder = build_vit(scenario_cfg.backbone, img_size=int(stream_cfg.resolution),
                            num_frames=int(stream_cfg.frames_per_clip))
        out_dim = encoder.tubelet_size * encoder.patch_size ** 2 * encoder.patch_embed.proj.in_channels
        return encoder, build_decoder(scenario_cfg, encoder, out_dim)
