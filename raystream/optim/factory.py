"""The optimizer a run config names: `OptimizerConfig` (the structured config of the optimizer group,
`sweeps/optimizer/*.yaml`, with its `CHECKS`), `param_groups` (a model's parameters as the two param groups DINO and
VideoMAE train with), `compile_choice` (`optimizer.compile: auto`) and `build_optimizer`.

`build_optimizer` returns the torch baselines as torch builds them, so comparisons are against stock torch; only the
optimizers of this package have a `diagnostics()` method. `compile_choice` resolves `optimizer.compile: auto` for
Orthogonal-AdamW: the compiled step where it was measured faster and pays its compilation back (docs/optimizers.md:
at least `compile_min_params` trainable fp32 parameters on a CPU, in a run of at least `compile_min_steps` steps),
the eager step otherwise (on CUDA the fused Triton step); a compiled choice is printed once per process, with its
reason.

Weight decay pulls weights towards 0; for biases, norm scales/shifts (any tensor with ndim <= 1) and the ViT's
learned tokens and position embeddings (`cls_token`, `mask_token`, `pos_embed`, ...) that only distorts them, so
DINO (`utils.get_params_groups`) and VideoMAE (`no_weight_decay()` + `skip_list`) put them in a group with weight
decay 0 (`param_groups`; `optimizer.no_decay_1d=false` keeps every parameter in one decayed group). The groups carry
`decay` (True / False) so that a weight-decay schedule moves the decayed group only. The orthogonal optimizers
project over ALL groups together when `projection="global"`, so splitting the parameters changes the weight decay,
never the projection.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from raystream.checks import Check, one_of
from raystream.optim.orthogonal_adamw import COMPILED_PROJECTIONS, OrthogonalAdamW
from raystream.optim.orthogonal_sgd import OrthogonalSGD
from raystream.optim.projection import ORTH_INITS, PROJECTIONS
from raystream.optim.slower_adamw import SlowerAdamW
from raystream.optim.triton_step import PROJECTIONS as TRITON_PROJECTIONS
from raystream.optim.wrapper import Orthogonal


@dataclass
class OptimizerConfig:
    """Which optimizer a run uses and its hyper-parameters.

    `name` is one of `adamw`, `sgd` (torch baselines), `orthogonal_adamw`, `orthogonal_sgd`, `slower_adamw`,
    `orthogonal_torch_adamw` (the `Orthogonal` wrapper around torch's own AdamW: the same update as
    `orthogonal_adamw`, by another path) (built by `build_optimizer`). The orthogonal fields are ignored by the
    others; `momentum` is used by the SGD pair only, `betas`/`eps` by the AdamW family. Presets:
    `sweeps/optimizer/*.yaml`, among them `orthogonal_adamw` (the paper's equations: global projection, c_0 = 0)
    and `orthogonal_adamw_official` (the authors' published code: projection=dim0, orth_init=first_grad).

    Weight decay: `weight_decay` applies to the decayed param group; with `no_decay_1d` biases, norm parameters
    (ndim <= 1) and ViT tokens / position embeddings get none (`param_groups`). `weight_decay_end`
    None keeps it constant; a value makes it follow DINO's cosine from `weight_decay` to `weight_decay_end` over
    the run (raystream/schedule.py).

    `compile` (orthogonal_adamw only) picks the step: `auto` (default) runs the torch.compile'd step (projection, EMA
    and AdamW fused, orthogonal_adamw.py) for models of at least `compile_min_params` trainable fp32
    parameters on a CPU in runs of at least `compile_min_steps` steps, where it was measured faster once its
    compilation (about a minute at the run's second step) is paid back, and the eager step otherwise (on CUDA the
    fused Triton step, raystream/optim/triton_step.py; elsewhere the multi-tensor step);
    `true` / `false` force one (true needs a C++ compiler on CPU or Triton on GPU, fp32 parameters and the global or
    per_tensor projection). The rule and its figures: docs/optimizers.md.

    `triton` (orthogonal_adamw only) picks the eager step on CUDA: `auto` (default) the fused Triton step where it
    runs (raystream/optim/triton_step.py `why_not`), falling back once to the multi-tensor step if a kernel cannot
    be built; `false` the multi-tensor step (to compare the two, or to step around a Triton fault); `true` the
    fused step or an error at the optimizer's construction saying why it cannot run (a CPU run, a dim0
    projection, fp64 parameters).
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
    compile: Any = "auto"  # orthogonal_adamw: true | false | auto (`compile_choice`)
    compile_min_params: int = 20_000_000  # compile=auto: the compiled step from this many trainable parameters
    compile_min_steps: int = 3000  # ... and for runs of at least this many steps (a shorter one pays no compile back)
    triton: Any = "auto"  # orthogonal_adamw on CUDA: auto (the fused Triton step where it runs) | true | false


