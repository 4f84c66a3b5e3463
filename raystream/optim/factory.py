"""build_optimizer: the optimizer a run config names (`optimizer.name`), from plain attributes (DictConfig or
OptimizerConfig). The torch baselines are returned as torch builds them, so comparisons are against stock torch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim import Optimizer

from raystream.optim.orthogonal import OrthogonalAdamW
from raystream.optim.sgd import OrthogonalSGD
from raystream.optim.slower import SlowerAdamW

from raystream.optim.config import NAMES


def build_optimizer(params, cfg: Any, diagnostics: bool = False) -> Optimizer:
    """`params`: parameters or param-group dicts. `diagnostics` applies to the orthogonal and slower optimizers
    (plain torch ones have no `diagnostics()`: use GradCosineTracker)."""
    name = cfg.name
    lr = float(cfg.lr)
    wd = float(getattr(cfg, "weight_decay", 0.0))
    betas = tuple(float(b) for b in getattr(cfg, "betas", (0.9, 0.999)))
    eps = float(getattr(cfg, "eps", 1e-8))
    momentum = float(getattr(cfg, "momentum", 0.0))
    orth = dict(orth_beta=float(getattr(cfg, "orth_beta", 0.9)), projection=str(getattr(cfg, "projection", "global")),
                orth_init=str(getattr(cfg, "orth_init", "zero")))
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=wd)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=wd)
    if name == "orthogonal_adamw":
        return OrthogonalAdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=wd, diagnostics=diagnostics, **orth)
    if name == "orthogonal_sgd":
        return OrthogonalSGD(params, lr=lr, momentum=momentum, weight_decay=wd, diagnostics=diagnostics, **orth)
    if name == "slower_adamw":
        return SlowerAdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=wd, diagnostics=diagnostics)
    raise ValueError(f"optimizer.name = {name!r}: expected one of {', '.join(NAMES)}")
