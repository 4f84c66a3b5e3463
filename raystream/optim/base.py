"""Where the orthogonal EMA lives and how it is kept: the mixin shared by OrthogonalAdamW, OrthogonalSGD, Orthogonal.

The EMA c of each parameter is `self.state[p]["orth_ema"]`, in the optimizer's own per-parameter state, so it is
saved by `state_dict()` and restored by `load_state_dict()` with everything else (for the `Orthogonal` wrapper this
is the wrapped optimizer's state). torch's `load_state_dict` casts every floating state tensor to its parameter's
dtype; that would silently turn the fp32 EMA of a bf16 parameter into bf16, so `load_state_dict` restores it from
the saved tensor at full precision.

Diagnostics (`diagnostics=True`) are computed inside `step()` from the projection's own dot products plus two
gradient norms, and kept as tensors until `diagnostics()` reads them; with `diagnostics=False` nothing extra runs.
`grad_cos_prev` needs the previous raw gradient, so diagnostics keep one more buffer per parameter (outside the
state_dict; `diagnostics_state_dict()` / `load_diagnostics_state_dict()` carry it across a checkpoint).
"""

from __future__ import annotations

import math
import warnings
from itertools import chain
from typing import Any, Dict, List, Tuple

import torch
from torch import Tensor

from raystream.optim.reductions import cosine, dot, ratio, sq_norm, total

EMA_KEY = "orth_ema"
DIAGNOSTIC_KEYS = ("grad_cos_prev", "grad_cos_ema", "update_norm_ratio")


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


