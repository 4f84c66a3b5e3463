"""build_optimizer: the optimizer a run config names (`optimizer.name`, one of config.NAMES). The torch baselines
are returned as torch builds them, so comparisons are against stock torch; only the optimizers of this package
have a `diagnostics()` method.
"""

from __future__ import annotations

from typing import Callable, Dict

import torch
from torch.optim import Optimizer

from raystream.optim.config import NAMES, OptimizerConfig
from raystream.optim.orthogonal import OrthogonalAdamW
from raystream.optim.sgd import OrthogonalSGD
from raystream.optim.slower import SlowerAdamW


def _adamw(params, cfg: OptimizerConfig, diagnostics: bool) -> Optimizer:
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)


def _sgd(params, cfg: OptimizerConfig, diagnostics: bool) -> Optimizer:
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def _orthogonal_adamw(params, cfg: OptimizerConfig, diagnostics: bool) -> Optimizer:
    return OrthogonalAdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay,
                           orth_beta=cfg.orth_beta, projection=cfg.projection, orth_init=cfg.orth_init,
                           diagnostics=diagnostics, compile=cfg.compile)


def _orthogonal_sgd(params, cfg: OptimizerConfig, diagnostics: bool) -> Optimizer:
    return OrthogonalSGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                         orth_beta=cfg.orth_beta, projection=cfg.projection, orth_init=cfg.orth_init,
                         diagnostics=diagnostics)


def _slower_adamw(params, cfg: OptimizerConfig, diagnostics: bool) -> Optimizer:
    return SlowerAdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay,
                       diagnostics=diagnostics)


# config.NAMES, in its order: adamw, sgd, orthogonal_adamw, orthogonal_sgd, slower_adamw
BUILDERS: Dict[str, Callable[..., Optimizer]] = dict(zip(NAMES, (_adamw, _sgd, _orthogonal_adamw, _orthogonal_sgd,
                                                                  _slower_adamw), strict=True))


def build_optimizer(params, cfg: OptimizerConfig, diagnostics: bool = False) -> Optimizer:
    """`params`: parameters or param-group dicts; `cfg`: the `optimizer` section (OptimizerConfig, or the structured
    DictConfig of one). `diagnostics` applies to the orthogonal and slower optimizers (plain torch ones have no
    `diagnostics()`: use GradCosineTracker)."""
    build = BUILDERS.get(cfg.name)
    if build is None:
        raise ValueError(f"optimizer.name = {cfg.name!r}: expected one of {', '.join(NAMES)}")
    return build(params, cfg, diagnostics)
