"""Where the orthogonal EMA lives and how a step projects: the mixin shared by OrthogonalAdamW, OrthogonalSGD and
Orthogonal.

The EMA c of each parameter is `self.state[p]["orth_ema"]`, in the optimizer's own per-parameter state, so it is
saved by `state_dict()` and restored by `load_state_dict()` with everything else (for the `Orthogonal` wrapper this
is the wrapped optimizer's state). torch's `load_state_dict` casts every floating state tensor to its parameter's
dtype; that would silently turn the fp32 EMA of a bf16 parameter into bf16, so `load_state_dict` restores it from
the saved tensor at full precision.

The multi-tensor path ("global" and "per_tensor" projections of fp32/fp64 parameters) keeps the EMAs of each
device as views into row 1 of one flat buffer W = [g; c] (flat.py): a step copies the gradients into row 0, takes
every dot product in one or two reductions, writes u into row 0 and advances c with one `_foreach_lerp_` per
orth_beta, so its op count does not depend on the number of parameters. `dim0`, half-precision parameters and
`foreach=False` use projection.py's per-tensor functions. No path reads a value back to the host.

Diagnostics (`diagnostics=True`) are 0-dim tensors on the parameters' device, computed inside `step()` and read
when `diagnostics()` is converted with float(): cos(g_t, g_{t-1}) (diagnostics.GradCosine, which keeps the previous
gradient outside the state_dict), cos(g_t, c_{t-1}) and ||u_t|| / ||g_t||.
"""

from __future__ import annotations

import math
import warnings
from itertools import chain
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from raystream.optim.config import ORTH_INITS, PROJECTIONS
from raystream.optim.diagnostics import DIAGNOSTIC_KEYS, GradCosine
from raystream.optim.flat import Flat, buckets
from raystream.optim.projection import (coefficients, ema_dtype, flat_dots, flat_orthogonalize_, orthogonalize,
                                        safe_ratio, update_ema)
from raystream.optim.reductions import cosine, ratio, sq_norm, total

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


def split(flat: list, groups) -> List[list]:
    """Cut a flat per-parameter list back into the param groups' pieces."""
    out, start = [], 0
    for _, ps, _ in groups:
        out.append(flat[start:start + len(ps)])
        start += len(ps)
    return out


def compact_emas(state_dict: dict) -> dict:
    """The state_dict with each EMA copied out of its flat buffer, so a checkpoint holds c and not the scratch row
    that shares its storage. The per-parameter dicts are copied too: torch's state_dict shares them with `state`."""
    state = {i: {**s, EMA_KEY: s[EMA_KEY].clone()} if EMA_KEY in s else s for i, s in state_dict["state"].items()}
    return {**state_dict, "state": state}


