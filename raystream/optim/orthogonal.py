"""Orthogonal-AdamW, the paper's Algorithm 2 (Han et al., "Learning from Streaming Video with Orthogonal Gradients",
CVPR 2025).

At step t, with raw gradient g_t and c an EMA of past RAW gradients (factor beta = `orth_beta`):

    u_t = g_t - (g_t . c_{t-1}) / (c_{t-1} . c_{t-1}) * c_{t-1}      (u_t = g_t exactly when c_{t-1} = 0)
    c_t = beta * c_{t-1} + (1 - beta) * g_t                           (`orth_init="zero"`: c_0 = 0)
    m_t = b1 m + (1 - b1) u_t ;  v_t = b2 v + (1 - b2) u_t^2 ;  theta <- theta - lr wd theta
    theta <- theta - lr m_t / (1 - b1^t) / (sqrt(v_t / (1 - b2^t)) + eps)
(Algorithm 1, Orthogonal-SGD: theta <- theta - lr u_t; see sgd.py.)

`projection` is the scope of the dot products:
  "global"     one projection over the whole parameter vector (all groups, all tensors): the paper's equations;
  "per_tensor" one projection per parameter tensor;
  "dim0"       the authors' published code: for g of shape [d0, *rest], one projection per length-d0 slice,
               cos = F.cosine_similarity(g, c, dim=0, eps), u = g - cos * ||g||_dim0 * F.normalize(c, dim=0, eps).
               A tensor whose first dimension is 1 (cls_token, [1, N, D] pos_embed) gets u = 0 from step 2 on.
`orth_init`: "zero" (the paper: c_1 = (1 - beta) g_1) or "first_grad" (the published code: c_1 = g_1). Step 1 is
never projected. `projection="dim0", orth_init="first_grad"` reproduces the published code.

Gradients are projected where `step()` sees them: after DDP has all-reduced (averaged) them across workers, so every
worker projects the same global gradient against the same EMA.

Shaped like torch.optim.adamw: the class gathers plain lists (params, grads, EMAs, moments, step counters, each
parameter's group) and `orthogonal_adamw` dispatches them to one of three implementations of the same step:
  `single_tensor_orthogonal_adamw`  the equations above, one tensor at a time: the reference;
  `multi_tensor_orthogonal_adamw`   the projection as a few whole-model ops (projection.project_step), then
                                    torch's fused AdamW kernel (or its foreach ops) on u_t, then the EMAs;
  `compiled_orthogonal_adamw`       the whole step as two torch.compile'd passes over memory (compiled.py).
The state they update is `self.state[p]`'s own tensors: "step", "exp_avg", "exp_avg_sq", "orth_ema".
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch._dynamo.exc import BackendCompilerFailed
from torch.optim import Optimizer

from raystream.optim.adamw_math import (AdamWGroup, adamw_foreach, adamw_fused, adamw_single, fused_supported,
                                        init_adamw_state)
from raystream.optim.base import OrthogonalMixin, check_hparam, evaluate_closure, gradients_by_group, runs
from raystream.optim.compiled import CompiledStep, compiled_orthogonal_adamw
from raystream.optim.flat import Workspace
from raystream.optim.projection import Sums, advance_emas_, coefficients, project_step
from raystream.optim.reductions import sq_norm

IMPLEMENTATIONS = ("single", "foreach", "compiled")


def orthogonal_adamw(params: List[Tensor], grads: List[Tensor], emas: List[Tensor], exp_avgs: List[Tensor],
                     exp_avg_sqs: List[Tensor], steps: List[Tensor], groups: List[AdamWGroup], fresh: List[bool], *,
                     projection: str = "global", orth_init: str = "zero", orth_eps: float = 1e-8,
                     impl: str = "foreach", with_update_norm: bool = False, workspace: Optional[Workspace] = None,
                     compiled: Optional[CompiledStep] = None) -> Sums:
    """One Orthogonal-AdamW step of every listed parameter, in place (the functional form, as torch's `adamw`).

    The lists run over the parameters with a gradient of every param group (the "global" projection spans them
    all); `groups[i]` is the hyper-parameters of params[i]'s group and `fresh[i]` says that emas[i] holds no value
    yet (zeros). `impl` picks the implementation: "single", "foreach" (with an optional `workspace` kept between
    steps) or "compiled" (every EMA must hold a value; `compiled` keeps its state). Returns the step's (sum g . c,
    sum c . c, sum u . u if `with_update_norm`) for the diagnostics.
    """
    kwargs = dict(projection=projection, orth_init=orth_init, orth_eps=orth_eps, with_update_norm=with_update_norm)
    if impl == "single":
        return single_tensor_orthogonal_adamw(params, grads, emas, exp_avgs, exp_avg_sqs, steps, groups, fresh,
                                              **kwargs)
    if impl == "foreach":
        return multi_tensor_orthogonal_adamw(params, grads, emas, exp_avgs, exp_avg_sqs, steps, groups, fresh,
                                             workspace=workspace or Workspace(rows=2), **kwargs)
    if impl == "compiled":
        if any(fresh):
            raise ValueError("impl='compiled' needs every EMA to hold a value (run the first step with 'foreach')")
        return compiled_orthogonal_adamw(params, grads, emas, exp_avgs, exp_avg_sqs, steps, groups,
                                         projection=projection, with_update_norm=with_update_norm,
                                         compiled=compiled or CompiledStep())
    raise ValueError(f"Invalid impl: {impl!r} (expected one of {', '.join(IMPLEMENTATIONS)})")


def single_tensor_orthogonal_adamw(params: List[Tensor], grads: List[Tensor], emas: List[Tensor],
                                   exp_avgs: List[Tensor], exp_avg_sqs: List[Tensor], steps: List[Tensor],
                                   groups: List[AdamWGroup], fresh: List[bool], *, projection: str, orth_init: str,
                                   orth_eps: float, with_update_norm: bool) -> Sums:
    """Algorithm 2, one tensor at a time: the reference the other implementations are tested against.

        k_i = (g_t . c_{t-1}) / (c_{t-1} . c_{t-1})     over the projection scope of tensor i (0 when c_{t-1} = 0)
        u_t = g_t - k_i c_{t-1}
        c_t = beta c_{t-1} + (1 - beta) g_t              (a fresh EMA: c_0 = 0; c_1 = g_1 under first_grad)
        AdamW on u_t: m, v, theta as torch.optim.AdamW   (adamw_math.adamw_single)
    """
    ks, gc, cc = coefficients(grads, emas, projection, orth_eps)  # the dot products come before any update
    us = []  # u_t of every tensor, kept only for the diagnostics' ||u_t||
    for i, (p, g, c, m, v, step, group) in enumerate(zip(params, grads, emas, exp_avgs, exp_avg_sqs, steps,
                                                         groups)):
        u = torch.addcmul(g, c, ks[i], value=-1).to(g.dtype)
        if with_update_norm:
            us.append(u)  # adamw_single does not write into u
        c.lerp_(g.to(c.dtype), 1.0 if fresh[i] and orth_init == "first_grad" else 1.0 - group.orth_beta)
        adamw_single([p], [u], [m], [v], [step], **group.kwargs())
    return gc, cc, (sq_norm(us) if with_update_norm else None)


def multi_tensor_orthogonal_adamw(params: List[Tensor], grads: List[Tensor], emas: List[Tensor],
                                  exp_avgs: List[Tensor], exp_avg_sqs: List[Tensor], steps: List[Tensor],
                                  groups: List[AdamWGroup], fresh: List[bool], *, projection: str, orth_init: str,
                                  orth_eps: float, with_update_norm: bool, workspace: Workspace) -> Sums:
    """Algorithm 2 with multi-tensor ops: u_t of every tensor (projection.project_step: a few whole-model ops
    through the workspace), AdamW on u_t per param group (torch's fused kernel, or its foreach ops with
    fused=False), then c_t for every EMA. The op count does not depend on the number of tensors."""
    u, sums = project_step(grads, emas, projection, orth_eps, workspace, with_update_norm)
    scratch = all(a is not b for a, b in zip(u, grads))  # u is ours to overwrite: the AdamW workspace
    for group, idx in runs(groups):
        kernel = adamw_fused if group.fused else adamw_foreach
        kernel(*([xs[i] for i in idx] for xs in (params, u, exp_avgs, exp_avg_sqs, steps)), scratch=scratch,
               **group.kwargs())
    advance_emas_(emas, grads, [group.orth_beta for group in groups], fresh, orth_init == "first_grad")
    return sums


class OrthogonalAdamW(OrthogonalMixin, Optimizer):
    """Algorithm 2: AdamW driven by the gradient's component orthogonal to the EMA of past gradients.

    Extra state over torch.optim.AdamW: exactly one buffer per parameter, `state[p]["orth_ema"]` (fp32 for
    bf16/fp16 parameters). Param groups may set their own lr, betas, eps, weight_decay and orth_beta.
    Implementations (see `orthogonal_adamw`): the multi-tensor path (default) projects with a few whole-model ops
    and then runs torch's fused AdamW kernel on u_t (`fused=None`: wherever torch supports it) or torch._foreach_
    AdamW ops (`fused=False`); `foreach=False` is the single-tensor reference path. `compile=True` fuses
    projection, EMA and AdamW with torch.compile (fp32/fp64 parameters on one device, "global" or "per_tensor"
    projection): the fastest path once compiled, at a compilation of about a minute at the second step. All agree
    to rounding.
    """

    def __init__(self, params, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, orth_beta: float = 0.9, projection: str = "global",
                 orth_init: str = "zero", *, maximize: bool = False, foreach: Optional[bool] = None,
                 fused: Optional[bool] = None, diagnostics: bool = False, compile: bool = False):
        check_hparam("lr", lr, lr >= 0, ">= 0")
        check_hparam("eps", eps, eps >= 0, ">= 0")
        check_hparam("weight_decay", weight_decay, weight_decay >= 0, ">= 0")
        check_hparam("betas[0]", betas[0], 0 <= betas[0] < 1, "in [0, 1)")
        check_hparam("betas[1]", betas[1], 0 <= betas[1] < 1, "in [0, 1)")
        check_hparam("fused", fused, not (fused and foreach is False),
                     "not True together with foreach=False (the fused kernel is a multi-tensor path)")
        check_hparam("compile", compile, not compile or (foreach is not False and fused is not False),
                     "False with foreach=False or fused=False (the compiled step is the fused multi-tensor path)")
        check_hparam("compile", compile, not compile or projection in ("global", "per_tensor"),
                     f"False with projection={projection!r} (it compiles the 'global' and 'per_tensor' projections)")
        self.compile = compile
        self._compiled = CompiledStep()
        self.compile_trace = self._compiled.trace  # compile=True: steps run compiled / eagerly, and why
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, orth_beta=orth_beta,
                        maximize=maximize, foreach=foreach, fused=fused)
        super().__init__(params, defaults)
        self._init_orthogonal(projection, orth_init, orth_eps=eps, diagnostics=diagnostics)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]  # resolve fused=None once: the step counters' device depends on it
        if group["fused"] is None:
            group["fused"] = group["foreach"] is not False and fused_supported(group["params"])
        elif group["fused"] and not fused_supported(group["params"]):
            raise ValueError("Invalid fused: True (torch's fused AdamW does not support these parameters' devices "
                             "or dtypes)")
        if self.compile:  # set before Optimizer.__init__ adds the first groups
            bad = sorted({str(p.dtype) for p in group["params"] if p.dtype not in (torch.float32, torch.float64)})
            devices = {p.device for g in self.param_groups for p in g["params"]}
            check_hparam("compile", True, not bad, f"False with {', '.join(bad)} parameters (the compiled step "
                         "takes fp32/fp64 parameters; train in bf16 with autocast, which keeps them fp32)")
            check_hparam("compile", True, len(devices) == 1, "False with parameters on several devices "
                         f"({', '.join(sorted(map(str, devices)))})")

    def _init_group(self):
        """The step's plain lists over every param group's parameters with a gradient; a parameter's first step
        creates its AdamW state and its EMA (zeros, fresh)."""
        params, grads, groups = [], [], []
        for group, ps, gs in gradients_by_group(self):
            hyper = AdamWGroup.of(group)
            for p in ps:
                init_adamw_state(self.state[p], p, fused=group["fused"])
            params += ps
            grads += gs
            groups += [hyper] * len(ps)
        emas, fresh = self._emas(params)
        self._store_emas(params, emas, fresh)
        states = [self.state[p] for p in params]
        return (params, grads, emas, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                [s["step"] for s in states], groups, fresh)

    def _impl(self, fresh: List[bool]) -> str:
        if not self._foreach():
            return "single"
        return "compiled" if self.compile and not any(fresh) else "foreach"

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)  # first: the projection must see the gradients the closure produces
        params, grads, emas, exp_avgs, exp_avg_sqs, steps, groups, fresh = self._init_group()
        if not params:
            return loss
        cos_prev = self._cos_prev(params, grads)
        impl = self._impl(fresh)
        try:
            sums = orthogonal_adamw(params, grads, emas, exp_avgs, exp_avg_sqs, steps, groups, fresh,
                                    projection=self.projection, orth_init=self.orth_init, orth_eps=self.orth_eps,
                                    impl=impl, with_update_norm=self._cosine is not None,
                                    workspace=self._workspace, compiled=self._compiled)
        except BackendCompilerFailed as e:
            raise RuntimeError(
                f"OrthogonalAdamW(compile=True): torch.compile could not build the fused step "
                f"({str(e).strip().splitlines()[0][:300]}). Inductor needs a C++ compiler on CPU and Triton on GPU; "
                "set compile=False (optimizer.compile=false) to use the stock-op step.") from e
        self._record_diagnostics(cos_prev, sums)
        return loss
