"""VideoMAE (Tong et al. 2022) as the paper's section 4.2 scenario: masked tube reconstruction on video clips.

Tubelet tokens (2 frames x patch^2) with fixed sinusoidal positions; tube masking at ratio 0.9 (the per_sample /
per_batch / fixed modes and their seeding: below, `tube_masks`); the encoder sees the visible tokens only; a light
decoder predicts the pixels of the masked tokens; the target is each tubelet patch normalised by its own mean and
std; the loss is the MSE on masked tokens. Probes read the mean of the encoder's tokens on the unmasked clip.

Tube masks are seeded so that the global gradient does not depend on the number of workers. A tube mask is one
random spatial mask (a fixed number of the h x w patch positions hidden) tiled over all t temporal token
positions. Each mask is a pure function of where it is used, never of a global RNG:

- `per_sample` (VideoMAE's default): sample i of global step s uses a mask from (seed, s, global index of i);
  a sample gets the same mask on whichever worker holds it.
- `per_batch`: every sample of step s shares the mask from (seed, s).
- `fixed`: one mask from (seed) for the whole run. Random masks add per-step gradient noise that hides the
  correlation between consecutive batches; `fixed` and `per_batch` keep a correlated stream in the paper's regime.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from raystream.checks import options_text
from raystream.models.checkpoint import initialise
from raystream.models.config import MASK_MODES, ScenarioConfig, decoder_error
from raystream.models.pixels import PixelDecoder, as_float, build_encoder_decoder, normalize_input, patch_target
from raystream.models.scenario import Scenario, register_scenario
from raystream.models.vit import VisionTransformer

_TAG = {"per_sample": 1, "per_batch": 2, "fixed": 3}


def num_masked_per_frame(spatial: int, ratio: float) -> int:
    """Patch positions hidden per temporal slice: int(ratio * h * w), as VideoMAE's TubeMaskingGenerator."""
    return int(ratio * spatial)


def _spatial_mask(spatial: int, masked: int, entropy: Sequence[int]) -> np.ndarray:
    rng = np.random.default_rng([int(e) for e in entropy])
    mask = np.zeros(spatial, dtype=bool)
    mask[rng.permutation(spatial)[:masked]] = True
    return mask


def tube_masks(grid: Tuple[int, int, int], ratio: float, mode: str, *, seed: int, step: int,
               index: torch.Tensor | Sequence[int]) -> torch.Tensor:
    """Boolean masks (B, t*h*w), True = masked, for the samples at global positions `index` of global step `step`.

    `grid` is the token grid (t, h, w). Every row hides the same number of tokens, so the encoder can drop them by
    reshaping.
    """
    if mode not in MASK_MODES:
        raise ValueError(f"scenario.mask.mode = {mode!r}: expected one of {options_text(MASK_MODES)}")
    if not 0 < ratio < 1:
        raise ValueError(f"scenario.mask.ratio = {ratio!r}: expected a ratio in (0, 1)")
    t, h, w = grid
    spatial = h * w
    masked = num_masked_per_frame(spatial, ratio)
    if masked == 0 or masked == spatial:
        raise ValueError(f"scenario.mask.ratio = {ratio} hides {masked} of {spatial} patch positions per frame: "
                         "expected at least one hidden and one visible")
    index = [int(i) for i in (index.tolist() if isinstance(index, torch.Tensor) else index)]
    if mode == "per_sample":
        rows = [_spatial_mask(spatial, masked, (seed, _TAG[mode], step, i)) for i in index]
    else:
        entropy = (seed, _TAG[mode], step) if mode == "per_batch" else (seed, _TAG[mode])
        rows = [_spatial_mask(spatial, masked, entropy)] * len(index)
    spatial_masks = torch.from_numpy(np.stack(rows))  # (B, h*w)
    return spatial_masks.unsqueeze(1).expand(-1, t, -1).reshape(len(index), t * spatial)


def batch_index(batch: Dict[str, Any], size: int) -> torch.Tensor:
    """The global positions of a batch's samples (`index`), 0..size-1 when the batch does not say."""
    index = batch.get("index")
    return torch.arange(size) if index is None else torch.as_tensor(index)


