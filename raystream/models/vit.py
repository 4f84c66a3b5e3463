"""The Vision Transformer backbone shared by every scenario, for image frames and for video tubelets.

Parameter names follow timm / DINO (`patch_embed.proj`, `cls_token`, `pos_embed`, `blocks.N.attn.qkv`, ...), so an
image ViT of this file loads a DINO/DoRA backbone state dict as is.

Two token layouts:
- image (`num_frames == 1` and `tubelet_size == 1`): input (B, C, H, W), a [CLS] token and learned positions
  (DINO), interpolated when the image size differs from `img_size` (DoRA's local crops);
- video (otherwise): input (B, T, C, H, W), tubelets of `tubelet_size` frames x `patch_size`^2 pixels embedded by a
  Conv3d. Positions (`pos_embed`): `sinusoid` (VideoMAE, the default): no [CLS], fixed 1-D sinusoidal positions over
  the flattened (t, h, w) token index; or `learned`: an image ViT's [CLS] token and learned 2-D positions, the same
  2-D table added to every time slice (what an ImageNet image checkpoint inflated to tubelets brings). Each time
  slice gets its own copy of the [CLS] token, so that a clip of identical frames is copies of the image's token set
  (attention over duplicated keys equals attention over one copy: the image model's patch tokens come out exactly);
  the [CLS] copies take part in attention and are left out of the output tokens.

Attention biases (`qkv_bias`): `qkv` (timm/DINO: one bias over q, k and v) or `qv` (VideoMAE: `q_bias` and `v_bias`,
no k bias). A k bias adds the same q.b_k to every key's score, so softmax ignores it: both layouts compute the same
function and a checkpoint converts exactly either way.

Positions at a grid other than the trained one (DoRA's local crops, a checkpoint of another resolution) follow DINO's
`interpolate_pos_encoding` (`dino_interpolate`).

`forward(x, mask=None)` returns the normalised tokens; with `mask` (B, N) bool, True = masked, the encoder runs on the
visible tokens only (every sample must keep the same number). `features(x)` is the pooled vector the probes read.

`compile_blocks(model)` (`trainer.compile`) compiles a model regionally: one compiled block's code for every block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from raystream.checks import options_text
from raystream.models.config import BACKBONE_PRESETS, POS_EMBEDS, QKV_BIASES, BackboneConfig


@dataclass(frozen=True)
class ViTShape:
    patch_size: int
    embed_dim: int
    depth: int
    num_heads: int
    mlp_ratio: float = 4.0


# One shape per name of BACKBONE_PRESETS (raystream/models/config.py): tiny is the CPU preset of tests and the
# demo; small/base/large are ViT-S/16, ViT-B/16, ViT-L/16.
PRESETS: Dict[str, ViTShape] = {
    "tiny": ViTShape(patch_size=8, embed_dim=96, depth=3, num_heads=3),
    "small": ViTShape(patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "base": ViTShape(patch_size=16, embed_dim=768, depth=12, num_heads=12),
    "large": ViTShape(patch_size=16, embed_dim=1024, depth=24, num_heads=16),
}


def preset_shape(backbone_cfg: BackboneConfig) -> ViTShape:
    """The preset named by `backbone_cfg.preset` with any of patch_size/embed_dim/depth/num_heads overridden."""
    name = backbone_cfg.preset
    if name not in BACKBONE_PRESETS:
        raise ValueError(f"scenario.backbone.preset = {name!r}: expected one of {options_text(BACKBONE_PRESETS)}")
    base = PRESETS[name]
    shape = ViTShape(patch_size=backbone_cfg.patch_size or base.patch_size,
                     embed_dim=backbone_cfg.embed_dim or base.embed_dim, depth=backbone_cfg.depth or base.depth,
                     num_heads=backbone_cfg.num_heads or base.num_heads, mlp_ratio=base.mlp_ratio)
    if shape.embed_dim % shape.num_heads != 0:
        raise ValueError(f"scenario.backbone.embed_dim = {shape.embed_dim} is not divisible by "
                         f"scenario.backbone.num_heads = {shape.num_heads}")
    return shape


def sinusoid_table(n: int, dim: int, device: Any = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """VideoMAE's fixed 1-D sinusoidal position table, (1, n, dim): sin on even channels, cos on odd ones."""
    pos = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    i = torch.arange(dim, dtype=torch.float64).unsqueeze(0)
    angle = pos / torch.pow(10000.0, 2 * torch.div(i, 2, rounding_mode="floor") / dim)
    table = torch.where(i.long() % 2 == 0, torch.sin(angle), torch.cos(angle))
    return table.to(device=device, dtype=dtype, non_blocking=True).unsqueeze(0)  # made on the host: no GPU wait


