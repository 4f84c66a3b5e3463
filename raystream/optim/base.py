"""What the optimizers keep beside torch's state and share around their step: the EMA in the per-parameter state,
the diagnostics beside it, reset and checkpoints (`OrthogonalMixin`, used by OrthogonalAdamW, OrthogonalSGD and
Orthogonal), cos(g_t, g_{t-1}) (`GradCosine`), hyper-parameter checks and the parameters a step sees.

The EMA c of each parameter is a plain tensor of its own, `self.state[p]["orth_ema"]`, in the optimizer's
per-parameter state (for the `Orthogonal` wrapper the wrapped optimizer's), so `state_dict()` and
`load_state_dict()` save and restore it with everything else. A parameter's first step creates it as zeros (c_0 = 0,
so u_1 = g_1) and marks it fresh for that step (`orth_init="first_grad"` then sets c_1 = g_1). torch's
`load_state_dict` casts every floating state tensor to its parameter's dtype; that would silently turn the fp32 EMA
of a bf16 parameter into bf16, so `load_state_dict` restores it from the saved tensor at full precision.

Diagnostics (`diagnostics=True`) are 0-dim tensors on the parameters' device, computed inside `step()` and read
when `diagnostics()` is converted with float(): cos(g_t, g_{t-1}), cos(g_t, c_{t-1}) and ||u_t|| / ||g_t||.
cos(g_t, g_{t-1}) of raw gradients over the whole parameter vector (the paper's Figures 1 and 3) has one
implementation, `GradCosine`: the orthogonal optimizers' diagnostics, SlowerAdamW's slow-down factor and
`GradCosineTracker` (for plain torch optimizers) all use it. It copies the gradients into a flat buffer of two rows
that take turns as "this step" and "previous step", so a call is one multi-tensor copy and two dot products (g . g
and g . g_prev), and returns a 0-dim tensor on the gradients' device: no host sync; it keeps the previous gradient
outside the state_dict.

`run_compiled` runs a step function compiled (OrthogonalAdamW(compile=True)), with its own recompile limit, and
eagerly once compiling is refused; `CompileTrace` keeps what the calls did and says a recompile and a fallback to
eager once each on stderr, with dynamo's reason.
"""

from __future__ import annotations

import inspect
import math
import sys
import warnings
from dataclasses import dataclass, field
from itertools import chain, groupby
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import torch
from torch import Tensor

from raystream.optim.projection import (ORTH_INITS, PROJECTIONS, Flat, Sums, Workspace, buckets, cosine, ema_dtype,
                                        ratio, total)

EMA_KEY = "orth_ema"
DIAGNOSTIC_KEYS = ("grad_cos_prev", "grad_cos_ema", "update_norm_ratio")
RECOMPILE_LIMIT = 64  # graphs of a compiled step per process (dynamo's default recompile_limit: 8)



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
    gradients over the whole parameter vector, as a float (`update_on_device()`: as a 0-dim device tensor); NaN on
    the first call, when a gradient is zero, or when the set of parameters with a gradient changed. Accepts
    parameters or param-group dicts.
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


# ---- what a compiled step keeps (OrthogonalAdamW(compile=True)): its own recompile limit, RECOMPILE_LIMIT graphs
# (dynamo's default, 8 per function, is shared by every optimizer of the process), lr / wd tensors and a trace
_compiled: Dict = {}


def _compiled_fn(fn):
    """`fn` compiled once per process with its own recompile limit (inductor caches a graph per shapes and flags)."""
    if fn not in _compiled:
        limit = {"recompile_limit": RECOMPILE_LIMIT}
        if "recompile_limit" not in inspect.signature(torch.compile).parameters:  # torch < 2.13: a process-wide one
            config, limit = torch._dynamo.config, {}
            name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
            setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
        _compiled[fn] = torch.compile(fn, fullgraph=True, dynamic=False, options={"size_asserts": False}, **limit)
    return _compiled[fn]


@dataclass
class CompileTrace:
    """What one optimizer's compiled steps did: how many ran compiled and eagerly, and what was said (once)."""

    compiled: int = 0
    eager: int = 0
    eager_reason: str = ""
    graphs: Optional[int] = None  # dynamo's graph count after this optimizer's first compiled step
    said: Set[str] = field(default_factory=set)

    def say_once(self, kind: str, message: str) -> None:
        if kind not in self.said:
            self.said.add(kind)
            print(f"raystream: WARNING: OrthogonalAdamW(compile=True) {message}", file=sys.stderr, flush=True)

    def summary(self) -> str:
        """E.g. 'ran compiled (4 steps)' or 'ran eagerly in 3 of 7 steps: <reason>'."""
        if not self.eager:
            return f"ran compiled ({self.compiled} steps)"
        return f"ran eagerly in {self.eager} of {self.compiled + self.eager} steps: {self.eager_reason}"


def _last_reason(fn) -> str:
    reasons = torch._dynamo.utils.guard_failures.get(fn.__code__) or ["not recorded by dynamo"]
    return " ".join(str(reasons[-1]).split())[:300]


def run_compiled(fn, args, trace: CompileTrace) -> tuple:
    """`fn(*args)` compiled, or eagerly once compiling is refused (said once, with the reason). `fn` returns its
    results and, last, `torch.compiler.is_compiling()` (which dynamo traces as the constant True)."""
    if not trace.eager_reason:
        # torch._dynamo is imported on first use (torch loads it lazily): an import of 2-4 s every process with an
        # optimizer would pay otherwise, compiled or not
        counters, recompile_limit_hit = torch._dynamo.utils.counters, torch._dynamo.exc.FailOnRecompileLimitHit
        graphs = counters["stats"]["unique_graphs"]
        try:
            *out, compiled = _compiled_fn(fn)(*args)
        except recompile_limit_hit:
            trace.eager_reason = (f"torch.compile hit its recompile limit ({RECOMPILE_LIMIT} graphs of the step in "
                                  f"this process; last reason: {_last_reason(fn)})")
        else:
            if compiled:
                if trace.graphs is not None and counters["stats"]["unique_graphs"] > graphs:
                    trace.say_once("recompile", f"compiled its step again ({_last_reason(fn)}); each new set of "
                                   "parameter shapes or hyper-parameters other than lr and weight decay costs one "
                                   "compilation")
                trace.graphs = counters["stats"]["unique_graphs"]
                trace.compiled += 1
                return tuple(out)
            trace.eager_reason = "dynamo did not compile it (TORCHDYNAMO_DISABLE or torch._dynamo.config.disable)"
        trace.say_once("eager", f"runs its step eagerly from here on, much slower than compiled: "
                       f"{trace.eager_reason}")
    *out, _ = fn(*args)
    trace.eager += 1
    return tuple(out)


class CompiledStep:
    """What one optimizer's compiled steps keep between calls: the 0-dim lr and weight-decay tensors of each param
    group (refilled every step: a kernel argument, not a recompilation) and the `CompileTrace`."""

    def __init__(self):
        self.trace = CompileTrace()
        self._hyper: Dict[tuple, Tuple[Tensor, Tensor]] = {}

    def hyper(self, index: int, group, like: Tensor) -> Tuple[Tensor, Tensor]:
        """(`group.lr`, `group.weight_decay`) of the step's index-th param group as 0-dim tensors like `like`'s dtype
        and device (a kernel argument: refilled, never re-created, so they are the same graph inputs every step)."""
        key = (index, like.dtype, like.device)
        lr, wd = self._hyper.get(key) or self._hyper.setdefault(key, (like.new_zeros(()), like.new_zeros(())))
        lr.fill_(group.lr)
        wd.fill_(group.weight_decay)
        return lr, wd