def visible_and_hidden(mask: torch.Tensor, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """(visible, hidden) token positions (B, N_visible), (B, N_hidden), each in position order, of host masks (B, N)
    that hide as many tokens in every row; copied to `device` without waiting for it (a boolean mask on the device
    would read its count back: a host sync in every step)."""
    per_clip = mask.numpy().sum(axis=1)  # host arithmetic, in numpy: no tensor read
    hidden = int(per_clip[0])
    if (per_clip != hidden).any():
        raise ValueError(f"tube masks hide {per_clip.tolist()} tokens per clip: expected as many in every clip")
    order = torch.argsort(mask.to(torch.uint8), dim=1, stable=True)  # visible first, then hidden
    order = order.to(device, non_blocking=True)
    return order[:, : mask.shape[1] - hidden], order[:, mask.shape[1] - hidden:]


class VideoMAE(nn.Module):
    """forward(batch_dict) -> {'loss'}; encode(clips) -> (pooled features, tokens) without masking."""

    def __init__(self, encoder: VisionTransformer, decoder: PixelDecoder, *, mask_ratio: float = 0.9,
                 mask_mode: str = "per_sample", norm_pix_loss: bool = True, seed: int = 0):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder
        self.mask_ratio, self.mask_mode, self.norm_pix_loss, self.seed = mask_ratio, mask_mode, norm_pix_loss, seed

    def masks(self, frames: torch.Tensor, step: int, index: torch.Tensor) -> torch.Tensor:
        """(B, N) bool tube masks on the host, True = masked, seeded from (seed, step, index)."""
        _, t, _, h, w = frames.shape
        p, tub = self.encoder.patch_size, self.encoder.tubelet_size
        grid = (t // tub, h // p, w // p)
        return tube_masks(grid, self.mask_ratio, self.mask_mode, seed=self.seed, step=step, index=index)

    def forward(self, batch: Dict[str, Any]) -> Dict[str, torch.Tensor]:
        frames = as_float(batch["frames"])
        b = frames.shape[0]
        visible, hidden = visible_and_hidden(self.masks(frames, int(batch.get("step", 0) or 0),
                                                        batch_index(batch, b)), frames.device)
        tokens = self.encoder(normalize_input(frames), keep=visible)
        pred = self.decoder(tokens, visible, hidden, visible.shape[1] + hidden.shape[1])
        target = patch_target(frames, self.encoder.patch_size, self.encoder.tubelet_size, self.norm_pix_loss)
        target = target.gather(1, hidden.unsqueeze(-1).expand(-1, -1, target.shape[-1]))
        return {"loss": F.mse_loss(pred.float(), target)}

    def encode(self, clips: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        tokens = self.encoder(normalize_input(as_float(clips)))
        return self.encoder.pool(tokens), tokens


class VideoMAEScenario(Scenario):
    name = "videomae"
    needs = frozenset({"probe"})


@register_scenario("videomae")
def build_videomae(scenario_cfg: ScenarioConfig, stream_cfg: Any, seed: int = 0) -> VideoMAEScenario:
    """A VideoMAE for clips of `stream.frames_per_clip` frames at `stream.resolution` pixels."""
    problem = decoder_error(scenario_cfg, stream_cfg)
    if problem:
        raise ValueError(problem)
    frames, res = int(stream_cfg.frames_per_clip), int(stream_cfg.resolution)
    encoder, decoder = build_encoder_decoder(scenario_cfg, stream_cfg, seed)
    model = VideoMAE(encoder, decoder, mask_ratio=float(scenario_cfg.mask.ratio), mask_mode=str(scenario_cfg.mask.mode),
                     norm_pix_loss=bool(scenario_cfg.norm_pix_loss), seed=seed)
    model.masks(torch.empty(1, frames, 1, res, res, device="meta"), 0, [0])  # fail early on a bad mask
    loaded = initialise(model, scenario_cfg.backbone.init, init_from=str(scenario_cfg.backbone.init_from))
    return VideoMAEScenario(model, seed, init_line=loaded.line if loaded else None)