def dino_interpolate(pos_embed: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """DINO's `interpolate_pos_encoding` (facebookresearch/dino, vision_transformer.py), which DoRA's code uses:
    the [CLS] position kept, the square grid of patch positions resized bicubically by the scale factors
    ((rows + 0.1) / sqrt(N), (cols + 0.1) / sqrt(N)) (the 0.1 avoids a floating-point off-by-one, DINO issue 8).
    Unchanged when the grid already has N positions and is square, as in DINO."""
    n0 = pos_embed.shape[1] - 1
    if rows * cols == n0 and rows == cols:
        return pos_embed
    side, dim = math.sqrt(n0), pos_embed.shape[-1]
    patch_pos = pos_embed[:, 1:].reshape(1, int(side), int(side), dim).permute(0, 3, 1, 2)
    patch_pos = F.interpolate(patch_pos, scale_factor=((rows + 0.1) / side, (cols + 0.1) / side), mode="bicubic")
    if patch_pos.shape[-2:] != (rows, cols):
        raise ValueError(f"position interpolation gave a {tuple(patch_pos.shape[-2:])} grid, expected {(rows, cols)}")
    return torch.cat([pos_embed[:, :1], patch_pos.permute(0, 2, 3, 1).reshape(1, -1, dim)], dim=1)


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int, qkv_bias: str = "qkv"):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias == "qkv")
        if qkv_bias == "qv":  # VideoMAE's layout: the k bias is left out (softmax would ignore it)
            self.q_bias = nn.Parameter(torch.zeros(dim))
            self.v_bias = nn.Parameter(torch.zeros(dim))
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        if self.qkv.bias is None:
            bias = torch.cat([self.q_bias, torch.zeros_like(self.v_bias), self.v_bias])
            qkv = F.linear(x, self.qkv.weight, bias)
        else:
            qkv = self.qkv(x)
        q, k, v = qkv.reshape(b, n, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(b, n, d))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block (timm naming)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: str = "qkv"):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    """Non-overlapping patches (image, Conv2d) or tubelets (video, Conv3d) projected to `embed_dim`."""

    def __init__(self, patch_size: int, tubelet_size: int, in_chans: int, embed_dim: int, video: bool):
        super().__init__()
        self.video = video
        if video:
            self.proj = nn.Conv3d(in_chans, embed_dim, (tubelet_size, patch_size, patch_size),
                                  stride=(tubelet_size, patch_size, patch_size))
        else:
            self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, ...]]:
        if self.video:
            x = self.proj(x.transpose(1, 2))  # (B, T, C, H, W) -> (B, D, T', H', W')
        else:
            x = self.proj(x)  # (B, D, H', W')
        grid = tuple(x.shape[2:])
        return x.flatten(2).transpose(1, 2), grid


