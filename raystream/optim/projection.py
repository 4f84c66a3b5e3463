"""The orthogonal projection as pure functions of tensors (optax-style), in two forms that tests keep in agreement.

On lists of tensors (the reference; also the path for `dim0` and for half-precision parameters):
    `coefficients` (the dot products) -> `orthogonalize` (u = g - k c) = `project`;  `update_ema` advances c.
On a flat buffer W of shape (2, N) holding g (row 0) and c (row 1) of many tensors laid end to end (flat.py):
    `flat_dots` (every dot product in one or two reductions) -> `flat_orthogonalize_` (u = g - k c, written into
    row 0), so that a step costs the same few ops whatever the number of tensors.
Every result stays a tensor on the gradients' device: nothing here reads a value back to the host.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from raystream.optim.config import PROJECTIONS
from raystream.optim.reductions import dot, total


def ema_dtype(p: Tensor) -> torch.dtype:
    """The EMA is kept in fp32 for half-precision parameters, else in the parameter's dtype."""
    return torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype


def safe_ratio(gc: Tensor, cc: Tensor) -> Tensor:
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
    if projection not in PROJECTIONS:
        raise ValueError(f"Invalid projection: {projection!r} (expected one of {', '.join(PROJECTIONS)})")
    idx = [i for i, c in enumerate(emas) if c is not None]
    ks: List[Optional[Tensor]] = [None] * len(grads)
    if not idx:
        return ks, None, None
    gcs, ccs = [], []
    for i in idx:
        g, c = grads[i], emas[i]
        if projection == "dim0":
            ks[i], gc, cc = _dim0_coefficient(g, c, eps)
        else:
            gc, cc = dot(g, c), dot(c, c)
        gcs.append(gc)
        ccs.append(cc)
    gc_sum, cc_sum = total(gcs), total(ccs)
    if projection == "global":
        k = safe_ratio(gc_sum, cc_sum)
        for i in idx:
            ks[i] = k.to(emas[i].device)
    elif projection == "per_tensor":
        for i, gc, cc in zip(idx, gcs, ccs):
            ks[i] = safe_ratio(gc, cc)
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


def flat_dots(W: Tensor, projection: str, lengths: Tensor) -> Tuple[Tensor, Tensor]:
    """(g . c, c . c) of W = [g; c]: 0-dim over the whole row ("global", one matrix-vector product), or one value
    per tensor of `lengths` elements ("per_tensor", one segmented sum)."""
    if projection == "global":
        s = torch.mv(W, W[1])
    else:
        s = torch.segment_reduce(W * W[1], "sum", lengths=lengths.expand(2, -1), axis=1, unsafe=True)
    return s[0], s[1]


def flat_orthogonalize_(W: Tensor, k: Tensor, segments: Optional[Tensor] = None) -> None:
    """Row 0 of W = [g; c] becomes u = g - k c; k is 0-dim, or one value per tensor with `segments` the index of
    each element's tensor."""
    if k.dim() > 0:
        k = k.index_select(0, segments)
    W[0].addcmul_(W[1], k, value=-1)
