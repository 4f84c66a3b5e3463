"""Structured config of the optimizer group (`sweeps/optimizer/*.yaml`). Plain data: no torch, no Ray."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, List, Optional

from raystream.checks import Check, one_of


@dataclass
class OptimizerConfig:
    """Which optimizer a run uses and its hyper-parameters.

    `name` is one of `adamw`, `sgd` (torch baselines), `orthogonal_adamw`, `orthogonal_sgd`, `slower_adamw`,
    `orthogonal_torch_adamw` (the `Orthogonal` wrapper around torch's own AdamW: the same update as
    `orthogonal_adamw`, by another path) (built by `raystream.optim.build_optimizer`). The orthogonal fields are ignored by the others; `momentum` is
    used by the SGD pair only, `betas`/`eps` by the AdamW family. Presets: `sweeps/optimizer/*.yaml`, among them
    `orthogonal_adamw` (the paper's equations: global projection, c_0 = 0) and `orthogonal_adamw_official` (the
    authors' published code: projection=dim0, orth_init=first_grad).

    Weight decay: `weight_decay` applies to the decayed param group; with `no_decay_1d` biases, norm parameters
    (ndim <= 1) and ViT tokens / position embeddings get none (raystream/optim/groups.py). `weight_decay_end`
    None keeps it constant; a value makes it follow DINO's cosine from `weight_decay` to `weight_decay_end` over
    the run (raystream/train/schedule.py).

    `compile` (orthogonal_adamw only) picks the step: `auto` (default) runs the torch.compile'd step (projection, EMA
    and AdamW fused, raystream/optim/compiled.py) for models of at least `compile_min_params` trainable fp32
    parameters on a CPU in runs of at least `compile_min_steps` steps, where it was measured faster once its
    compilation (about a minute at the run's second step) is paid back, and the eager multi-tensor step otherwise;
    `true` / `false` force one (true needs a C++ compiler on CPU or Triton on GPU, fp32 parameters and the global or
    per_tensor projection). The rule and its figures: docs/optimizers.md.
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
    compile: Any = "auto"  # orthogonal_adamw: true | false | auto (raystream/optim/factory.py: compile_choice)
    compile_min_params: int = 20_000_000  # compile=auto: the compiled step from this many trainable parameters
    compile_min_steps: int = 3000  # ... and for runs of at least this many steps (a shorter one pays no compile back)


# The options an `optimizer` key takes; `raystream.optim.build_optimizer` accepts exactly these names.
NAMES = ("adamw", "sgd", "orthogonal_adamw", "orthogonal_sgd", "slower_adamw", "orthogonal_torch_adamw")
PROJECTIONS = ("global", "per_tensor", "dim0")
ORTH_INITS = ("zero", "first_grad")
COMPILED_PROJECTIONS = ("global", "per_tensor")  # the projections Orthogonal-AdamW's compiled step implements

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
    Check("compile", lambda v: v is True or v is False or v == "auto", "true, false or auto"),
    Check("compile_min_params", lambda v: v >= 0, "a number of trainable parameters >= 0 (compile: auto)"),
    Check("compile_min_steps", lambda v: v >= 0, "a number of optimizer steps >= 0 (compile: auto)"),
    Check("", lambda s: s.compile is not True or (s.name == "orthogonal_adamw"
                                                  and s.projection in COMPILED_PROJECTIONS),
          "compile: true only with name: orthogonal_adamw and projection: global or per_tensor (the compiled step "
          "is Orthogonal-AdamW's)"),
]
