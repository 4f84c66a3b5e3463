"""build_optimizer: the optimizer a run config names (`optimizer.name`, one of config.NAMES). The torch baselines
are returned as torch builds them, so comparisons are against stock torch; only the optimizers of this package
have a `diagnostics()` method.

`compile_choice` resolves `optimizer.compile: auto` for Orthogonal-AdamW: the compiled step where it was measured
faster and pays its compilation back (docs/optimizers.md: at least `compile_min_params` trainable fp32 parameters on a
CPU, in a run of at least `compile_min_steps` steps), the eager multi-tensor step otherwise; a compiled choice is
printed once per process, with its reason.
"""

from __future__ import annotations

import sys
from typing import Callable, Dict, List, Optional, Set, Tuple

import torch
from torch.optim import Optimizer

from raystream.optim.config import COMPILED_PROJECTIONS, NAMES, OptimizerConfig
from raystream.optim.orthogonal import OrthogonalAdamW
from raystream.optim.sgd import OrthogonalSGD
from raystream.optim.slower import SlowerAdamW
from raystream.optim.wrapper import Orthogonal


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
                           diagnostics=diagnostics, compile=compiled)


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


# config.NAMES, in its order: adamw, sgd, orthogonal_adamw, orthogonal_sgd, slower_adamw, orthogonal_torch_adamw
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
