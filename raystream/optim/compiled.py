"""Algorithm 2 as one compiled step: projection, EMA and AdamW fused by torch.compile into two passes over memory.

The multi-tensor step (orthogonal.py) reads and writes each parameter-sized array about 19 times per step against
torch's fused AdamW kernel's 7: g and c are copied into the flat [g; c] scratch buffer, u_t is materialised, c is
updated in a pass of its own. Here the whole update is written once, element by element, and torch.compile
(inductor: C++ on CPU, Triton on GPU) turns it into one reduction pass (g . c and c . c of every tensor, reading g
and c) and one pass that reads p, g, c, m, v and writes p, c, m, v: 11 arrays, the physical bound of the global
projection.

    k   = (sum_i g_i . c_i) / (sum_i c_i . c_i)           (0 when c = 0; per tensor for projection="per_tensor")
    u_i = g_i - k c_i ;   c_i <- c_i + (1 - orth_beta)(g_i - c_i)
    AdamW on u_i as torch.optim.AdamW: p <- p (1 - lr wd) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

`compiled_orthogonal_adamw` takes the plain lists of orthogonal.orthogonal_adamw. lr and weight decay are 0-dim
tensors (kept by `CompiledStep`), so learning-rate and weight-decay schedules do not recompile; a new set of
parameter shapes or a changed beta does. The first compilation takes about a minute for a ViT on two CPU cores
(cached on disk by inductor afterwards). Every value stays on the device: no host sync.

The step is compiled with its own recompile limit, `RECOMPILE_LIMIT` graphs (dynamo's default, 8 per function,
is shared by every optimizer of the process; a run needs one or two graphs, a benchmark or a test process more).
`CompileTrace` keeps what the calls did: steps run compiled or eagerly, and, said once each on stderr with the
reason, a recompile (a graph beyond this optimizer's first) and a fallback to eager (past the limit, torch 2.13
raises `FailOnRecompileLimitHit` under fullgraph; the step then runs the same function uncompiled).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import torch
from torch import Tensor
from torch._dynamo.exc import FailOnRecompileLimitHit
from torch._dynamo.utils import counters, guard_failures

from raystream.optim.adamw_math import AdamWGroup
from raystream.optim.base import runs
from raystream.optim.projection import Sums, safe_ratio


class Group(NamedTuple):
    """One param group's tensors and constants as the compiled function sees them; `lr` and `weight_decay` are
    0-dim tensors, so schedules do not recompile."""

    params: List[Tensor]
    grads: List[Tensor]
    emas: List[Tensor]
    exp_avgs: List[Tensor]
    exp_avg_sqs: List[Tensor]
    lr: Tensor
    weight_decay: Tensor
    hyper: Tuple[float, float, float, float, bool]  # (beta1, beta2, eps, orth_beta, maximize)


# Per param group: 1 - lr wd, and per tensor lr / (1 - b1^t) and 1 / sqrt(1 - b2^t).
Scalars = Tuple[Tensor, Tensor, Tensor]


def dot_products(grads: Sequence[Tensor], emas: Sequence[Tensor]) -> Tensor:
    """(g_i . c_i, c_i . c_i) of every tensor, shape (n, 2): one pass reading g and c."""
    return torch.stack([torch.stack([torch.sum(g * c), torch.sum(c * c)]) for g, c in zip(grads, emas)])


def update_(groups: Sequence[Group], ks: Tensor, scalars: Sequence[Scalars],
            with_update_norm: bool) -> Optional[Tensor]:
    """u_i = g_i - k_i c_i, the EMA and AdamW on u_i, in place: one pass reading p, g, c, m, v and writing p, c, m,
    v. `ks` holds one k per tensor (the same value for the global projection). The bias corrections come in
    `scalars`, computed before the pass: a power evaluated inside it would be evaluated per element. Returns
    sum u . u (diagnostics)."""
    uus = []
    i = 0
    for group, (decay, step_size, inv_bc2) in zip(groups, scalars):
        beta1, beta2, eps, orth_beta, maximize = group.hyper
        for j, (p, g, c, m, v) in enumerate(zip(group.params, group.grads, group.emas, group.exp_avgs,
                                                group.exp_avg_sqs)):
            u = g - ks[i] * c
            i += 1
            c.lerp_(g, 1 - orth_beta)
            if with_update_norm:
                uus.append(torch.sum(u * u))
            if maximize:
                u = -u
            m.lerp_(u, 1 - beta1)
            v.mul_(beta2).addcmul_(u, u, value=1 - beta2)
            p.mul_(decay).sub_(step_size[j] * m / (v.sqrt() * inv_bc2[j] + eps))
    return torch.stack(uus).sum() if with_update_norm else None


RECOMPILE_LIMIT = 64  # graphs of the compiled step per process (dynamo's default recompile_limit: 8)

_compiled: Dict = {}


def _compiled_fn(fn):
    """`fn` compiled once per process, with its own recompile limit (inductor then caches a graph per set of shapes
    and flags)."""
    if fn not in _compiled:
        _compiled[fn] = torch.compile(fn, fullgraph=True, dynamic=False, recompile_limit=RECOMPILE_LIMIT,
                                      options={"size_asserts": False})
    return _compiled[fn]


def fused_step_(groups: Sequence[Group], scalars: Sequence[Scalars], projection: str,
                with_update_norm: bool) -> Tuple[Tensor, Tensor, Optional[Tensor], bool]:
    """The two passes and the projection coefficient between them: the function torch.compile sees. The last
    value says whether it ran compiled (dynamo traces `is_compiling()` as the constant True)."""
    dots = dot_products([g for group in groups for g in group.grads], [c for group in groups for c in group.emas])
    gc, cc = dots[:, 0].sum(), dots[:, 1].sum()
    ks = safe_ratio(gc, cc).expand(dots.shape[0]) if projection == "global" else safe_ratio(dots[:, 0], dots[:, 1])
    return gc, cc, update_(groups, ks, scalars, with_update_norm), torch.compiler.is_compiling()


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


def _last_reason() -> str:
    reasons = guard_failures.get(fused_step_.__code__) or ["not recorded by dynamo"]
    return " ".join(str(reasons[-1]).split())[:300]


def _run(args, trace: CompileTrace) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """`fused_step_(*args)` compiled, or eagerly once compiling is refused (said once, with the reason)."""
    if not trace.eager_reason:
        graphs = counters["stats"]["unique_graphs"]
        try:
            *out, compiled = _compiled_fn(fused_step_)(*args)
        except FailOnRecompileLimitHit:
            trace.eager_reason = (f"torch.compile hit its recompile limit ({RECOMPILE_LIMIT} graphs of the step in "
                                  f"this process; last reason: {_last_reason()})")
        else:
            if compiled:
                if trace.graphs is not None and counters["stats"]["unique_graphs"] > graphs:
                    trace.say_once("recompile", f"compiled its step again ({_last_reason()}); each new set of "
                                   "parameter shapes or hyper-parameters other than lr and weight decay costs one "
                                   "compilation")
                trace.graphs = counters["stats"]["unique_graphs"]
                trace.compiled += 1
                return tuple(out)
            trace.eager_reason = "dynamo did not compile it (TORCHDYNAMO_DISABLE or torch._dynamo.config.disable)"
        trace.say_once("eager", f"runs its step eagerly from here on, much slower than compiled: "
                       f"{trace.eager_reason}")
    *out, _ = fused_step_(*args)
    trace.eager += 1
    return tuple(out)


class CompiledStep:
    """What one optimizer's compiled steps keep between calls: the 0-dim lr and weight-decay tensors of each param
    group (refilled every step: a kernel argument, not a recompilation) and the `CompileTrace`."""

    def __init__(self):
        self.trace = CompileTrace()
        self._hyper: Dict[tuple, Tuple[Tensor, Tensor]] = {}

    def hyper(self, index: int, group: AdamWGroup, like: Tensor) -> Tuple[Tensor, Tensor]:
        """(lr, weight decay) of the index-th param group of the step as 0-dim tensors like `like`'s dtype and
        device (a kernel argument: refilled, never re-created, so they are the same graph inputs every step)."""
        key = (index, like.dtype, like.device)
        lr, wd = self._hyper.get(key) or self._hyper.setdefault(key, (like.new_zeros(()), like.new_zeros(())))
        lr.fill_(group.lr)
        wd.fill_(group.weight_decay)
        return lr, wd


def compiled_orthogonal_adamw(params: List[Tensor], grads: List[Tensor], emas: List[Tensor], exp_avgs: List[Tensor],
                              exp_avg_sqs: List[Tensor], steps: List[Tensor], groups: List[AdamWGroup], *,
                              projection: str, with_update_norm: bool, compiled: CompiledStep) -> Sums:
    """One Orthogonal-AdamW step of every parameter, in place, as the compiled passes: the step counters and bias
    corrections first (a few device ops per param group, whatever the number of tensors), then `fused_step_`, then
    the counters advance (one op: a step that failed to compile has changed nothing). Every EMA must hold a value
    (the first step runs the multi-tensor path). Returns (sum g . c, sum c . c, sum u . u or None); `compiled.trace`
    counts the steps run compiled and eagerly."""
    args, scalars = [], []
    for index, (group, idx) in enumerate(runs(groups)):
        lr, wd = compiled.hyper(index, group, params[idx[0]])
        t = torch.stack([steps[i] for i in idx]).to(lr.dtype) + 1
        scalars.append((1 - lr * wd, lr / (1 - group.beta1 ** t), torch.rsqrt(1 - group.beta2 ** t)))
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        args.append(Group(pick(params), pick(grads), pick(emas), pick(exp_avgs), pick(exp_avg_sqs), lr, wd,
                          (float(group.beta1), float(group.beta2), float(group.eps), float(group.orth_beta),
                           bool(group.maximize))))
    out = _run((args, scalars, projection, with_update_norm), compiled.trace)
    torch._foreach_add_(steps, 1)
    return out
