"""GradCosineTracker: cos(g_t, g_{t-1}) of raw gradients (the paper's Figures 1 and 3) for plain torch optimizers,
which do not compute it themselves. The orthogonal optimizers report it through `diagnostics()` instead.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Sequence

import torch
from torch import Tensor

from raystream.optim.reductions import cosine, dot, sq_norm, total


def prev_grads_state(params: Sequence[Tensor], prev: Dict[Tensor, Tensor]) -> Dict[str, Any]:
    """`{'prev_grads': {index: tensor}}`: the previous raw gradient of `params[index]` (those that have one)."""
    return {"prev_grads": {i: prev[p] for i, p in enumerate(params) if p in prev}}


def load_prev_grads(params: Sequence[Tensor], prev: Dict[Tensor, Tensor], state: Dict[str, Any]) -> None:
    """Refill `prev` from `prev_grads_state(...)` of the same parameters (after a restore from a checkpoint)."""
    prev.clear()
    for i, q in state.get("prev_grads", {}).items():
        p = params[int(i)]
        prev[p] = q.to(device=p.device, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)


class GradCosineTracker:
    """`update()` after backward (and before zero_grad) returns the cosine of this and the previous call's
    gradients over the whole parameter vector; NaN on the first call or when a gradient is zero.

    Accepts parameters or param-group dicts. Keeps one copy of the previous gradient per parameter.
    """

    def __init__(self, params: Iterable):
        items = list(params)
        if items and isinstance(items[0], dict):
            items = [p for group in items for p in group["params"]]
        self.params: List[Tensor] = items
        self._prev: Dict[Tensor, Tensor] = {}

    @torch.no_grad()
    def update(self) -> float:
        ps = [p for p in self.params if p.grad is not None and not p.grad.is_sparse]
        if not ps:
            return math.nan
        grads = [p.grad for p in ps]
        pairs = [(g, self._prev[p]) for p, g in zip(ps, grads) if p in self._prev]
        cos = math.nan
        if pairs:
            gq = total([dot(g, q) for g, q in pairs])
            cos = float(cosine(gq, sq_norm(grads), sq_norm([q for _, q in pairs])))
        for p, g in zip(ps, grads):
            q = self._prev.get(p)
            if q is None:
                self._prev[p] = g.detach().to(torch.float32 if g.dtype != torch.float64 else g.dtype, copy=True)
            else:
                q.copy_(g)
        return cos

    def reset(self) -> None:
        self._prev.clear()

    def diagnostics_state_dict(self) -> Dict[str, Any]:
        """The previous gradient, to save beside the optimizer so `update()` after a restore is defined."""
        return prev_grads_state(self.params, self._prev)

    def load_diagnostics_state_dict(self, state: Dict[str, Any]) -> None:
        load_prev_grads(self.params, self._prev, state)
