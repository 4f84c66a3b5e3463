"""Orthogonal-AdamW, the paper's Algorithm 2 (Han et al., "Learning from Streaming Video with Orthogonal Gradients",
CVPR 2025).

At step t, with raw gradient g_t and c an EMA of past RAW gradients (factor beta = `orth_beta`):

    u_t = g_t - (g_t . c_{t-1}) / (c_{t-1} . c_{t-1}) * c_{t-1}      (u_t = g_t exactly when c_{t-1} = 0)
    c_t = beta * c_{t-1} + (1 - beta) * g_t                           (`orth_init="zero"`: c_0 = 0)
    m_t = b1 m + (1 - b1) u_t ;  v_t = b2 v + (1 - b2) u_t^2 ;  theta <- theta - lr wd theta
    theta <- theta - lr m_t / (1 - b1^t) / (sqrt(v_t / (1 - b2^t)) + eps)
(Algorithm 1, Orthogonal-SGD: theta <- theta - lr u_t; see sgd.py.)

`projection` is the scope of the dot products:
  "global"     one projection over the whole parameter vector (all groups, all tensors): the paper's equations;
  "per_tensor" one projection per parameter tensor;
  "dim0"       the authors' published code: for g of shape [d0, *rest], one projection per length-d0 slice,
               cos = F.cosine_similarity(g, c, dim=0, eps), u = g - cos * ||g||_dim0 * F.normalize(c, dim=0, eps).
               A tensor whose first dimension is 1 (cls_token, [1, N, D] pos_embed) gets u = 0 from step 2 on.
`orth_init`: "zero" (the paper: c_1 = (1 - beta) g_1) or "first_grad" (the published code: c_1 = g_1). Step 1 is
never projected. `projection="dim0", orth_init="first_grad"` reproduces the published code.

Gradients are projected where `step()` sees them: after DDP has all-reduced (averaged) them across workers, so every
worker projects the same global gradient against the same EMA. The projection and the EMA are base.py's (maths in
projection.py); the AdamW update is adamw_math.py's.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.optim import Optimizer

from raystream.optim.adamw_math import adamw_foreach, adamw_fused, adamw_single, fused_supported, init_adamw_state
from raystream.optim.base import OrthogonalMixin, check_hparam, evaluate_closure, split


class OrthogonalAdamW(OrthogonalMixin, Optimizer):
    """Algorithm 2: AdamW driven by the gradient's component orthogonal to the EMA of past gradients.

    Extra state over torch.optim.AdamW: exactly one buffer per parameter, `state[p]["orth_ema"]` (fp32 for
    bf16/fp16 parameters). Param groups may set their own lr, betas, eps, weight_decay and orth_beta.
    Implementations: the multi-tensor path (default) projects with a few whole-model ops and then runs torch's fused
    AdamW kernel on u_t (`fused=None`: wherever torch supports it) or torch._foreach_ AdamW ops (`fused=False`);
    `foreach=False` is the single-tensor reference path. All agree to rounding.
    """

    def __init__(self, params, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, orth_beta: float = 0.9, projection: str = "global",
                 orth_init: str = "zero", *, maximize: bool = False, foreach: Optional[bool] = None,
                 fused: Optional[bool] = None, diagnostics: bool = False):
        check_hparam("lr", lr, lr >= 0, ">= 0")
        check_hparam("eps", eps, eps >= 0, ">= 0")
        check_hparam("weight_decay", weight_decay, weight_decay >= 0, ">= 0")
        check_hparam("betas[0]", betas[0], 0 <= betas[0] < 1, "in [0, 1)")
        check_hparam("betas[1]", betas[1], 0 <= betas[1] < 1, "in [0, 1)")
        check_hparam("fused", fused, not (fused and foreach is False),
                     "not True together with foreach=False (the fused kernel is a multi-tensor path)")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, orth_beta=orth_beta,
                        maximize=maximize, foreach=foreach, fused=fused)
        super().__init__(params, defaults)
        self._init_orthogonal(projection, orth_init, orth_eps=eps, diagnostics=diagnostics)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]  # resolve fused=None once: the step counters' device depends on it
        if group["fused"] is None:
            group["fused"] = group["foreach"] is not False and fused_supported(group["params"])
        elif group["fused"] and not fused_supported(group["params"]):
            raise ValueError("Invalid fused: True (torch's fused AdamW does not support these parameters' devices "
                             "or dtypes)")

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)  # first: the projection must see the gradients the closure produces
        groups = self._gradients()
        if not any(ps for _, ps, _ in groups):
            return loss
        foreach = self._foreach()
        u = self._project(groups, foreach)  # u_t of every parameter
        for (group, ps, gs), us in zip(groups, split(u, groups)):  # AdamW on u_t
            kernel = (adamw_fused if group["fused"] else adamw_foreach) if foreach else adamw_single
            self._adamw(kernel, group, ps, us, scratch=all(a is not b for a, b in zip(us, gs)))
        self._update_emas()  # c_t = beta c_{t-1} + (1 - beta) g_t
        return loss

    def _adamw(self, kernel, group: dict, ps: List[Tensor], us: List[Tensor], scratch: bool) -> None:
        states = [self.state[p] for p in ps]
        for p, s in zip(ps, states):
            init_adamw_state(s, p, fused=group["fused"])
        beta1, beta2 = group["betas"]
        kernel(ps, us, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
               [s["step"] for s in states], lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
               weight_decay=group["weight_decay"], maximize=group["maximize"], scratch=scratch)
