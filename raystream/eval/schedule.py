"""The probes' learning-rate schedule: a linear warm-up from 0, then a cosine decay to 0 (DINO's and V-JEPA's probes,
the paper's supplementary Tables 5 and 6)."""

from __future__ import annotations

import math

import torch


def warmup_cosine(opt: torch.optim.Optimizer, warmup_steps: int, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler stepped once per optimizer step: lr x (s + 1) / warmup for the first `warmup_steps` steps, then
    lr x (1 + cos(pi x progress)) / 2 over the rest."""
    warmup, total = int(warmup_steps), max(1, int(total_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)