class OrthogonalMixin:
    """EMA bookkeeping for an `Optimizer` subclass whose groups carry `orth_beta`."""

    def _init_orthogonal(self, projection: str, orth_init: str, orth_eps: float = 1e-8,
                         diagnostics: bool = False) -> None:
        from raystream.optim.orthogonal import ORTH_INITS, PROJECTIONS

        check_hparam("projection", projection, projection in PROJECTIONS, "one of " + ", ".join(PROJECTIONS))
        check_hparam("orth_init", orth_init, orth_init in ORTH_INITS, "one of " + ", ".join(ORTH_INITS))
        self.projection, self.orth_init, self.orth_eps = projection, orth_init, orth_eps
        self._diagnostics_enabled = bool(diagnostics)
        self._diag: Dict[str, Tensor] = {}
        self._uu: List[Tensor] = []
        self._prev_grads: Dict[Tensor, Tensor] = {}
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
    def _gradients(self):
        return gradients_by_group(self)

    def _foreach(self) -> bool:
        """The multi-tensor path unless every group asked for foreach=False."""
        return {g.get("foreach") for g in self.param_groups} != {False}

    def _coefficients(self, groups) -> Tuple[List, List]:
        """The EMAs c_{t-1} and the projection coefficients k (u = g - k c) of every parameter with a gradient."""
        from raystream.optim.orthogonal import coefficients

        params = [p for _, ps, _ in groups for p in ps]
        grads = [g for _, _, gs in groups for g in gs]
        emas = [self.state[p].get(EMA_KEY) for p in params]
        ks, gc, cc = coefficients(grads, emas, self.projection, self.orth_eps)
        if self._diagnostics_enabled:
            self._record_diagnostics(params, grads, gc, cc)
        return emas, ks

    def _project(self, groups, foreach: bool) -> List[Tensor]:
        """u_t for every parameter with a gradient, in the order of `groups`."""
        from raystream.optim.orthogonal import orthogonalize

        emas, ks = self._coefficients(groups)
        u = orthogonalize([g for _, _, gs in groups for g in gs], emas, ks, foreach)
        self._note_update_norm(u)
        return u

    def _note_update_norm(self, u: List[Tensor]) -> None:
        if self._diagnostics_enabled:
            self._uu.append(sq_norm(u))

    def _update_emas(self, groups, foreach: bool) -> None:
        from raystream.optim.orthogonal import update_ema

        params = [p for _, ps, _ in groups for p in ps]
        grads = [g for _, _, gs in groups for g in gs]
        betas = [group["orth_beta"] for group, ps, _ in groups for _ in ps]
        emas = [self.state[p].get(EMA_KEY) for p in params]
        new = update_ema(emas, grads, betas, first_grad=self.orth_init == "first_grad", foreach=foreach)
        for p, c in zip(params, new):
            self.state[p][EMA_KEY] = c

    def _record_diagnostics(self, params, grads, gc, cc) -> None:
        """Cosines over the whole parameter vector (gc = sum g . c, cc = sum c . c); ||u|| is added by the step."""
        gg = sq_norm(grads)
        pairs = [(g, self._prev_grads[p]) for p, g in zip(params, grads) if p in self._prev_grads]
        cos_prev = cosine(None, None, None)
        if pairs:
            gq = total([dot(g, q) for g, q in pairs])
            cos_prev = cosine(gq, gg, sq_norm([q for _, q in pairs]))
        self._diag = {"grad_cos_prev": cos_prev, "grad_cos_ema": cosine(gc, gg, cc), "gg": gg}
        self._uu = []
        for p, g in zip(params, grads):
            q = self._prev_grads.get(p)
            if q is None or q.shape != g.shape:
                self._prev_grads[p] = g.detach().to(torch.float64 if g.dtype == torch.float64 else torch.float32,
                                                    copy=True)
            else:
                q.copy_(g)

    # ---- public ------------------------------------------------------------------------------------------------
    def diagnostics(self) -> Dict[str, float]:
        """{'grad_cos_prev', 'grad_cos_ema', 'update_norm_ratio'} of the last step (NaN where undefined)."""
        if not self._diagnostics_enabled:
            raise RuntimeError(f"{type(self).__name__} was built with diagnostics=False; pass diagnostics=True")
        if not self._diag:
            return {k: math.nan for k in DIAGNOSTIC_KEYS}
        out = {k: float(self._diag[k]) for k in ("grad_cos_prev", "grad_cos_ema")}
        out["update_norm_ratio"] = float(ratio(total(self._uu), self._diag["gg"])) if self._uu else math.nan
        return out

    @torch.no_grad()
    def reset_orthogonal_state(self) -> None:
        """Zero the EMA (e.g. at a video boundary): the next step is unprojected and restarts c as step 1 does.
        (The buffers are dropped and re-created at the next step; `grad_cos_prev` keeps tracking the raw stream.)"""
        for group in self.param_groups:
            for p in group["params"]:
                self.state.get(p, {}).pop(EMA_KEY, None)

    def diagnostics_state_dict(self) -> Dict[str, Any]:
        """The previous raw gradients `grad_cos_prev` compares with, by parameter index as in `state_dict()`."""
        from raystream.optim.diagnostics import prev_grads_state

        return prev_grads_state(list(chain.from_iterable(g["params"] for g in self.param_groups)), self._prev_grads)

    def load_diagnostics_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore them (after `load_state_dict`, which clears them), so the first step after a restore has a
        `grad_cos_prev`."""
        from raystream.optim.diagnostics import load_prev_grads

        load_prev_grads(list(chain.from_iterable(g["params"] for g in self.param_groups)), self._prev_grads, state)

    def _restore_ema_precision(self, state_dict: dict) -> None:
        """Re-load each saved EMA at `ema_dtype(p)` after torch's load_state_dict cast it to the parameter dtype."""
        from raystream.optim.orthogonal import ema_dtype

        saved = state_dict["state"]
        ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        for i, p in zip(ids, params):
            c = saved.get(i, {}).get(EMA_KEY)
            if c is not None:
                self.state[p][EMA_KEY] = c.to(device=p.device, dtype=ema_dtype(p))

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._restore_ema_precision(state_dict)
        self._prev_grads.clear()
