"""Orthogonal-AdamW, the paper's Algorithm 2 (Han et al., "Learning from Streaming Video with Orthogonal Gradients",
CVPR 2025): the class, its state, the dispatch and the reference implementation of one step, line by line (the
multi-tensor and compiled steps in multi_tensor_step.py; two Triton kernels in triton_step.py and triton_kernels.py).

Algorithm 2's lines, as `single_tensor_orthogonal_adamw` runs them (raw gradient g_t, c an EMA of past RAW
gradients with factor beta = `orth_beta`, AdamW's m, v, theta):

    k   = (g_t . c_{t-1}) / (c_{t-1} . c_{t-1})       `coefficients`   (k = 0 when c_{t-1} = 0: u_t = g_t)
    u_t = g_t - k c_{t-1}                             `orthogonalize`  (both in projection.py, shared)
    c_t = beta c_{t-1} + (1 - beta) g_t               `c.lerp_`        (`orth_init="zero"`: c_0 = 0)
    theta <- theta - lr wd theta                      `adamw_single([p], [u], ...)`: `p.mul_(1 - lr * weight_decay)`
    m_t = b1 m + (1 - b1) u_t                                          `m.lerp_(g, 1 - beta1)`
    v_t = b2 v + (1 - b2) u_t^2                                        `v.mul_(beta2).addcmul_(g, g, ...)`
    theta <- theta - lr m_t / (1 - b1^t) / (sqrt(v_t / (1 - b2^t)) + eps)   `p.addcdiv_(m, denom, ...)`
(Algorithm 1, Orthogonal-SGD: theta <- theta - lr u_t; orthogonal_sgd.py.)

`projection` is the scope of the dot products:
  "global"     one projection over the whole parameter vector (all groups, all tensors): the paper's equations;
  "per_tensor" one projection per parameter tensor;
  "dim0"       the authors' published code: for g of shape [d0, *rest], one projection per length-d0 slice,
               cos = F.cosine_similarity(g, c, dim=0, eps), u = g - cos * ||g||_dim0 * F.normalize(c, dim=0, eps).
               A tensor whose first dimension is 1 (cls_token, [1, N, D] pos_embed) gets u = 0 from step 2 on.
`orth_init`: "zero" (the paper: c_1 = (1 - beta) g_1) or "first_grad" (the published code: c_1 = g_1). Step 1 is
never projected. `projection="dim0", orth_init="first_grad"` reproduces the published code. Gradients are projected
where `step()` sees them: after DDP has all-reduced (averaged) them, so every worker projects the same gradient.

Shaped like torch.optim.adamw: `_init_group` gathers plain lists of `self.state[p]`'s own tensors ("step",
"exp_avg", "exp_avg_sq", "orth_ema") and `orthogonal_adamw` dispatches them to one implementation of the step:
`single_tensor_orthogonal_adamw` (here: the lines above, the reference), `multi_tensor_orthogonal_adamw` (a few
whole-model ops, then torch's fused AdamW kernel on u_t) or `compiled_orthogonal_adamw` (two compiled passes), both
in multi_tensor_step.py, or `triton_orthogonal_adamw` (two Triton kernels; the default on CUDA; triton_step.py). The
AdamW update they end in (`adamw_single`, `adamw_foreach`, `adamw_fused`) is adamw.py's.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.optim import Optimizer

from raystream.optim.adamw import AdamWGroup, adamw_single, check_adamw_hparams, init_adamw_state, resolve_fused
from raystream.optim.base import CompiledStep, OrthogonalMixin, check_hparam, evaluate_closure, gradients_by_group
from raystream.optim.multi_tensor_step import compiled_orthogonal_adamw, multi_tensor_orthogonal_adamw
from raystream.optim.projection import Sums, Workspace, coefficients, orthogonalize, sq_norm
from raystream.optim.triton_step import PROJECTIONS as TRITON_PROJECTIONS
from raystream.optim.triton_step import KernelBuildError, TritonStep, triton_orthogonal_adamw, why_not

IMPLEMENTATIONS = ("single", "foreach", "compiled", "triton")
COMPILED_PROJECTIONS = ("global", "per_tensor")  # the projections the compiled step implements


class OrthogonalAdamW(OrthogonalMixin, Optimizer):
    """Algorithm 2: AdamW driven by the gradient's component orthogonal to the EMA of past gradients.

    Extra state over torch.optim.AdamW: one buffer per parameter, `state[p]["orth_ema"]` (fp32 for bf16/fp16
    parameters). Param groups may set their own lr, betas, eps, weight_decay and orth_beta. The multi-tensor path
    (default) runs torch's fused AdamW kernel on u_t (`fused=None`: wherever torch supports it) or its foreach ops
    (`fused=False`); `foreach=False` is the reference; `compile=True` the compiled step (fp32/fp64 parameters on one
    device, "global" or "per_tensor"): the fastest once compiled, at the second step on a CPU. On CUDA the default is
    the fused Triton step (`triton=None`: where Triton is installed, every group fused, fp32/bf16/fp16 parameters on
    one device, "global" or "per_tensor"; triton_step.py): two passes over memory; `triton=False` keeps the
    multi-tensor step, `triton=True` requires the fused one. All agree to rounding."""

    def __init__(self, params, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, orth_beta: float = 0.9, projection: str = "global",
                 orth_init: str = "zero", *, maximize: bool = False, foreach: Optional[bool] = None,
                 fused: Optional[bool] = None, diagnostics: bool = False, compile: bool = False,
                 triton: Optional[bool] = None):
        check_adamw_hparams(lr, betas, eps, weight_decay)
        check_hparam("fused", fused, not (fused and foreach is False),
                     "not True together with foreach=False (the fused kernel is a multi-tensor path)")
        check_hparam("compile", compile, not compile or (foreach is not False and fused is not False),
                     "False with foreach=False or fused=False (the compiled step is the fused multi-tensor path)")
        check_hparam("compile", compile, not compile or projection in COMPILED_PROJECTIONS,
                     f"False with projection={projection!r} (it compiles the 'global' and 'per_tensor' projections)")
        check_hparam("triton", triton, not triton or (foreach is not False and fused is not False and not compile),
                     "not True together with foreach=False, fused=False or compile=True (the fused Triton step is "
                     "another implementation)")
        check_hparam("triton", triton, not triton or projection in TRITON_PROJECTIONS,
                     f"not True with projection={projection!r} (the fused step implements 'global' and 'per_tensor')")
        self.compile, self.triton, self._triton_projection = compile, triton, projection
        self.fused_step = TritonStep()  # the fused Triton step's tables and trace (`fused_step.summary()`)
        self._compiled = CompiledStep()
        self.compile_trace = self._compiled.trace  # compile=True: steps run compiled / eagerly, and why
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, orth_beta=orth_beta,
                        maximize=maximize, foreach=foreach, fused=fused)
        super().__init__(params, defaults)
        self._init_orthogonal(projection, orth_init, orth_eps=eps, diagnostics=diagnostics)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]  # resolve fused=None once: the step counters' device depends on it
        resolve_fused(group, strict=True)
        if self.compile:  # set before Optimizer.__init__ adds the first groups
            bad = sorted({str(p.dtype) for p in group["params"] if p.dtype not in (torch.float32, torch.float64)})
            devices = {p.device for g in self.param_groups for p in g["params"]}
            check_hparam("compile", True, not bad, f"False with {', '.join(bad)} parameters (the compiled step "
                         "takes fp32/fp64 parameters; train in bf16 with autocast, which keeps them fp32)")
            check_hparam("compile", True, len(devices) == 1, "False with parameters on several devices "
                         f"({', '.join(sorted(map(str, devices)))})")
        if self.triton:
            why = why_not([p for g in self.param_groups for p in g["params"]], self._triton_projection)
            check_hparam("triton", True, why is None, f"None or False here: {why}")

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

    def _impl(self, params: List[Tensor], fresh: List[bool]) -> str:
        if not self._foreach():
            return "single"
        if self.compile:
            return "compiled" if not any(fresh) else "foreach"
        return "triton" if self._fused_step_applies(params) else "foreach"

    def _fused_step_applies(self, params: List[Tensor]) -> bool:
        """triton=None: the fused Triton step where it runs (`triton_step.why_not`) with every group fused, until a
        kernel failed to build; triton=True: there, or an error saying why not."""
        if self.triton is False or self.fused_step.eager_reason:
            return False
        why = why_not(params, self.projection)
        if why is None and not all(g["fused"] for g in self.param_groups):
            why = "a param group with fused=False"
        if why is not None and self.triton:
            raise ValueError(f"OrthogonalAdamW(triton=True) cannot run its fused step: {why}")
        return why is None

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)  # first: the projection must see the gradients the closure produces
        params, grads, emas, exp_avgs, exp_avg_sqs, steps, groups, fresh = self._init_group()
        if not params:
            return loss
        cos_prev = self._cos_prev(params, grads)
        kwargs = dict(projection=self.projection, orth_init=self.orth_init, orth_eps=self.orth_eps,
                      with_update_norm=self._cosine is not None, workspace=self._workspace, compiled=self._compiled,
                      fused_step=self.fused_step)
        try:
            try:
                sums = orthogonal_adamw(params, grads, emas, exp_avgs, exp_avg_sqs, steps, groups, fresh,
                                        impl=self._impl(params, fresh), **kwargs)
            except KernelBuildError as e:  # nothing changed yet: this and every later step run eagerly
                if self.triton:
                    raise
                self.fused_step.fall_back(str(e))
                sums = orthogonal_adamw(params, grads, emas, exp_avgs, exp_avg_sqs, steps, groups, fresh,
                                        impl="foreach", **kwargs)
        except torch._dynamo.exc.BackendCompilerFailed as e:  # torch._dynamo loads lazily: no import for it
            raise RuntimeError(
                f"OrthogonalAdamW(compile=True): torch.compile could not build the fused step "
                f"({str(e).strip().splitlines()[0][:300]}). Inductor needs a C++ compiler on CPU and Triton on GPU; "
                "set compile=False (optimizer.compile=false) to use the stock-op step.") from e
        self._record_diagnostics(cos_prev, sums)
        return loss


def orthogonal_adamw(params: List[Tensor], grads: List[Tensor], emas: List[Tensor], exp_avgs: List[Tensor],
                     exp_avg_sqs: List[Tensor], steps: List[Tensor], groups: List[AdamWGroup], fresh: List[bool], *,
                     projection: str = "global", orth_init: str = "zero", orth_eps: float = 1e-8,
                     impl: str = "foreach", with_update_norm: bool = False, workspace: Optional[Workspace] = None,
                     compiled: Optional[CompiledStep] = None, fused_step: Optional[TritonStep] = None) -> Sums:
    """One Orthogonal-AdamW step of every listed parameter (with a gradient, of every param group), in place, by
    `impl`: "single", "foreach", "compiled" (every EMA must hold a value) or "triton" (triton_step.py: CUDA, or CPU
    tensors under Triton's interpreter; step counters on the parameters' device). `groups[i]`: params[i]'s group's
    hyper-parameters; `fresh[i]`: emas[i] holds no value yet (zeros). Returns (sum g . c, sum c . c, sum u . u)."""
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
    if impl == "triton":
        return triton_orthogonal_adamw(params, grads, emas, exp_avgs, exp_avg_sqs, steps, groups, fresh,
                                       projection=projection, orth_init=orth_init, with_update_norm=with_update_norm,
                                       state=fused_step)
    raise ValueError(f"Invalid impl: {impl!r} (expected one of {', '.join(IMPLEMENTATIONS)})")


def single_tensor_orthogonal_adamw(params: List[Tensor], grads: List[Tensor], emas: List[Tensor],
                                   exp_avgs: List[Tensor], exp_avg_sqs: List[Tensor], steps: List[Tensor],
                                   groups: List[AdamWGroup], fresh: List[bool], *, projection: str, orth_init: str,
                                   orth_eps: float, with_update_norm: bool) -> Sums:
    """Algorithm 2, one tensor at a time (the lines of the module docstring): the reference the other
    implementations are tested against."""
    ks, gc, cc = coefficients(grads, emas, projection, orth_eps)  # the dot products come before any update
    us = orthogonalize(grads, emas, ks, foreach=False)  # u_t = g_t - k c_{t-1}; adamw_single does not write into u
    for i, (p, g, u, c, m, v, step, group) in enumerate(zip(params, grads, us, emas, exp_avgs, exp_avg_sqs, steps,
                                                            groups)):
        c.lerp_(g.to(c.dtype), 1.0 if fresh[i] and orth_init == "first_grad" else 1.0 - group.orth_beta)
        adamw_single([p], [u], [m], [v], [step], **group.kwargs())
    return gc, cc, (sq_norm(us) if with_update_norm else None)


__all__ = ["OrthogonalAdamW", "orthogonal_adamw", "single_tensor_orthogonal_adamw", "IMPLEMENTATIONS",
           "COMPILED_PROJECTIONS"]
