"""The paper's orthogonal gradient projection and Orthogonal-AdamW (Han et al., CVPR 2025, Algorithms 1-2).

At step t, with raw gradient g_t and c an EMA of past RAW gradients (factor beta = `orth_beta`):

    u_t = g_t - (g_t . c_{t-1}) / (c_{t-1} . c_{t-1}) * c_{t-1}      (u_t = g_t exactly when c_{t-1} = 0)
    c_t = beta * c_{t-1} + (1 - beta) * g_t                           (`orth_init="zero"`: c_0 = 0)
    the base optimizer runs unchanged on u_t.

Algorithm 2 (Orthogonal-AdamW) = this projection followed by AdamW on u_t:
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
worker projects the same global gradient against the same EMA.

The projection is a pure transformation of tensor lists (optax-style): `coefficients` (the dot products, one pass
over g and c) -> `orthogonalize` (u = g - k c) = `project`; `update_ema` advances c. The optimizers keep c in their
per-parameter state under "orth_ema" (base.py) and run their base update on u (AdamW: adamw_math.py).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.optim import Optimizer

from raystream.optim.adamw_math import adamw_foreach, adamw_fused, adamw_single, fused_supported, init_adamw_state
from raystream.optim.base import OrthogonalMixin, check_hparam, evaluate_closure
from raystream.optim.reductions import dot, total

PROJECTIONS = ("global", "per_tensor", "dim0")
ORTH_INITS = ("zero", "first_grad")


def _ratio(gc: Tensor, cc: Tensor) -> Tensor:
    """(g . c) / (c . c), elementwise, and 0 where c = 0 so that u = g exactly."""
    nonzero = cc > 0
    return torch.where(nonzero, gc / torch.where(nonzero, cc, torch.ones_like(cc)), torch.zeros_like(cc))


def _dim0_coefficient(g: Tensor, c: Tensor, eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    """The published per-slice projection, as k with u = g - k c (k broadcast over dim 0); also g . c and c . c.

    cos * ||g|| * c / max(||c||, eps) with cos = (g / max(||g||, eps)) . (c / max(||c||, eps)), slice by slice.
    """
    d0 = g.shape[0] if g.dim() > 0 else 1
    G, C = g.reshape(d0, -1).to(c.dtype), c.reshape(d0, -1)
    g_norm, c_norm = torch.linalg.vector_norm(G, dim=0), torch.linalg.vector_norm(C, dim=0)
    gc = (G * C).sum(0)
    k = gc * g_norm / (g_norm.clamp_min(eps) * c_norm.clamp_min(eps) ** 2)
    k = k.reshape((1,) + tuple(c.shape[1:])) if c.dim() > 0 else k.reshape(())
    return k, gc.sum(), (c_norm ** 2).sum()


def coefficients(grads: Sequence[Tensor], emas: Sequence[Optional[Tensor]], projection: str = "global",
                 eps: float = 1e-8) -> Tuple[List[Optional[Tensor]], Optional[Tensor], Optional[Tensor]]:
    """The projection as coefficients: u_i = g_i - k_i * c_i.

    k_i is a 0-dim tensor ("global": the same for all, "per_tensor": one per tensor) or one value per length-d0
    slice ("dim0"), and None where there is no EMA yet (c_i = 0, so u_i = g_i). Also returns the sums over all
    tensors of g . c and c . c (None without any EMA): computed anyway, they feed the diagnostics.
    """
    idx = [i for i, c in enumerate(emas) if c is not None]
    ks: List[Optional[Tensor]] = [None] * len(grads)
    if not idx:
        return ks, None, None
    if projection not in PROJECTIONS:
        raise ValueError(f"Invalid projection: {projection!r} (expected one of {', '.join(PROJECTIONS)})")
    gcs, ccs = [], []
    for i in idx:
        g, c = grads[i], emas[i]
        if projection == "dim0":
            ks[i], gc, cc = _dim0_coefficient(g, c, eps)
        else:  # c . c right after g . c, while c is still in cache
            gc, cc = dot(g, c), dot(c, c)
        gcs.append(gc)
        ccs.append(cc)
    gc_sum, cc_sum = total(gcs), total(ccs)
    if projection == "global":
        k = _ratio(gc_sum, cc_sum)
        k_on = {d: k.to(d) for d in {emas[i].device for i in idx}}
        for i in idx:
            ks[i] = k_on[emas[i].device]
    elif projection == "per_tensor":
        if len({emas[i].device for i in idx}) == 1 and len({x.dtype for x in gcs}) == 1:
            per = list(_ratio(torch.stack(gcs), torch.stack(ccs)).unbind())
        else:
            per = [_ratio(a, b) for a, b in zip(gcs, ccs)]
        for i, k in zip(idx, per):
            ks[i] = k
    return ks, gc_sum, cc_sum


def orthogonalize(grads: Sequence[Tensor], emas: Sequence[Optional[Tensor]], ks: Sequence[Optional[Tensor]],
                  foreach: bool = True) -> List[Tensor]:
    """u_i = g_i - k_i c_i in each gradient's dtype (one pass, one new tensor); u_i is g_i itself where k_i is None."""
    u = list(grads)
    idx = [i for i, k in enumerate(ks) if k is not None]
    if not idx:
        return u
    G, C, neg = [grads[i] for i in idx], [emas[i] for i in idx], [-ks[i] for i in idx]
    out = torch._foreach_addcmul(G, C, neg) if foreach else [torch.addcmul(g, c, k) for g, c, k in zip(G, C, neg)]
    for i, g, ui in zip(idx, G, out):
        u[i] = ui if ui.dtype == g.dtype else ui.to(g.dtype)
    return u


