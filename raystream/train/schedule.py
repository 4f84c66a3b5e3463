"""The learning-rate schedule of the paper's tables: linear warm-up, then cosine decay to `lr * min_lr_ratio`."""

from __future__ import annotations

import math

import torch


class WarmupCosine:
    """Multiplier of the base lr after `t` optimizer steps (a picklable `LambdaLR` lambda).

    t < warmup: (t + 1) / warmup, so the first step already moves; then a half cosine from 1 down to
    `min_lr_ratio`, reached at step `total_steps - 1`.
    """

    def __init__(self, total_steps: int, warmup_steps: int, min_lr_ratio: float):
        if total_steps < 1:
            raise ValueError(f"total_steps = {total_steps}: expected >= 1")
        self.total_steps = int(total_steps)
        self.warmup_steps = max(0, min(int(warmup_steps), self.total_steps))
        self.min_lr_ratio = float(min_lr_ratio)

    def __call__(self, t: int) -> float:
        if t < self.warmup_steps:
            return (t + 1) / self.warmup_steps
        span = self.total_steps - self.warmup_steps - 1
        progress = min(1.0, (t - self.warmup_steps) / span) if span > 0 else 0.0
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, optimizer_cfg, total_steps: int):
    """`LambdaLR` with `WarmupCosine(total_steps, optimizer.warmup_steps, optimizer.min_lr_ratio)`."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, WarmupCosine(total_steps, int(optimizer_cfg.warmup_steps), float(optimizer_cfg.min_lr_ratio)))
