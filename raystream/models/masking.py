"""VideoMAE tube masks, seeded so that the global gradient does not depend on the number of workers.

A tube mask is one random spatial mask (a fixed number of the h x w patch positions hidden) tiled over all t
temporal token positions. Each mask is a pure function of where it is used, never of a global RNG:

- `per_sample` (VideoMAE's default): sample i of global step s uses a mask from (seed, s, global index of i);
  a sample gets the same mask on whichever worker holds it.
- `per_batch`: every sample of step s shares the mask from (seed, s).
- `fixed`: one mask from (seed) for the whole run. Random masks add per-step gradient noise that hides the
  correlation between consecutive batches; `fixed` and `per_batch` keep a correlated stream in the paper's regime.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
import torch

from raystream.checks import options_text
from raystream.models.config import MASK_MODES

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
