"""The orthogonal projection u = g - k c and the EMA c, as pure functions of tensor lists (optax-style), shared by
OrthogonalAdamW, OrthogonalSGD and Orthogonal(base); with the flat buffers and the on-device reductions they need.

u = g - k c is written once per implementation of the step:
    `orthogonalize`        tensor by tensor (the single-tensor reference; also `dim0` and half-precision parameters),
                           after `coefficients` (the dot products, k);
    `flat_orthogonalize_`  on a flat scratch buffer W of shape (2, N) into which g (row 0) and c (row 1) of many
                           tensors are copied end to end (`Flat`, `Workspace`), after `flat_dots` (every dot product
                           in one or two reductions): a step costs the same few ops whatever the number of tensors;
    (the compiled step writes it element by element inside its fused pass: orthogonal_adamw.py).
`project_step` picks between the first two for an optimizer's step; `advance_emas_` (and `update_ema`) advance c.
Every result stays a tensor on the gradients' device (`dot`, `total`, `sq_norm`, `cosine`, `ratio`): nothing here
reads a value back to the host.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

PROJECTIONS = ("global", "per_tensor", "dim0")  # the scope of the dot products (orthogonal_adamw.py's docstring)
ORTH_INITS = ("zero", "first_grad")  # c_1 = (1 - beta) g_1 (the paper) or g_1 (the published code)

# (sum g . c, sum c . c, sum u . u) of a step, for the diagnostics: None where not computed
Sums = Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]


def ema_dtype(p: Tensor) -> torch.dtype:
    """The EMA is kept in fp32 for half-precision parameters, else in the parameter's dtype."""
    return torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype


def safe_ratio(gc: Tensor, cc: Tensor) -> Tensor:
    """(g . c) / (c . c), elementwise, and 0 where c = 0 so that u = g exactly."""
    nonzero = cc > 0
    return torch.where(nonzero, gc / torch.where(nonzero, cc, torch.ones_like(cc)), torch.zeros_like(cc))


def dot(a: Tensor, b: Tensor) -> Tensor:
    """a . b over all elements, accumulated in b's dtype (the EMA's: fp32 for a bf16 gradient)."""
    return torch.dot(a.reshape(-1).to(b.dtype), b.reshape(-1))


def total(scalars: Sequence[Tensor]) -> Tensor:
    """Sum of 0-dim tensors that may live on several devices / dtypes, on the first one's device."""
    first = scalars[0]
    if len(scalars) == 1:
        return first
    dtype = first.dtype
    for s in scalars[1:]:
        dtype = torch.promote_types(dtype, s.dtype)
    return torch.stack([s.to(first.device, dtype) for s in scalars]).sum()


def sq_norm(tensors: Sequence[Tensor]) -> Tensor:
    """sum of ||t||^2 over tensors (fp32 at least)."""
    norms = torch._foreach_norm([t if t.dtype in (torch.float32, torch.float64) else t.float() for t in tensors])
    return total([n * n for n in norms])


def cosine(ab: Optional[Tensor], aa: Optional[Tensor], bb: Optional[Tensor]) -> Tensor:
    """ab / sqrt(aa bb); NaN where undefined (a missing or zero vector)."""
    if ab is None or aa is None or bb is None:
        return torch.tensor(float("nan"))
    denom = (aa.to(ab.device) * bb.to(ab.device)).sqrt()
    return torch.where(denom > 0, ab / denom, torch.full_like(denom, float("nan")))


def ratio(uu: Tensor, gg: Tensor) -> Tensor:
    """sqrt(uu / gg) = ||u|| / ||g||; NaN when g = 0."""
    return torch.where(gg > 0, (uu / gg).sqrt(), torch.full_like(gg, float("nan")))


class Flat:
    """`data`, of shape (rows, N) with N the tensors' total size (each row contiguous), and for each row a view shaped
    like each tensor (`views[r][i]`): `torch._foreach_copy_(flat.views[r], grads)` fills a row in one op, and a sum
    over every tensor is one reduction of a row."""

    def __init__(self, tensors: Sequence[Tensor], rows: int, dtype: torch.dtype):
        sizes = [t.numel() for t in tensors]
        device = tensors[0].device
        n = sum(sizes)
        # rows start 256-byte aligned: a dot product of the same data gives the same bits in either row (SIMD
        # reductions round by alignment), so a restored previous gradient reproduces an uninterrupted run
        self.data = torch.zeros(rows, -(-n // 64) * 64, dtype=dtype, device=device)[:, :n]
        self.views: List[List[Tensor]] = [list(row.split(sizes)) for row in self.data]
        for row in self.views:
            for i, t in enumerate(tensors):
                row[i] = row[i].view(t.shape)
        self.lengths = torch.tensor(sizes, dtype=torch.long, device=device)


def buckets(tensors: Sequence[Tensor], dtype_of: Callable[[Tensor], torch.dtype]) -> Dict[Tuple, List[int]]:
    """Indices of `tensors` by (device, dtype_of(tensor)), in order: the tensors one flat buffer can hold."""
    out: Dict[Tuple, List[int]] = {}
    for i, t in enumerate(tensors):
        out.setdefault((t.device, dtype_of(t)), []).append(i)
    return out


class Workspace:
    """Scratch flat buffers for one step, kept for the next step while the tensors' layout (shapes, dtypes, devices)
    is the same, so a steady run allocates nothing. A step copies into them and reads out of them; nothing else points
    into them (an optimizer's state never does), so a changed layout only means new buffers."""

    def __init__(self, rows: int):
        self.rows = rows
        self._layout: Optional[tuple] = None
        self._buffers: List[Tuple[List[int], Flat]] = []

    def buffers(self, tensors: Sequence[Tensor], dtype_of: Callable[[Tensor], torch.dtype]) -> List[Tuple[List[int],
                                                                                                       Flat]]:
        """(indices into `tensors`, Flat of `rows` rows) per (device, dtype_of) bucket of `tensors`."""
        layout = tuple((t.shape, t.dtype, t.device) for t in tensors)
        if layout != self._layout:
            self._layout = layout
            self._buffers = [(idx, Flat([tensors[i] for i in idx], rows=self.rows, dtype=dtype))
                             for (_, dtype), idx in buckets(tensors, dtype_of).items()]
        return self._buffers


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
