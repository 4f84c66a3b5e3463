"""Scalar reductions over lists of tensors (dot products, squared norms, cosines), kept on device as 0-dim tensors
so that nothing syncs with the host until a value is read.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor


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
