"""Warm-up then cosine, by step t (0-based), written once for training and for the probes:

- `warmup_cosine(t, warmup_steps, cosine_steps, end)`: (t + 1) / warmup_steps during the warm-up, so the first
  step already moves, then half a cosine from 1 down to `end` over `cosine_steps` steps, held there after;
- `WarmupCosine`: the training lr multiplier of the paper's tables, reaching `min_lr_ratio` at the run's last step;
- `CosineWeightDecay`: DINO's weight-decay schedule (no warm-up);
- `probe_lr_schedule`: the probes' LambdaLR (DINO's and V-JEPA's, supplementary Tables 5 and 6), decaying to 0;
- `Schedules.apply(optimizer, t)`: a run's lr (warm-up, then cosine to `lr * min_lr_ratio`) and, when
  `optimizer.weight_decay_end` is set, its weight decay (DINO's cosine from `weight_decay` to `weight_decay_end`,
  on the decayed param group), set on the optimizer before optimizer step t.

Every schedule is a pure function of t, so a run restored from a checkpoint continues it with no state of its own
(DoRA's teacher momentum likewise: `raystream.models.dora.teacher.cosine_momentum(t, ...)`). Math and torch only:
training and the probes (eval/) both import it.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch

# The keys of `Schedules.apply`'s result: the metric names a run logs them under (tracking.LR and .WD name the
# same strings; tests/train/test_schedule.py keeps them equal). Written here so this pure module imports nothing above it.
LR = "lr"
WD = "wd"


def half_cosine(progress: float, start: float, end: float) -> float:
    """start at progress 0, end at progress 1, along half a cosine."""
    return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_cosine(t: int, warmup_steps: int, cosine_steps: int, end: float) -> float:
    """Multiplier of the base lr at step t: (t + 1) / warmup_steps for t < warmup_steps, then a half cosine from 1
    to `end` over `cosine_steps` steps (1 throughout when `cosine_steps` <= 0), `end` after them."""
    if t < warmup_steps:
        return (t + 1) / warmup_steps
    progress = min(1.0, (t - warmup_steps) / cosine_steps) if cosine_steps > 0 else 0.0
    return half_cosine(progress, 1.0, end)


class WarmupCosine:
    """Multiplier of the base lr at optimizer step `t` of a run of `total_steps` steps.

    t < warmup: (t + 1) / warmup (the warm-up capped at the run's length); then a half cosine from 1 down to
    `min_lr_ratio`, reached at step `total_steps - 1`.
    """

    def __init__(self, total_steps: int, warmup_steps: int, min_lr_ratio: float):
        if total_steps < 1:
            raise ValueError(f"total_steps = {total_steps}: expected >= 1")
        self.total_steps = int(total_steps)
        self.warmup_steps = max(0, min(int(warmup_steps), self.total_steps))
        self.min_lr_ratio = float(min_lr_ratio)

    def __call__(self, t: int) -> float:
        return warmup_cosine(t, self.warmup_steps, self.total_steps - self.warmup_steps - 1, self.min_lr_ratio)


class CosineWeightDecay:
    """DINO's weight-decay schedule (`cosine_scheduler(weight_decay, weight_decay_end, ...)`, no warm-up): the weight
    decay of step t, `start` at t = 0 and `end` at the last step, `total_steps - 1` (DINO divides by the number of
    steps and so stops one step short of `end`; here both schedules reach their end value at the last step)."""

    def __init__(self, total_steps: int, start: float, end: float):
        if total_steps < 1:
            raise ValueError(f"total_steps = {total_steps}: expected >= 1")
        self.total_steps, self.start, self.end = int(total_steps), float(start), float(end)

    def __call__(self, t: int) -> float:
        span = self.total_steps - 1
        progress = min(1.0, max(0, t) / span) if span > 0 else 0.0
        return half_cosine(progress, self.start, self.end)


def probe_lr_schedule(opt: torch.optim.Optimizer, warmup_steps: int,
                      total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The probes' scheduler, stepped once per optimizer step: lr x (s + 1) / warmup for the first `warmup_steps`
    steps (not capped), then lr x (1 + cos(pi x progress)) / 2 over the remaining `total_steps - warmup_steps`
    (at least 1), reaching 0 one step after the last."""
    warmup, total = int(warmup_steps), max(1, int(total_steps))
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, warmup, max(1, total - warmup), 0.0))


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
        out = {LR: float(optimizer.param_groups[0]["lr"])}
        if self.weight_decay is not None:
            out[WD] = self.weight_decay(t)
            set_weight_decay(optimizer, out[WD])
        return out
