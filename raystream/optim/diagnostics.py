"""cos(g_t, g_{t-1}) of raw gradients over the whole parameter vector (the paper's Figures 1 and 3).

`GradCosine` is the one implementation: the orthogonal optimizers' diagnostics, SlowerAdamW's slow-down factor and
`GradCosineTracker` (for plain torch optimizers) all use it. It copies the gradients into a flat buffer of two
rows that take turns as "this step" and "previous step", so a call is one multi-tensor copy and two dot products
(g . g and g . g_prev), and returns a 0-dim tensor on the gradients' device: no host sync.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Sequence

import torch
from torch import Tensor

from raystream.optim.flat import Flat, buckets
from raystream.optim.projection import ema_dtype
from raystream.optim.reductions import cosine, total

DIAGNOSTIC_KEYS = ("grad_cos_prev", "grad_cos_ema", "update_norm_ratio")


def nan_like(t: Tensor) -> Tensor:
    return torch.full((), math.nan, dtype=t.dtype, device=t.device)


class GradCosine:
    """`update(params, grads)` -> cos(g_t, g_{t-1}) as a 0-dim tensor; NaN on the first call, after `reset()`, when
    a gradient is zero, and when the set of parameters with a gradient differs from the previous call's.

    `sq` is ||g_t||^2 of the last call. `previous()` / `load_previous()` read and restore g_{t-1} (per parameter,
    fp32 for half-precision gradients), for optimizers that checkpoint it.
    """

    def __init__(self):
        self._key: Optional[tuple] = None
        self._params: List[Tensor] = []
        self._flats: List[tuple] = []  # (indices into params, Flat with rows [a; b])
        self._row = 0  # the row holding g_t after update()
        self._pending: Dict[int, Tensor] = {}
        self._prev_sq: Optional[Tensor] = None
        self.sq: Optional[Tensor] = None

    def update(self, params: Sequence[Tensor], grads: Sequence[Tensor]) -> Tensor:
        key = tuple(id(p) for p in params)
        fresh = key != self._key
        if fresh:
            self._build(params, grads, key)
            fresh = not self._adopt_pending(params)
        row = self._row = 1 - self._row
        sqs, dots = [], []
        for idx, flat in self._flats:
            torch._foreach_copy_(flat.views[row], [grads[i] for i in idx])
            g, prev = flat.data[row], flat.data[1 - row]
            sqs.append(torch.dot(g, g))
            dots.append(torch.dot(g, prev))
        gg = total(sqs)
        cos = nan_like(gg) if fresh else cosine(total(dots), gg, self._prev_sq)
        self._prev_sq = self.sq = gg
        return cos

    def _build(self, params, grads, key) -> None:
        self._key, self._params, self._row, self._prev_sq = key, list(params), 1, None
        self._flats = [(idx, Flat([grads[i] for i in idx], rows=2, dtype=dtype))
                       for (_, dtype), idx in buckets(grads, ema_dtype).items()]

    def _adopt_pending(self, params) -> bool:
        """Copy loaded previous gradients into the "previous" row; True when every parameter had one."""
        pending, self._pending = self._pending, {}
        if not pending or any(id(p) not in pending for p in params):
            return False
        prev = self._row  # update() writes g_t into the other row
        for idx, flat in self._flats:
            for j, i in enumerate(idx):
                flat.views[prev][j].copy_(pending[id(params[i])])
        sqs = [torch.dot(flat.data[prev], flat.data[prev]) for _, flat in self._flats]
        self._prev_sq = total(sqs)
        return True

    def previous(self) -> Dict[Tensor, Tensor]:
        """The last call's gradient per parameter (views into the buffer: clone to keep them)."""
        return {self._params[i]: flat.views[self._row][j] for idx, flat in self._flats for j, i in enumerate(idx)}

    def load_previous(self, previous: Dict[Tensor, Tensor]) -> None:
        """The next update() compares with these gradients (when they cover its parameters)."""
        self.reset()
        self._pending = {id(p): g for p, g in previous.items()}

    def reset(self) -> None:
        self._key, self._params, self._flats, self._prev_sq, self._pending = None, [], [], None, {}

    def state_dict(self, params: Sequence[Tensor]) -> Dict[str, Any]:
        """`{'prev_grads': {index: g_{t-1}}}`, indexed by position in `params` (as an optimizer's state_dict), so a
        restored run's first `update()` has a cosine."""
        index = {id(p): i for i, p in enumerate(params)}
        return {"prev_grads": {index[id(p)]: g.clone() for p, g in self.previous().items() if id(p) in index}}

    def load_state_dict(self, params: Sequence[Tensor], state: Dict[str, Any]) -> None:
        """Restore `state_dict(params)` of the same parameters."""
        self.load_previous({params[int(i)]: g.to(params[int(i)].device)
                            for i, g in state.get("prev_grads", {}).items()})


class GradCosineTracker:
    """`update()` after backward (and before zero_grad) returns the cosine of this and the previous call's
    gradients over the whole parameter vector, as a float (`update_on_device()`: as a 0-dim device tensor); NaN on the first call, when a gradient is zero, or when
    the set of parameters with a gradient changed. Accepts parameters or param-group dicts.
    """

    def __init__(self, params: Iterable):
        items = list(params)
        if items and isinstance(items[0], dict):
            items = [p for group in items for p in group["params"]]
        self.params: List[Tensor] = items
        self._cosine = GradCosine()

    def update(self) -> float:
        return float(self.update_on_device())

    @torch.no_grad()
    def update_on_device(self) -> Tensor:
        """`update()` as a 0-dim tensor on the gradients' device: no host sync (the training loop reads it back
        with the rest of its log window)."""
        ps = [p for p in self.params if p.grad is not None and not p.grad.is_sparse]
        if not ps:
            return torch.full((), math.nan, device=self.params[0].device if self.params else None)
        return self._cosine.update(ps, [p.grad for p in ps])

    def reset(self) -> None:
        self._cosine.reset()

    def diagnostics_state_dict(self) -> Dict[str, Any]:
        """The previous gradient, saved beside the optimizer so `update()` after a restore has a cosine."""
        return self._cosine.state_dict(self.params)

    def load_diagnostics_state_dict(self, state: Dict[str, Any]) -> None:
        self._cosine.load_state_dict(self.params, state)
