"""Structured config of the optimizer group (`sweeps/optimizer/*.yaml`). Plain data: no torch, no Ray."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class OptimizerConfig:
    """Which optimizer a run uses and its hyper-parameters.

    `name` is one of `adamw`, `sgd` (torch baselines), `orthogonal_adamw`, `orthogonal_sgd`, `slower_adamw`
    (built by `raystream.optim.build_optimizer`). The orthogonal fields are ignored by the others; `momentum` is
    used by the SGD pair only, `betas`/`eps` by the AdamW family. Presets: `sweeps/optimizer/*.yaml`, among them
    `orthogonal_adamw` (the paper's equations: global projection, c_0 = 0) and `orthogonal_adamw_official` (the
    authors' published code: projection=dim0, orth_init=first_grad).

    Weight decay: `weight_decay` applies to the decayed param group; with `no_decay_1d` biases, norm parameters
    (ndim <= 1) and ViT tokens / position embeddings get none (raystream/optim/groups.py). `weight_decay_end`
    None keeps it constant; a value makes it follow DINO's cosine from `weight_decay` to `weight_decay_end` over
    the run (raystream/train/schedule.py).
    """

    name: str = "orthogonal_adamw"
    lr: float = 1e-3
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.05
    weight_decay_end: Optional[float] = None  # None: constant; else cosine weight_decay -> weight_decay_end
    no_decay_1d: bool = True  # biases, norms (ndim <= 1), ViT tokens and pos embeddings: weight decay 0
    momentum: float = 0.0
    orth_beta: float = 0.9
    projection: str = "global"  # global | per_tensor | dim0
    orth_init: str = "zero"  # zero | first_grad
    warmup_steps: int = 10
    min_lr_ratio: float = 0.01  # cosine decays to lr * min_lr_ratio
    grad_clip: float = 0.0  # 0 disables clipping