# The options an `optimizer` key takes; `raystream.optim.build_optimizer` accepts exactly these names.
NAMES = ("adamw", "sgd", "orthogonal_adamw", "orthogonal_sgd", "slower_adamw", "orthogonal_torch_adamw")

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
    Check("triton", lambda v: v is True or v is False or v == "auto",
          "true, false or auto (orthogonal_adamw's fused Triton step on CUDA)"),
    Check("", lambda s: s.compile is not True or (s.name == "orthogonal_adamw"
                                                  and s.projection in COMPILED_PROJECTIONS),
          "compile: true only with name: orthogonal_adamw and projection: global or per_tensor (the compiled step "
          "is Orthogonal-AdamW's)"),
    Check("", lambda s: s.triton is not True or (s.name == "orthogonal_adamw" and s.compile is not True
                                                 and s.projection in TRITON_PROJECTIONS),
          "triton: true only with name: orthogonal_adamw, compile: false or auto and projection: global or "
          "per_tensor (the fused Triton step is Orthogonal-AdamW's eager step on CUDA)"),
]


TOKEN_SUFFIX = "token"  # cls_token, mask_token, dist_token, reg_token
POS_EMBED_PREFIX = "pos_embed"


def decays(name: str, param: Tensor) -> bool:
    """Whether parameter `name` (as in `named_parameters()`) gets weight decay under the DINO/VideoMAE rule."""
    leaf = name.rsplit(".", 1)[-1]
    return not (param.ndim <= 1 or leaf.endswith(TOKEN_SUFFIX) or leaf.startswith(POS_EMBED_PREFIX))


def param_groups(model: nn.Module, cfg: OptimizerConfig) -> List[Dict[str, Any]]:
    """The trainable parameters of `model` as param-group dicts for `build_optimizer`.

    `cfg`: the `optimizer` section; reads `weight_decay` and `no_decay_1d`. Returns the
    decayed group `{'params', 'weight_decay': cfg.weight_decay, 'decay': True}` and, when `no_decay_1d`, the
    `{'params', 'weight_decay': 0.0, 'decay': False}` group; an empty group is left out.
    """
    split = cfg.no_decay_1d
    decayed: List[Tensor] = []
    kept: List[Tensor] = []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (decayed if not split or decays(name, param) else kept).append(param)
    groups = []
    if decayed:
        groups.append({"params": decayed, "weight_decay": cfg.weight_decay, "decay": True})
    if kept:
        groups.append({"params": kept, "weight_decay": 0.0, "decay": False})
    return groups


def _adamw(params, cfg: OptimizerConfig, diagnostics: bool, total_steps: Optional[int]) -> Optimizer:
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)


def _sgd(params, cfg: OptimizerConfig, diagnostics: bool, total_steps: Optional[int]) -> Optimizer:
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


AUTO_COMPILE_DEVICES = ("cpu",)  # where the compiled step was measured faster than the eager one
_said: Set[str] = set()  # the compile=auto choices printed in this process


def _listed(params) -> List[torch.Tensor]:
    """A param group's "params" as a list (torch also takes one tensor, or any iterable)."""
    return [params] if isinstance(params, torch.Tensor) else list(params)


def _tensors(params) -> List[torch.Tensor]:
    """The parameter tensors of a list of tensors or of param-group dicts."""
    return [p for item in params for p in (item["params"] if isinstance(item, dict) else [item])]


def compile_choice(params, cfg: OptimizerConfig, total_steps: Optional[int] = None) -> Tuple[bool, str]:
    """(whether Orthogonal-AdamW runs its compiled step, why) for `optimizer.compile`: true and false as given; auto
    compiles at least `cfg.compile_min_params` trainable fp32/fp64 parameters on one CPU device, with a projection
    that has a compiled step, in a run of at least `cfg.compile_min_steps` steps (`total_steps`; None: a run of
    unknown length, counted as long). `params` is a list of tensors or of param-group dicts (with lists of
    tensors)."""
    if cfg.compile is True or cfg.compile is False:
        return cfg.compile, f"optimizer.compile={str(cfg.compile).lower()}"
    if cfg.compile != "auto":
        raise ValueError(f"optimizer.compile = {cfg.compile!r}: expected true, false or auto")
    tensors = [p for p in _tensors(params) if p.requires_grad]
    n = sum(p.numel() for p in tensors)
    devices = sorted({p.device.type for p in tensors})
    dtypes = sorted({str(p.dtype) for p in tensors} - {"torch.float32", "torch.float64"})
    if cfg.projection not in COMPILED_PROJECTIONS:
        return False, f"projection={cfg.projection} has no compiled step"
    if dtypes:
        return False, f"the compiled step takes fp32/fp64 parameters, not {', '.join(dtypes)}"
    if devices != list(AUTO_COMPILE_DEVICES):
        return False, (f"parameters on {', '.join(devices) or 'no device'}: the compiled step was measured faster "
                       f"on {', '.join(AUTO_COMPILE_DEVICES)} only (`raystream bench` times both on this device)")
    if n < cfg.compile_min_params:
        return False, f"{n:,} trainable parameters < optimizer.compile_min_params={cfg.compile_min_params}"
    if total_steps is not None and total_steps < cfg.compile_min_steps:
        return False, (f"a run of {total_steps:,} steps < optimizer.compile_min_steps={cfg.compile_min_steps}: "
                       "the compilation would not be paid back")
    return True, (f"{n:,} trainable parameters >= optimizer.compile_min_params={cfg.compile_min_params}; "
                  "torch.compile builds it at the second step, about a minute on a CPU")


