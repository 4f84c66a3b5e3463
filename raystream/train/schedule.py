"""The schedules of the paper's tables set on the optimizer, by optimizer step t (0-based):

- learning rate: linear warm-up, then cosine decay to `lr * min_lr_ratio` (`WarmupCosine`);
- weight decay (optional, `optimizer.weight_decay_end`): DINO's cosine from `weight_decay` to `weight_decay_end`
  (`CosineWeightDecay`), set on the decayed param group before every step (`set_weight_decay`).
`Schedules.apply(optimizer, t)` sets both before optimizer step t. The schedules themselves are raystream.schedule's
(shared with the probes); each is a pure function of t, so a run restored from a checkpoint continues it with no
state of its own (DoRA's teacher momentum likewise: `raystream.models.dora.teacher.cosine_momentum(t, ...)`).
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from raystream.schedule import CosineWeightDecay, WarmupCosine
from raystream.tracking import names

__all__ = ["CosineWeightDecay", "Schedules", "WarmupCosine", "build_weight_decay_schedule", "set_weight_decay"]


def build_weight_decay_schedule(optimizer_cfg, total_steps: int) -> Optional[CosineWeightDecay]:
    """`CosineWeightDecay(total_steps, optimizer.weight_decay, optimizer.weight_decay_end)`, or None when
    `optimizer.weight_decay_end` is unset (the weight decay stays constant)."""
    if optimizer_cfg.weight_decay_end is None:
        return None
    return CosineWeightDecay(total_steps, float(optimizer_cfg.weight_decay), float(optimizer_cfg.weight_decay_end))


def set_weight_decay(optimizer: torch.optim.Optimizer, value: float) -> None:
    """Set `value` on the decayed param groups (`decay` True or absent, as raystream.optim.param_groups marks
    them); groups with `decay` False keep their weight decay of 0."""
    for group in optimizer.param_groups:
        if group.get("decay", True):
            group["weight_decay"] = value


class Schedules:
    """The hyper-parameters of step t, set on the optimizer before its step: `apply(optimizer, t)`.

    Each param group's lr is its base lr (`initial_lr`, recorded once, as torch's `LambdaLR` does) times
    `WarmupCosine(t)`; the decayed groups' weight decay follows `CosineWeightDecay(t)` when scheduled. Both are pure
    functions of t: a restored run calls `apply` with its next step and needs no scheduler state.
    """

    def __init__(self, optimizer_cfg, total_steps: int):
        self.lr_factor = WarmupCosine(total_steps, int(optimizer_cfg.warmup_steps), float(optimizer_cfg.min_lr_ratio))
        self.weight_decay = build_weight_decay_schedule(optimizer_cfg, total_steps)  # None: constant

    def apply(self, optimizer: torch.optim.Optimizer, t: int) -> Dict[str, float]:
        """Set step t's lr (and weight decay); returns `{'lr': first group's lr}` (and `'wd'` when scheduled)."""
        factor = self.lr_factor(t)
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
            group["lr"] = group["initial_lr"] * factor
        out = {names.LR: float(optimizer.param_groups[0]["lr"])}
        if self.weight_decay is not None:
            out[names.WD] = self.weight_decay(t)
            set_weight_decay(optimizer, out[names.WD])
        return out
