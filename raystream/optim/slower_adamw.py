"""Slower-AdamW, the paper's supplementary baseline: AdamW on the raw gradient g_t, with the step slowed by
lambda_t = 1 - cos(g_t, g_{t-1}) in [0, 2] (cosine over the whole parameter vector; lambda_1 = 1).

lambda scales the learning rate of the whole step, weight decay included (lr_t = lambda_t * lr), in orthogonal_adamw's
AdamW kernels. It stays a tensor on the parameters' device, fed to torch's fused AdamW kernel as a tensor learning
rate, so the default path does not sync with the host; the `fused=False` / `foreach=False` paths read it back once
per step. Extra state over AdamW: the previous gradient (base.GradCosine), saved in the state_dict as
`state[p]["prev_grad"]`.
"""

from __future__ import annotations

import math
from itertools import chain
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor
from torch.optim import Optimizer

from raystream.optim.base import DIAGNOSTIC_KEYS, GradCosine, evaluate_closure, gradients_by_group, nan_like
from raystream.optim.adamw import (adamw_foreach, adamw_fused, adamw_single, check_adamw_hparams, init_adamw_state,
                                   resolve_fused)

PREV_KEY = "prev_grad"


class SlowerAdamW(Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, *, maximize: bool = False, foreach: Optional[bool] = None,
                 fused: Optional[bool] = None, diagnostics: bool = False):
        check_adamw_hparams(lr, betas, eps, weight_decay)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, maximize=maximize,
                        foreach=foreach, fused=fused)
        super().__init__(params, defaults)
        self._diagnostics_enabled = bool(diagnostics)
        self._diag: Dict[str, Tensor] = {}
        self._cosine = GradCosine()

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        resolve_fused(self.param_groups[-1], strict=False)

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)
        groups = gradients_by_group(self)
        params = [p for _, ps, _ in groups for p in ps]
        if not params:
            return loss
        cos = self._cosine.update(params, [g for _, _, gs in groups for g in gs])
        lam = torch.where(torch.isnan(cos), torch.ones_like(cos), 1 - cos)  # lambda_t in [0, 2]
        foreach = {g.get("foreach") for g in self.param_groups} != {False}
        for group, ps, gs in groups:
            if not ps:
                continue
            states = [self.state[p] for p in ps]
            for p, s in zip(ps, states):
                init_adamw_state(s, p, fused=group["fused"])
            if group["fused"]:
                kernel, lr = adamw_fused, group["lr"] * lam.to(ps[0].device)
            else:
                kernel, lr = (adamw_foreach if foreach else adamw_single), group["lr"] * float(lam)
            beta1, beta2 = group["betas"]
            kernel(ps, gs, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                   [s["step"] for s in states], lr=lr, beta1=beta1, beta2=beta2, eps=group["eps"],
                   weight_decay=group["weight_decay"], maximize=group["maximize"])
        if self._diagnostics_enabled:
            self._diag = {"grad_cos_prev": cos, "grad_cos_ema": nan_like(cos), "update_norm_ratio": lam}
        return loss

    def diagnostics(self) -> Dict[str, Tensor]:
        """grad_cos_prev = cos(g_t, g_{t-1}); update_norm_ratio = lambda_t; grad_cos_ema is NaN (no EMA). 0-dim
        tensors on the parameters' device."""
        if not self._diagnostics_enabled:
            raise RuntimeError("SlowerAdamW was built with diagnostics=False; pass diagnostics=True")
        if not self._diag:
            return {k: torch.tensor(math.nan) for k in DIAGNOSTIC_KEYS}
        return dict(self._diag)

    def reset_orthogonal_state(self) -> None:
        """Forget the previous gradient: the next step runs at lambda = 1."""
        self._cosine.reset()

    def diagnostics_state_dict(self) -> Dict[str, Any]:
        """Nothing beyond `state_dict()`, which already holds the previous gradient (lambda_t needs it)."""
        return {}

    def load_diagnostics_state_dict(self, state: Dict[str, Any]) -> None:
        """`load_state_dict` restored the previous gradient already."""

    def state_dict(self) -> dict:
        """torch's state_dict with the previous gradient as each parameter's `prev_grad` (GradCosine's indexing)."""
        sd = super().state_dict()
        state = dict(sd["state"])
        for i, g in self._cosine.state_dict(self._params())["prev_grads"].items():
            state[i] = {**state.get(i, {}), PREV_KEY: g}
        return {**sd, "state": state}

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        params = self._params()
        for p in params:
            self.state[p].pop(PREV_KEY, None)
        ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        previous = {pos: state_dict["state"][i][PREV_KEY] for pos, i in enumerate(ids)
                    if PREV_KEY in state_dict["state"].get(i, {})}
        self._cosine.load_state_dict(params, {"prev_grads": previous})

    def _params(self) -> list:
        return list(chain.from_iterable(g["params"] for g in self.param_groups))