class VisionTransformer(nn.Module):
    """A ViT encoder over images or videos; see the module docstring for the two layouts."""

    def __init__(self, *, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768,
                 depth: int = 12, num_heads: int = 12, mlp_ratio: float = 4.0, num_frames: int = 1,
                 tubelet_size: int = 1, pos_embed: str = "sinusoid", qkv_bias: str = "qkv"):
        super().__init__()
        self.video = num_frames > 1 or tubelet_size > 1
        if pos_embed not in POS_EMBEDS or qkv_bias not in QKV_BIASES:
            raise ValueError(f"pos_embed = {pos_embed!r}, qkv_bias = {qkv_bias!r}: expected one of "
                             f"{options_text(POS_EMBEDS)} and one of {options_text(QKV_BIASES)}")
        if img_size % patch_size:
            raise ValueError(f"image size {img_size} is not divisible by the patch size {patch_size}")
        if self.video and num_frames % tubelet_size:
            raise ValueError(f"{num_frames} frames are not divisible by the tubelet size {tubelet_size}")
        self.img_size, self.patch_size, self.tubelet_size = img_size, patch_size, tubelet_size
        self.num_frames, self.embed_dim, self.num_heads = num_frames, embed_dim, num_heads
        self.patch_embed = PatchEmbed(patch_size, tubelet_size, in_chans, embed_dim, self.video)
        grid = img_size // patch_size
        self.learned = not self.video or pos_embed == "learned"
        if self.learned:  # [CLS] and a learned 2-D table (one per time slice for video)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
            self.pos_embed = nn.Parameter(torch.zeros(1, 1 + grid * grid, embed_dim))
        else:
            self.cls_token = None
            self.pos_embed = None  # fixed sinusoid, computed for the input's token count
        self.blocks = nn.ModuleList(Block(embed_dim, num_heads, mlp_ratio, qkv_bias) for _ in range(depth))
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        init_weights(self)
        if self.learned:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
            nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def num_tokens(self, frames: int, height: int, width: int) -> int:
        """Patch/tubelet tokens of an input (no [CLS])."""
        t = frames // self.tubelet_size if self.video else 1
        return t * (height // self.patch_size) * (width // self.patch_size)

    def prepare_tokens(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None,
                       keep: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Embedded tokens with positions (and [CLS] with learned positions); masked tokens (mask True) removed, or
        only the tokens at `keep` (B, N_visible) kept, in that order: the same tokens without the device sync a
        boolean mask costs (its count is read back to shape the result)."""
        tokens, grid = self.patch_embed(x)
        b, n, d = tokens.shape
        if self.learned:  # DINO's positions, interpolated off the trained grid; repeated over time slices
            pos = dino_interpolate(self.pos_embed, *grid[-2:]).to(tokens.dtype)
            tokens = tokens + pos[:, 1:].repeat(1, n // (pos.shape[1] - 1), 1)
        else:
            tokens = tokens + sinusoid_table(n, d, tokens.device, tokens.dtype)
        if keep is not None:
            tokens = tokens.gather(1, keep.unsqueeze(-1).expand(-1, -1, d))
        elif mask is not None:
            if mask.shape != (b, n):
                raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {(b, n)} (batch, tokens)")
            tokens = tokens[~mask].reshape(b, -1, d)
        if self.learned:  # one [CLS] for an image, one per time slice for video
            cls = (self.cls_token + pos[:, :1]).expand(b, self.cls_copies(grid), -1)
            tokens = torch.cat([cls, tokens], dim=1)
        return tokens

    def cls_copies(self, grid: Tuple[int, ...]) -> int:
        """[CLS] tokens in the sequence of an input with this token grid: 1 (image), T' (video, learned), 0."""
        return (grid[0] if self.video else 1) if self.learned else 0

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None,
                keep: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Normalised output tokens, (B, [1 +] N_visible, D): [CLS] first for images, never for video."""
        tokens = self.prepare_tokens(x, mask, keep)
        for block in self.blocks:
            tokens = block(tokens)
        tokens = self.norm(tokens)
        if self.video and self.learned:
            tokens = tokens[:, x.shape[1] // self.tubelet_size:]
        return tokens

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        """The feature vector of a clip/image: [CLS] output for images, mean of the tokens for video."""
        return tokens.mean(dim=1) if self.video else tokens[:, 0]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self(x))


def init_weights(module: nn.Module) -> None:
    """MAE/VideoMAE initialisation: xavier-uniform linear and patch projections, zero biases, unit LayerNorms."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.Conv2d, nn.Conv3d)):
            nn.init.xavier_uniform_(m.weight.view(m.weight.shape[0], -1))
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def build_vit(backbone_cfg: BackboneConfig, *, img_size: int, num_frames: int) -> VisionTransformer:
    """The backbone named by `scenario.backbone` for inputs of `num_frames` x `img_size`^2 pixels."""
    shape = preset_shape(backbone_cfg)
    tubelet = int(backbone_cfg.tubelet_size)
    if img_size % shape.patch_size:
        raise ValueError(f"stream.resolution = {img_size} is not divisible by the patch size {shape.patch_size} "
                         f"(scenario.backbone.patch_size / preset {backbone_cfg.preset!r})")
    if tubelet > 1 and num_frames % tubelet:
        raise ValueError(f"{num_frames} frames per clip are not divisible by scenario.backbone.tubelet_size = "
                         f"{tubelet}")
    return VisionTransformer(img_size=img_size, patch_size=shape.patch_size, in_chans=int(backbone_cfg.in_chans),
                             embed_dim=shape.embed_dim, depth=shape.depth, num_heads=shape.num_heads,
                             mlp_ratio=shape.mlp_ratio, num_frames=num_frames, tubelet_size=tubelet,
                             pos_embed=str(backbone_cfg.pos_embed), qkv_bias=str(backbone_cfg.qkv_bias))


COMPILE_SETTINGS = "true, false or auto"  # what `trainer.compile` accepts


def compile_wanted(setting: Any, device: torch.device) -> bool:
    """`trainer.compile` on `device`: true, false, or auto (on CUDA only: on a CPU the compiled blocks were not
    measured faster, and compiling costs about a minute on a 2-core machine). Raises ValueError for another value."""
    if setting is True or setting is False:
        return setting
    if setting != "auto":
        raise ValueError(f"trainer.compile = {setting!r}: expected {COMPILE_SETTINGS}")
    return torch.device(device).type == "cuda"


def blocks_of(model: nn.Module) -> List[Block]:
    """The transformer blocks of every ViT (encoder, predictor, teacher) in `model`, in module order."""
    return [m for m in model.modules() if isinstance(m, Block)]


def compile_blocks(model: nn.Module, compiled: bool = True) -> int:
    """Regional compilation of `model`'s forward (and so its backward): every transformer `Block` in it is compiled
    in place (`nn.Module.compile`, torch.compile of its call), the rest stays eager. The blocks share one code
    object, so dynamo traces and inductor compiles one block's graph and every block of the same shapes reuses it
    (torch's regional compilation recipe): compiling a ViT-L takes what one of its 24 blocks takes. In place, so the
    parameters' names (checkpoints, DDP, the optimizer's groups) do not change. `compiled=False` puts the blocks back
    to eager. Returns the number of blocks."""
    blocks = blocks_of(model)
    for block in blocks:
        if compiled:
            block.compile()
        else:
            block._compiled_call_impl = None  # what nn.Module.compile set: the module's own call again
    return len(blocks)
