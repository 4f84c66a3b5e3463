"""Slower-AdamW, the paper's supplementary baseline: AdamW on the raw gradient g_t, with the step slowed by
lambda_t = 1 - cos(g_t, g_{t-1}) in [0, 2] (cosine over the whole parameter vector; lambda_1 = 1).

lambda scales the learning rate of the whole step, weight decay included (lr_t = lambda_t * lr). It is read back as
a Python number once per step (one device sync). Extra state over AdamW: one buffer per parameter,
`state[p]["prev_grad"]`.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch
from torch.optim import Optimizer

from raystream.optim.adamw_math import adamw_foreach, adamw_single, init_adamw_state
from raystream.optim.base import DIAGNOSTIC_KEYS, check_hparam, evaluate_closure, gradients_by_group
from raystream.optim.reductions import cosine, dot, sq_norm, total

PREV_KEY = "prev_grad"


class SlowerAdamW(Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, *, maximize: bool = False, foreach: Optional[bool] = None,
                 diagnostics: bool = False):
        check_hparam("lr", lr, lr >= 0, ">= 0")
        check_hparam("eps", eps, eps >= 0, ">= 0")
        check_hparam("weight_decay", weight_decay, weight_decay >= 0, ">= 0")
        check_hparam("betas[0]", betas[0], 0 <= betas[0] < 1, "in [0, 1)")
        check_hparam("betas[1]", betas[1], 0 <= betas[1] < 1, "in [0, 1)")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, maximize=maximize,
                        foreach=foreach)
        super().__init__(params, defaults)
        self._diagnostics_enabled = bool(diagnostics)
        self._diag: Dict[str, float] = {}

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)
        groups = gradients_by_group(self)
        params = [p for _, ps, _ in groups for p in ps]
        if not params:
            return loss
        grads = [g for _, _, gs in groups for g in gs]
        prev = [self.state[p].get(PREV_KEY) for p in params]
        pairs = [(g, q) for g, q in zip(grads, prev) if q is not None]
        cos = float("nan")
        if pairs:
            gq = total([dot(g, q.float() if q.dtype != torch.float64 else q) for g, q in pairs])
            cos = float(cosine(gq, sq_norm(grads), sq_norm([q for _, q in pairs])))
        lam = 1.0 if math.isnan(cos) else 1.0 - cos  # lambda_t in [0, 2]
        foreach = {g.get("foreach") for g in self.param_groups} != {False}
        kernel = adamw_foreach if foreach else adamw_single
        for group, ps, _ in groups:
            states = [self.state[p] for p in ps]
            for p, s in zip(ps, states):
                init_adamw_state(s, p)
            beta1, beta2 = group["betas"]
            kernel(ps, [p.grad for p in ps], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                   [s["step"] for s in states], lr=group["lr"] * lam, beta1=beta1, beta2=beta2, eps=group["eps"],
                   weight_decay=group["weight_decay"], maximize=group["maximize"])
        for p, g in zip(params, grads):
            q = self.state[p].get(PREV_KEY)
            if q is None:
                self.state[p][PREV_KEY] = g.detach().clone()
            else:
                q.copy_(g)
        if self._diagnostics_enabled:
            self._diag = {"grad_cos_prev": cos, "grad_cos_ema": math.nan, "update_norm_ratio": lam}
        return loss

    def diagnostics(self) -> Dict[str, float]:
        """grad_cos_prev = cos(g_t, g_{t-1}); update_norm_ratio = lambda_t; grad_cos_ema is NaN (no EMA)."""
        if not self._diagnostics_enabled:
            raise RuntimeError("SlowerAdamW was built with diagnostics=False; pass diagnostics=True")
        return {k: self._diag.get(k, math.nan) for k in DIAGNOSTIC_KEYS}

    def diagnostics_state_dict(self) -> Dict[str, Any]:
        """Nothing beyond `state_dict()`, which holds the previous gradient (`prev_grad`)."""
        return {}

    def load_diagnostics_state_dict(self, state: Dict[str, Any]) -> None:
        """Nothing to do: `load_state_dict` restored the previous gradient."""

    def reset_orthogonal_state(self) -> None:
        """Forget the previous gradient: the next step runs at lambda = 1."""
        for group in self.param_groups:
            for p in group["params"]:
                self.state.get(p, {}).pop(PREV_KEY, None)
