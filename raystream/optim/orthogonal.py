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
worker projects the same global gradient against the same EMA. The projection and the EMA are base.py's (maths in
projection.py); the AdamW update is adamw_math.py's. `compile=True` runs the same step as one torch.compile'd
function (compiled.py), from the second step on (the first creates the state and is never projected).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch._dynamo.exc import BackendCompilerFailed
from torch.optim import Optimizer

from raystream.optim.adamw_math import adamw_foreach, adamw_fused, adamw_single, fused_supported, init_adamw_state
from raystream.optim.base import EMA_KEY, OrthogonalMixin, check_hparam, evaluate_closure, split
from raystream.optim.compiled import CompileTrace, Group, orthogonal_adamw_


class OrthogonalAdamW(OrthogonalMixin, Optimizer):
    """Algorithm 2: AdamW driven by the gradient's component orthogonal to the EMA of past gradients.

    Extra state over torch.optim.AdamW: exactly one buffer per parameter, `state[p]["orth_ema"]` (fp32 for
    bf16/fp16 parameters). Param groups may set their own lr, betas, eps, weight_decay and orth_beta.
    Implementations: the multi-tensor path (default) projects with a few whole-model ops and then runs torch's fused
    AdamW kernel on u_t (`fused=None`: wherever torch supports it) or torch._foreach_ AdamW ops (`fused=False`);
    `foreach=False` is the single-tensor reference path. `compile=True` fuses projection, EMA and AdamW with
    torch.compile (fp32/fp64 parameters on one device, "global" or "per_tensor" projection): the fastest path once
    compiled, at a first-step compilation of about a minute. All agree to rounding.
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
        self.compile_trace = CompileTrace()  # compile=True: steps run compiled / eagerly, and why
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, orth_beta=orth_beta,
                        maximize=maximize, foreach=foreach, fused=fused)
        super().__init__(params, defaults)
        self._init_orthogonal(projection, orth_init, orth_eps=eps, diagnostics=diagnostics)
        self._flat_layout = not compile  # compiled: EMAs are tensors of their own, no [g; c] scratch row
        self._hyper: dict = {}  # compiled: (lr, weight_decay) 0-dim device tensors per param group
        self._steps: dict = {}  # compiled: per param group, one tensor whose elements are its state["step"]s

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

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)  # first: the projection must see the gradients the closure produces
        groups = self._gradients()
        if not any(ps for _, ps, _ in groups):
            return loss
        if self.compile and self._compiled_ready(groups):
            self._compiled_step(groups)
            return loss
        foreach = self._foreach()
        u = self._project(groups, foreach)  # u_t of every parameter
        for (group, ps, gs), us in zip(groups, split(u, groups)):  # AdamW on u_t
            kernel = (adamw_fused if group["fused"] else adamw_foreach) if foreach else adamw_single
            self._adamw(kernel, group, ps, us, scratch=all(a is not b for a, b in zip(us, gs)))
        self._update_emas()  # c_t = beta c_{t-1} + (1 - beta) g_t
        return loss

    def _adamw(self, kernel, group: dict, ps: List[Tensor], us: List[Tensor], scratch: bool) -> None:
        states = [self.state[p] for p in ps]
        for p, s in zip(ps, states):
            init_adamw_state(s, p, fused=group["fused"])
        beta1, beta2 = group["betas"]
        kernel(ps, us, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
               [s["step"] for s in states], lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
               weight_decay=group["weight_decay"], maximize=group["maximize"], scratch=scratch)

    def _compiled_ready(self, groups) -> bool:
        """Every parameter with a gradient has its EMA and AdamW state (so from the second step on, and again one
        step after `reset_orthogonal_state()`)."""
        return all(EMA_KEY in self.state[p] and "step" in self.state[p] for _, ps, _ in groups for p in ps)

    def _step_counters(self, group: dict, states: List[dict]) -> Tensor:
        """One tensor of the group's step counters, whose elements the states' "step" entries are (views): one op
        advances them all. Laid out again when a counter was replaced (a loaded state_dict, another set of
        parameters with gradients)."""
        laid = self._steps.get(id(group))
        if laid is None or len(laid[1]) != len(states) or any(v is not s["step"] for v, s in zip(laid[1], states)):
            buf = torch.stack([s["step"] for s in states])
            views = list(buf.unbind(0))
            for s, v in zip(states, views):
                s["step"] = v
            laid = self._steps[id(group)] = (buf, views)
        return laid[0]

    def _compiled_step(self, groups) -> None:
        params = [p for _, ps, _ in groups for p in ps]
        grads = [g for _, _, gs in groups for g in gs]
        cos_prev = self._cosine.update(params, grads) if self._cosine is not None else None
        args = []
        for group, ps, gs in groups:
            states = [self.state[p] for p in ps]
            lr, wd = self._hyper.get(id(group)) or self._hyper.setdefault(
                id(group), tuple(ps[0].new_zeros(()) for _ in range(2)))  # in the parameters' dtype
            lr.fill_(group["lr"])  # a kernel argument, not a host-to-device copy
            wd.fill_(group["weight_decay"])
            beta1, beta2 = group["betas"]
            args.append(Group([*ps], [*gs], [s[EMA_KEY] for s in states], [s["exp_avg"] for s in states],
                              [s["exp_avg_sq"] for s in states], self._step_counters(group, states), lr, wd,
                              (float(beta1), float(beta2), float(group["eps"]), float(group["orth_beta"]),
                               bool(group["maximize"]))))
        try:
            gc, cc, uu = orthogonal_adamw_(args, self.projection, self._cosine is not None, self.compile_trace)
        except BackendCompilerFailed as e:
            raise RuntimeError(
                f"OrthogonalAdamW(compile=True): torch.compile could not build the fused step "
                f"({str(e).strip().splitlines()[0][:300]}). Inductor needs a C++ compiler on CPU and Triton on GPU; "
                "set compile=False (optimizer.compile=false) to use the stock-op step.") from e
        self._record_diagnostics(cos_prev, gc, cc, uu)