def project(grads: Sequence[Tensor], emas: Sequence[Optional[Tensor]], projection: str = "global",
            eps: float = 1e-8, foreach: bool = True) -> List[Tensor]:
    """The pure transformation: u_t for each gradient, its component orthogonal to c_{t-1} in the projection scope.

    `emas[i] is None` means no EMA yet (c = 0): then u_i is g_i itself (the same tensor, not a copy).
    """
    ks, _, _ = coefficients(grads, emas, projection, eps)
    return orthogonalize(grads, emas, ks, foreach)


def ema_dtype(p: Tensor) -> torch.dtype:
    """The EMA is kept in fp32 for half-precision parameters, else in the parameter's dtype."""
    return torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype


def update_ema(emas: Sequence[Optional[Tensor]], grads: Sequence[Tensor], betas: Sequence[float],
               first_grad: bool, foreach: bool = True) -> List[Tensor]:
    """c_t = beta c_{t-1} + (1 - beta) g_t in place; a missing EMA starts as (1 - beta) g (or g for first_grad)."""
    out: List[Tensor] = []
    lerp: dict = {}  # beta -> ([c], [g]) for the in-place updates
    for c, g, beta in zip(emas, grads, betas):
        if c is None:
            c = g.to(ema_dtype(g), copy=True)
            if not first_grad:
                c.mul_(1 - beta)
        else:
            cs, gs = lerp.setdefault(beta, ([], []))
            cs.append(c)
            gs.append(g if g.dtype == c.dtype else g.to(c.dtype))
        out.append(c)
    for beta, (cs, gs) in lerp.items():
        if foreach:
            torch._foreach_lerp_(cs, gs, 1 - beta)
        else:
            for c, g in zip(cs, gs):
                c.lerp_(g, 1 - beta)
    return out


class OrthogonalAdamW(OrthogonalMixin, Optimizer):
    """Algorithm 2: AdamW driven by the gradient's component orthogonal to the EMA of past gradients.

    Extra state over torch.optim.AdamW: exactly one buffer per parameter, `state[p]["orth_ema"]` (fp32 for
    bf16/fp16 parameters). Param groups may set their own lr, betas, eps, weight_decay and orth_beta.
    Implementations: the multi-tensor path (default) projects with torch._foreach_ ops and then runs torch's fused
    AdamW kernel on u_t (`fused=None`: wherever torch supports it) or torch._foreach_ AdamW ops (`fused=False`);
    `foreach=False` is the single-tensor reference path, Algorithm 2 line by line. All agree to rounding.
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
        grads = [g for _, _, gs in groups for g in gs]
        if not grads:
            return loss
        emas, ks = self._coefficients(groups)  # k with u_t = g_t - k c_{t-1}, over the projection scope
        if self._foreach():
            u = orthogonalize(grads, emas, ks, foreach=True)
            self._note_update_norm(u)
            for (group, ps, gs), us in zip(groups, _split(u, groups)):
                kernel = adamw_fused if group["fused"] else adamw_foreach
                self._adamw(kernel, group, ps, us, scratch=all(a is not b for a, b in zip(us, gs)))
            del u
            self._update_emas(groups, foreach=True)  # c_t = beta c_{t-1} + (1 - beta) g_t, of the RAW gradients
            return loss
        # Reference path, one tensor at a time: Algorithm 2 line by line.
        for (group, ps, gs), cs, kk in zip(groups, _split(emas, groups), _split(ks, groups)):
            for p, g, c, k in zip(ps, gs, cs, kk):
                u = orthogonalize([g], [c], [k], foreach=False)
                self._note_update_norm(u)
                self._update_emas([(group, [p], [g])], foreach=False)
                self._adamw(adamw_single, group, [p], u)
        return loss

    def _adamw(self, kernel, group: dict, ps: List[Tensor], us: List[Tensor], scratch: bool = False) -> None:
        states = [self.state[p] for p in ps]
        for p, s in zip(ps, states):
            init_adamw_state(s, p, fused=group["fused"])
        beta1, beta2 = group["betas"]
        kernel(ps, us, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
               [s["step"] for s in states], lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
               weight_decay=group["weight_decay"], maximize=group["maximize"], scratch=scratch)


def _split(flat: list, groups) -> List[list]:
    """Cut a flat per-parameter list back into the param groups' pieces."""
    out, start = [], 0
    for _, ps, _ in groups:
        out.append(flat[start:start + len(ps)])
        start += len(ps)
    return out
