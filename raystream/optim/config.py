"""Structured config of the optimizer group (`sweeps/optimizer/*.yaml`). Plain data: no torch, no Ray."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional

from raystream.checks import Check, one_of


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

    `compile` (orthogonal_adamw only) runs projection, EMA and AdamW as one torch.compile'd step: on CPU
    1.75-1.85x the time of torch's fused AdamW instead of 3.4-3.6x (benchmarks/optimizer_step.py), for a compilation of
    about a minute at the run's second step (cached on disk afterwards). It needs a C++ compiler (CPU) or Triton (GPU),
    fp32 parameters and the global or per_tensor projection. Off by default: docs/optimizers.md says why.
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
    compile: bool = False  # orthogonal_adamw: the fused torch.compile'd step (raystream/optim/compiled.py)


# The options an `optimizer` key takes; `raystream.optim.build_optimizer` accepts exactly these names.
NAMES = ("adamw", "sgd", "orthogonal_adamw", "orthogonal_sgd", "slower_adamw")
PROJECTIONS = ("global", "per_tensor", "dim0")
ORTH_INITS = ("zero", "first_grad")

CHECKS = [
    one_of("name", NAMES),
    Check("lr", lambda v: math.isfinite(v) and v >= 0, "a finite learning rate >= 0"),
    Check("weight_decay", lambda v: v >= 0, "a weight decay >= 0"),
    Check("orth_beta", lambda v: 0 <= v < 1, "an EMA factor in [0, 1)"),
    one_of("projection", PROJECTIONS),
    one_of("orth_init", ORTH_INITS),
    Check("eps", lambda v: v >= 0, "an epsilon >= 0"),
    Check("momentum", lambda v: v >= 0, "a momentum >= 0"),
    Check("betas", lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "two Adam betas, each in [0, 1)"),
    Check("weight_decay_end", lambda v: v is None or v >= 0,
          "null (constant weight decay) or a final weight decay >= 0"),
    Check("warmup_steps", lambda v: v >= 0, "an integer >= 0 (steps)"),
    Check("min_lr_ratio", lambda v: 0 <= v <= 1, "a fraction of optimizer.lr in [0, 1]"),
    Check("grad_clip", lambda v: v >= 0, "a gradient-norm bound >= 0 (0 = no clipping)"),
    Check("no_decay_1d", lambda v: isinstance(v, bool), "true or false"),
    Check("compile", lambda v: isinstance(v, bool), "true or false"),
    Check("", lambda s: not s.compile or (s.name == "orthogonal_adamw" and s.projection in ("global", "per_tensor")),
          "compile: true only with name: orthogonal_adamw and projection: global or per_tensor (the compiled step "
          "is Orthogonal-AdamW's)"),
]
