"""The orthogonal projection and the EMA as pure functions of tensor lists (optax-style), in two forms that tests
keep in agreement.

On lists of tensors (the reference; also the path for `dim0` and for half-precision parameters):
    `coefficients` (the dot products) -> `orthogonalize` (u = g - k c) = `project`.
On a flat scratch buffer W of shape (2, N) into which g (row 0) and c (row 1) of many tensors are copied end to end
(flat.py): `flat_dots` (every dot product in one or two reductions) -> `flat_orthogonalize_` (u = g - k c, written
into row 0), so that a step costs the same few ops whatever the number of tensors.
`project_step` picks between them for an optimizer's step; `advance_emas_` (and `update_ema`) advance c.
Every result stays a tensor on the gradients' device: nothing here reads a value back to the host.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from raystream.optim.config import PROJECTIONS
from raystream.optim.flat import Flat, Workspace
from raystream.optim.reductions import dot, sq_norm, total

# (sum g . c, sum c . c, sum u . u) of a step, for the diagnostics: None where not computed
Sums = Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]


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
    out = [c if c is not None else torch.zeros_like(g, dtype=ema_dtype(g)) for c, g in zip(emas, grads)]
    advance_emas_(out, grads, betas, [c is None for c in emas], first_grad, foreach)
    return out


def advance_emas_(emas: Sequence[Tensor], grads: Sequence[Tensor], betas: Sequence[float], fresh: Sequence[bool],
                  first_grad: bool, foreach: bool = True) -> None:
    """c_t = beta c_{t-1} + (1 - beta) g_t in place, as c += (1 - beta)(g - c). `fresh[i]`: emas[i] holds no value
    yet (zeros, c_0 = 0), so it becomes (1 - beta) g_1, or g_1 itself under `first_grad` (the published code's
    c_1 = g_1: the same lerp with weight 1). One op per distinct weight."""
    lerp: dict = {}  # weight -> ([c], [g])
    for c, g, beta, new in zip(emas, grads, betas, fresh):
        cs, gs = lerp.setdefault(1.0 if new and first_grad else 1.0 - beta, ([], []))
        cs.append(c)
        gs.append(g if g.dtype == c.dtype else g.to(c.dtype))
    for weight, (cs, gs) in lerp.items():
        if foreach:
            torch._foreach_lerp_(cs, gs, weight)
        else:
            for c, g in zip(cs, gs):
                c.lerp_(g, weight)


def project_step(grads: Sequence[Tensor], emas: Sequence[Tensor], projection: str, eps: float,
                 workspace: Optional[Workspace], with_update_norm: bool) -> Tuple[List[Tensor], Sums]:
    """u_t of every gradient against its EMA (zeros for an EMA without a value: u = g), and the step's sums.

    With a `workspace` (the multi-tensor path) fp32/fp64 gradients of the "global" and "per_tensor" scopes go
    through its flat buffer, a few whole-model ops whatever the number of tensors, and u are views into it, valid
    until the next step; otherwise (`dim0`, half precision, the single-tensor path) `coefficients` and
    `orthogonalize` work tensor by tensor and u are new tensors.
    """
    if workspace is not None and projection != "dim0" and all(g.dtype == ema_dtype(g) for g in grads):
        return flat_project(grads, emas, projection, workspace, with_update_norm)
    ks, gc, cc = coefficients(grads, emas, projection, eps)
    u = orthogonalize(grads, emas, ks, foreach=workspace is not None)
    return u, (gc, cc, sq_norm(u) if with_update_norm else None)


def flat_project(grads: Sequence[Tensor], emas: Sequence[Tensor], projection: str, workspace: Workspace,
                 with_update_norm: bool) -> Tuple[List[Tensor], Sums]:
    """`project_step` of the "global" / "per_tensor" scope through the workspace: per (device, dtype), g and c are
    copied into W = [g; c], every dot product is one or two reductions of W and u = g - k c overwrites row 0."""
    buffers = workspace.buffers(grads, ema_dtype)
    parts = []
    for idx, flat in buffers:
        torch._foreach_copy_(flat.views[0], [grads[i] for i in idx])
        torch._foreach_copy_(flat.views[1], [emas[i] for i in idx])
        parts.append(flat_dots(flat, projection))
    if projection == "global":
        gc, cc = total([a for a, _ in parts]), total([b for _, b in parts])
        ks = [safe_ratio(gc, cc).to(flat.data.device) for _, flat in buffers]
    else:
        gc, cc = total([a.sum() for a, _ in parts]), total([b.sum() for _, b in parts])
        ks = [safe_ratio(a, b) for a, b in parts]
    u: List[Tensor] = list(grads)
    for (idx, flat), k in zip(buffers, ks):
        flat_orthogonalize_(flat, k)
        for j, i in enumerate(idx):
            u[i] = flat.views[0][j]
    uu = total([torch.dot(flat.data[0], flat.data[0]) for _, flat in buffers]) if with_update_norm else None
    return u, (gc, cc, uu)


def flat_dots(flat: Flat, projection: str) -> Tuple[Tensor, Tensor]:
    """(g . c, c . c) of `flat`'s W = [g; c]: 0-dim over the whole row ("global", one matrix-vector product), or one
    value per tensor ("per_tensor": g . c as one segmented sum of g * c, c . c from one multi-tensor norm, which
    reads c once instead of forming c * c)."""
    W = flat.data
    if projection == "global":
        s = torch.mv(W, W[1])
        return s[0], s[1]
    gc = torch.segment_reduce(W[0] * W[1], "sum", lengths=flat.lengths, unsafe=True)
    return gc, torch.stack(torch._foreach_norm(flat.views[1])).square()


def flat_orthogonalize_(flat: Flat, k: Tensor) -> None:
    """Row 0 of `flat`'s W = [g; c] becomes u = g - k c; k is 0-dim (one op over the row), or one value per tensor
    (one multi-tensor op over the row's views: no per-element copy of k)."""
    W = flat.data
    if k.dim() == 0:
        W[0].addcmul_(W[1], k, value=-1)
    else:
        torch._foreach_addcmul_(flat.views[0], flat.views[1], list(k.neg().unbind()))
