"""What OrthogonalAdamW, OrthogonalSGD and Orthogonal share around their step functions: hyper-parameter checks,
the parameters a step sees, the EMA in the per-parameter state, the diagnostics, reset and checkpoints.

The EMA c of each parameter is a plain tensor of its own, `self.state[p]["orth_ema"]`, in the optimizer's
per-parameter state (for the `Orthogonal` wrapper the wrapped optimizer's), so `state_dict()` and
`load_state_dict()` save and restore it with everything else. A parameter's first step creates it as zeros (c_0 = 0,
so u_1 = g_1) and marks it fresh for that step (`orth_init="first_grad"` then sets c_1 = g_1). torch's
`load_state_dict` casts every floating state tensor to its parameter's dtype; that would silently turn the fp32 EMA
of a bf16 parameter into bf16, so `load_state_dict` restores it from the saved tensor at full precision.

Diagnostics (`diagnostics=True`) are 0-dim tensors on the parameters' device, computed inside `step()` and read
when `diagnostics()` is converted with float(): cos(g_t, g_{t-1}) (diagnostics.GradCosine, which keeps the previous
gradient outside the state_dict), cos(g_t, c_{t-1}) and ||u_t|| / ||g_t||.
"""

from __future__ import annotations

import math
import warnings
from itertools import chain, groupby
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from raystream.optim.config import ORTH_INITS, PROJECTIONS
from raystream.optim.diagnostics import DIAGNOSTIC_KEYS, GradCosine
from raystream.optim.flat import Workspace
from raystream.optim.projection import Sums, ema_dtype
from raystream.optim.reductions import cosine, ratio

EMA_KEY = "orth_ema"


def check_hparam(name: str, value, ok: bool, expected: str) -> None:
    """torch.optim-style validation: the error names the hyper-parameter, its value and the allowed range."""
    if not ok:
        raise ValueError(f"Invalid {name}: {value!r} (expected {expected})")