def _say_choice(compiled: bool, why: str) -> None:
    """Print auto's choice of the compiled step once per process (every Ray worker builds its optimizer): it costs a
    compilation at the second step. The eager step, the small models' default, goes unsaid (a quiet terminal)."""
    if not compiled:
        return
    line = (f"raystream: optimizer.compile=auto: Orthogonal-AdamW runs its compiled step ({why}); "
            "optimizer.compile=false turns it off")
    if line not in _said:
        _said.add(line)
        print(line, file=sys.stderr, flush=True)


def _orthogonal_adamw(params, cfg: OptimizerConfig, diagnostics: bool, total_steps: Optional[int]) -> Optimizer:
    if not isinstance(params, torch.Tensor):  # a generator would be spent by compile_choice (torch rejects a Tensor)
        params = [dict(x, params=_listed(x["params"])) if isinstance(x, dict) else x for x in params]
    compiled, why = compile_choice(params, cfg, total_steps)
    if cfg.compile == "auto":
        _say_choice(compiled, why)
    return OrthogonalAdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay,
                           orth_beta=cfg.orth_beta, projection=cfg.projection, orth_init=cfg.orth_init,
                           diagnostics=diagnostics, compile=compiled, triton=_triton_choice(cfg.triton))


def _triton_choice(value: Any) -> Optional[bool]:
    """`optimizer.triton` as OrthogonalAdamW's `triton` argument: auto -> None (where it runs), true, false."""
    if value is True or value is False:
        return value
    if value != "auto":
        raise ValueError(f"optimizer.triton = {value!r}: expected true, false or auto")
    return None


def _orthogonal_sgd(params, cfg: OptimizerConfig, diagnostics: bool, total_steps: Optional[int]) -> Optimizer:
    return OrthogonalSGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                         orth_beta=cfg.orth_beta, projection=cfg.projection, orth_init=cfg.orth_init,
                         diagnostics=diagnostics)


def _slower_adamw(params, cfg: OptimizerConfig, diagnostics: bool, total_steps: Optional[int]) -> Optimizer:
    return SlowerAdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay,
                       diagnostics=diagnostics)


def _orthogonal_torch_adamw(params, cfg: OptimizerConfig, diagnostics: bool, total_steps: Optional[int]) -> Optimizer:
    """Orthogonal(torch.optim.AdamW): the projection wrapped around stock torch, the check that `orthogonal_adamw`
    computes the same update (the optimizer ablation runs both)."""
    return Orthogonal(_adamw(params, cfg, diagnostics, total_steps), orth_beta=cfg.orth_beta,
                      projection=cfg.projection, orth_init=cfg.orth_init, diagnostics=diagnostics)


# NAMES, in its order: adamw, sgd, orthogonal_adamw, orthogonal_sgd, slower_adamw, orthogonal_torch_adamw
BUILDERS: Dict[str, Callable[..., Optimizer]] = dict(zip(NAMES, (_adamw, _sgd, _orthogonal_adamw, _orthogonal_sgd,
                                                                  _slower_adamw, _orthogonal_torch_adamw), strict=True))


def build_optimizer(params, cfg: OptimizerConfig, diagnostics: bool = False,
                    total_steps: Optional[int] = None) -> Optimizer:
    """`params`: parameters or param-group dicts; `cfg`: the `optimizer` section (OptimizerConfig, or the structured
    DictConfig of one). `diagnostics` applies to the orthogonal and slower optimizers (plain torch ones have no
    `diagnostics()`: use GradCosineTracker). `total_steps`: the run's length, which `compile: auto` weighs (None:
    unknown, counted as long)."""
    build = BUILDERS.get(cfg.name)
    if build is None:
        raise ValueError(f"optimizer.name = {cfg.name!r}: expected one of {', '.join(NAMES)}")
    return build(params, cfg, diagnostics, total_steps)