class OrthogonalMixin:
    """EMA bookkeeping and the projection for an `Optimizer` subclass whose groups carry `orth_beta`."""

    def _init_orthogonal(self, projection: str, orth_init: str, orth_eps: float = 1e-8,
                         diagnostics: bool = False) -> None:
        check_hparam("projection", projection, projection in PROJECTIONS, "one of " + ", ".join(PROJECTIONS))
        check_hparam("orth_init", orth_init, orth_init in ORTH_INITS, "one of " + ", ".join(ORTH_INITS))
        self.projection, self.orth_init, self.orth_eps = projection, orth_init, orth_eps
        self._cosine: Optional[GradCosine] = GradCosine() if diagnostics else None
        self._diag: Dict[str, Tensor] = {}
        self._flats: List[tuple] = []  # (indices into the step's params, Flat [g; c]) per device
        self._flat_key: Optional[tuple] = None  # ids of the parameters laid out in self._flats
        self._fresh: List[tuple] = []  # (EMA view, parameter index) of EMAs laid out without a value this step
        self._relaid = False  # the layout changed this step: _update_emas stores its views in the state
        self._pending: Optional[tuple] = None  # what _update_emas needs of the last _project
        self._flat_layout = True  # False: EMAs stay tensors of their own (a compiled step updates them in place)
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

    def _project(self, groups, foreach: bool) -> List[Tensor]:
        """u_t of every parameter with a gradient, in the order of `groups`: u_t = g_t - (g_t . c_{t-1}) /
        (c_{t-1} . c_{t-1}) c_{t-1} over the projection scope. u_t may be g_t itself (no EMA yet) or a view into a
        scratch buffer that the next step overwrites. `_update_emas()` then advances c."""
        params = [p for _, ps, _ in groups for p in ps]
        grads = [g for _, _, gs in groups for g in gs]
        betas = [group["orth_beta"] for group, ps, _ in groups for _ in ps]
        if not params:
            return []
        cos_prev = self._cosine.update(params, grads) if self._cosine is not None else None
        flat = foreach and self._flat_layout and self.projection != "dim0" and \
            all(g.dtype == ema_dtype(g) for g in grads)
        u, gc, cc, uu = (self._project_flat if flat else self._project_lists)(params, grads, foreach)
        self._pending = (params, grads, betas, foreach, flat)
        self._record_diagnostics(cos_prev, gc, cc, uu)
        return u

    def _record_diagnostics(self, cos_prev: Optional[Tensor], gc: Optional[Tensor], cc: Optional[Tensor],
                            uu: Optional[Tensor]) -> None:
        """This step's diagnostics from cos(g_t, g_{t-1}), g . c, c . c and u . u (with diagnostics on)."""
        if self._cosine is not None:
            gg = self._cosine.sq
            self._diag = {"grad_cos_prev": cos_prev, "grad_cos_ema": cosine(gc, gg, cc),
                          "update_norm_ratio": ratio(uu, gg)}

    def _update_emas(self) -> None:
        """c_t = beta c_{t-1} + (1 - beta) g_t of the RAW gradients of the last `_project`; a missing EMA starts as
        (1 - beta) g_t ("zero") or g_t ("first_grad"). Called after the base update: a base that initialises its
        state when `state[p]` is empty must find it empty at its first step."""
        if self._pending is None:
            return
        params, grads, betas, foreach, flat = self._pending
        self._pending = None
        if not flat:
            emas = [self.state[p].get(EMA_KEY) for p in params]
            for p, c in zip(params, update_ema(emas, grads, betas, self.orth_init == "first_grad", foreach)):
                self.state[p][EMA_KEY] = c
            return
        by_beta: Dict[float, Tuple[list, list]] = {}
        for idx, flat_buf in self._flats:
            for j, i in enumerate(idx):
                cs, gs = by_beta.setdefault(betas[i], ([], []))
                cs.append(flat_buf.views[1][j])
                gs.append(grads[i])
        for beta, (cs, gs) in by_beta.items():
            torch._foreach_lerp_(cs, gs, 1 - beta)
        if self._relaid:  # the layout is new: store its views as the EMAs
            if self._fresh and self.orth_init == "first_grad":
                torch._foreach_copy_([c for c, _ in self._fresh], [grads[i] for _, i in self._fresh])
            for idx, flat_buf in self._flats:
                for j, i in enumerate(idx):
                    self.state[params[i]][EMA_KEY] = flat_buf.views[1][j]
            self._fresh, self._relaid = [], False

    def _project_lists(self, params, grads, foreach):
        emas = [self.state[p].get(EMA_KEY) for p in params]
        ks, gc, cc = coefficients(grads, emas, self.projection, self.orth_eps)
        u = orthogonalize(grads, emas, ks, foreach)
        return u, gc, cc, (sq_norm(u) if self._cosine is not None else None)

    def _project_flat(self, params, grads, foreach):
        self._lay_out(params)
        parts = []
        for idx, flat in self._flats:
            torch._foreach_copy_(flat.views[0], [grads[i] for i in idx])
            parts.append(flat_dots(flat.data, self.projection, flat.lengths))
        if self.projection == "global":
            gc, cc = total([a for a, _ in parts]), total([b for _, b in parts])
            ks = [safe_ratio(gc, cc).to(flat.data.device) for _, flat in self._flats]
        else:
            gc, cc = total([a.sum() for a, _ in parts]), total([b.sum() for _, b in parts])
            ks = [safe_ratio(a, b) for a, b in parts]
        for (_, flat), k in zip(self._flats, ks):
            flat_orthogonalize_(flat.data, k, flat.segments if k.dim() else None)
        u: List[Optional[Tensor]] = [None] * len(params)
        for idx, flat in self._flats:
            for j, i in enumerate(idx):
                u[i] = flat.views[0][j]
        uu = total([torch.dot(flat.data[0], flat.data[0]) for _, flat in self._flats]) \
            if self._cosine is not None else None
        return u, gc, cc, uu

    def _lay_out(self, params) -> None:
        """Make sure self._flats holds these parameters' EMAs. They are laid out again (the EMAs copied in, a
        missing one as zeros, listed in self._fresh) when the set of parameters with a gradient changed, or an EMA
        was reset or loaded."""
        key = tuple(id(p) for p in params)
        if key == self._flat_key and all(self.state[params[i]].get(EMA_KEY) is flat.views[1][j]
                                         for idx, flat in self._flats for j, i in enumerate(idx)):
            return
        laid_out = {id(c) for _, flat in self._flats for c in flat.views[1]}
        for state in self.state.values():  # EMAs of the old layout own their memory again
            c = state.get(EMA_KEY)
            if c is not None and id(c) in laid_out:
                state[EMA_KEY] = c.clone()
        self._flats, self._flat_key, self._fresh = [], key, []
        for (_, dtype), idx in buckets(params, ema_dtype).items():
            flat = Flat([params[i] for i in idx], rows=2, dtype=dtype)
            for j, i in enumerate(idx):
                old = self.state[params[i]].get(EMA_KEY)
                if old is None:
                    self._fresh.append((flat.views[1][j], i))
                else:
                    flat.views[1][j].copy_(old)
            self._flats.append((idx, flat))
        self._relaid = True

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
        """Zero the EMA (e.g. at a video boundary): the next step is unprojected and restarts c as step 1 does.
        (The buffers are dropped and re-created at the next step; `grad_cos_prev` keeps tracking the raw stream.)"""
        for group in self.param_groups:
            for p in group["params"]:
                self.state.get(p, {}).pop(EMA_KEY, None)
        self._flats, self._flat_key = [], None

    def state_dict(self) -> dict:
        return compact_emas(super().state_dict())

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
                self.state[p][EMA_KEY] = c.to(device=p.device, dtype=ema_dtype(p))
        self._flats, self._flat_key = [], None
        if self._cosine is not None:
            self._cosine.reset()

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._restore_ema_precision(state_dict)