def evaluate_closure(closure):
    """Run the closure (with autograd on) before anything reads p.grad: a projection computed before it would be
    of stale gradients, and one the base optimizer recomputes after it would be lost."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def gradients_by_group(opt) -> List[Tuple[dict, List[Tensor], List[Tensor]]]:
    """(group, params with a gradient, their raw gradients) per param group; sparse gradients are rejected."""
    out = []
    for i, group in enumerate(opt.param_groups):
        ps = [p for p in group["params"] if p.grad is not None]
        for p in ps:
            if p.grad.is_sparse:
                raise RuntimeError(
                    f"{type(opt).__name__} does not support sparse gradients (param group {i}, parameter of shape "
                    f"{tuple(p.shape)}): the cosine / projection needs dense dot products; use a dense embedding")
        out.append((group, ps, [p.grad for p in ps]))
    return out


def runs(groups: Sequence[Any]) -> List[Tuple[Any, List[int]]]:
    """(group, indices) of each run of parameters sharing one group object in a per-parameter list, in order: the
    multi-tensor paths call their kernels once per param group."""
    out, start = [], 0
    for group, members in groupby(groups, key=id):
        n = len(list(members))
        out.append((groups[start], list(range(start, start + n))))
        start += n
    return out


class OrthogonalMixin:
    """The EMA in the state, the diagnostics and the checkpoints of an `Optimizer` whose groups carry `orth_beta`."""

    def _init_orthogonal(self, projection: str, orth_init: str, orth_eps: float = 1e-8,
                         diagnostics: bool = False) -> None:
        check_hparam("projection", projection, projection in PROJECTIONS, "one of " + ", ".join(PROJECTIONS))
        check_hparam("orth_init", orth_init, orth_init in ORTH_INITS, "one of " + ", ".join(ORTH_INITS))
        self.projection, self.orth_init, self.orth_eps = projection, orth_init, orth_eps
        self._cosine: Optional[GradCosine] = GradCosine() if diagnostics else None
        self._diag: Dict[str, Tensor] = {}
        self._workspace = Workspace(rows=2)  # the multi-tensor projection's scratch [g; c]: never in the state
        if projection == "dim0":
            flat = [p for g in self.param_groups for p in g["params"]]
            bad = [tuple(p.shape) for p in flat if p.dim() == 0 or p.shape[0] == 1]
            if bad:
                warnings.warn(
                    f"projection='dim0' projects each length-d0 slice separately: {len(bad)} parameter(s) with first "
                    f"dimension 1 (shapes {bad[:4]}{'...' if len(bad) > 4 else ''}, e.g. cls_token, pos_embed) "
                    "get a zero update from step 2 on. Use projection='global' or 'per_tensor' to train them.",
                    stacklevel=3)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        beta = self.param_groups[-1]["orth_beta"]
        check_hparam("orth_beta", beta, 0 <= beta < 1, "0 <= orth_beta < 1")

    # ---- per step --------------------------------------------------------------------------------------------
    def _foreach(self) -> bool:
        """The multi-tensor path unless every group asked for foreach=False."""
        return {g.get("foreach") for g in self.param_groups} != {False}

    def _emas(self, params: Sequence[Tensor]) -> Tuple[List[Tensor], List[bool]]:
        """Each parameter's EMA and whether it is fresh (no value yet: a new tensor of zeros, not yet in the state;
        `_store_emas` puts it there)."""
        emas = [self.state[p].get(EMA_KEY) for p in params]
        fresh = [c is None for c in emas]
        emas = [torch.zeros_like(p, dtype=ema_dtype(p), memory_format=torch.preserve_format) if c is None else c
                for p, c in zip(params, emas)]
        return emas, fresh

    def _store_emas(self, params: Sequence[Tensor], emas: Sequence[Tensor], fresh: Sequence[bool]) -> None:
        for p, c, new in zip(params, emas, fresh):
            if new:
                self.state[p][EMA_KEY] = c

    def _cos_prev(self, params: Sequence[Tensor], grads: Sequence[Tensor]) -> Optional[Tensor]:
        """cos(g_t, g_{t-1}) with diagnostics on (before the step: the step may reuse the gradients' memory)."""
        return self._cosine.update(params, grads) if self._cosine is not None else None

    def _record_diagnostics(self, cos_prev: Optional[Tensor], sums: Sums) -> None:
        """This step's diagnostics from cos(g_t, g_{t-1}) and the step's g . c, c . c and u . u."""
        if self._cosine is not None:
            gc, cc, uu = sums
            gg = self._cosine.sq
            self._diag = {"grad_cos_prev": cos_prev, "grad_cos_ema": cosine(gc, gg, cc),
                          "update_norm_ratio": ratio(uu, gg)}

    # ---- public ------------------------------------------------------------------------------------------------
    def diagnostics(self) -> Dict[str, Tensor]:
        """{'grad_cos_prev', 'grad_cos_ema', 'update_norm_ratio'} of the last step as 0-dim tensors on the
        parameters' device (NaN where undefined); float() reads one (a device sync, outside step())."""
        if self._cosine is None:
            raise RuntimeError(f"{type(self).__name__} was built with diagnostics=False; pass diagnostics=True")
        if not self._diag:
            return {k: torch.tensor(math.nan) for k in DIAGNOSTIC_KEYS}
        return dict(self._diag)

    @torch.no_grad()
    def reset_orthogonal_state(self) -> None:
        """Drop the EMA (e.g. at a video boundary): the next step is unprojected and restarts c as step 1 does.
        (`grad_cos_prev` keeps tracking the raw stream.)"""
        for group in self.param_groups:
            for p in group["params"]:
                self.state.get(p, {}).pop(EMA_KEY, None)

    def diagnostics_state_dict(self) -> Dict[str, Any]:
        """The previous raw gradients `grad_cos_prev` compares with (outside `state_dict()`: only diagnostics need
        them), by parameter index as in `state_dict()`."""
        return self._cosine.state_dict(self._all_params()) if self._cosine is not None else {}

    def load_diagnostics_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore them after `load_state_dict` (which clears them): the first step after a restore has a cosine."""
        if self._cosine is not None:
            self._cosine.load_state_dict(self._all_params(), state)

    def _all_params(self) -> List[Tensor]:
        return list(chain.from_iterable(g["params"] for g in self.param_groups))

    def _restore_ema_precision(self, state_dict: dict) -> None:
        """Re-load each saved EMA at `ema_dtype(p)` after torch's load_state_dict cast it to the parameter dtype."""
        saved = state_dict["state"]
        ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        for i, p in zip(ids, params):
            c = saved.get(i, {}).get(EMA_KEY)
            if c is not None:
                self.state[p][EMA_KEY] = c.to(device=p.device, dtype=ema_dtype(p), copy=True)
        if self._cosine is not None:
            self._cosine.reset()

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._restore_ema_precision(state_dict)
