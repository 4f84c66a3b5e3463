"""Orthogonal-AdamW, the paper's Algorithm 2 (Han et al., "Learning from Streaming Video with Orthogonal Gradients",
CVPR 2025), whole: the class, its state, the dispatch and three implementations of one step (the fourth, two Triton
kernels, in triton_step.py and triton_kernels.py).

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
`single_tensor_orthogonal_adamw` (the lines above: the reference), `multi_tensor_orthogonal_adamw` (a few
whole-model ops, then torch's fused AdamW kernel on u_t), `compiled_orthogonal_adamw` (two compiled passes) or
`triton_orthogonal_adamw` (two Triton kernels; the default on CUDA).
"""

from __future__ import annotations

import math
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from raystream.optim.base import (CompiledStep, OrthogonalMixin, check_hparam, evaluate_closure, gradients_by_group,
                                  run_compiled, runs)
from raystream.optim.projection import (Sums, Workspace, advance_emas_, coefficients, orthogonalize, project_step,
                                        safe_ratio, sq_norm)
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


def compiled_orthogonal_adamw(params: List[Tensor], grads: List[Tensor], emas: List[Tensor], exp_avgs: List[Tensor],
                              exp_avg_sqs: List[Tensor], steps: List[Tensor], groups: List[AdamWGroup], *,
                              projection: str, with_update_norm: bool, compiled: CompiledStep) -> Sums:
    """Algorithm 2 as the compiled passes: bias corrections first (a few device ops per param group), then
    `fused_step_`, then the step counters advance (one op: a step that failed to compile has changed nothing).
    Every EMA must hold a value (the first step runs the multi-tensor path); `compiled` keeps lr, wd and a trace."""
    args, scalars = [], []
    for index, (group, idx) in enumerate(runs(groups)):
        lr, wd = compiled.hyper(index, group, params[idx[0]])
        t = torch.stack([steps[i] for i in idx]).to(lr.dtype) + 1
        scalars.append((1 - lr * wd, lr / (1 - group.beta1 ** t), torch.rsqrt(1 - group.beta2 ** t)))
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        args.append(Group(pick(params), pick(grads), pick(emas), pick(exp_avgs), pick(exp_avg_sqs), lr, wd,
                          (float(group.beta1), float(group.beta2), float(group.eps), float(group.orth_beta),
                           bool(group.maximize))))
    out = run_compiled(fused_step_, (args, scalars, projection, with_update_norm), compiled.trace)
    torch._foreach_add_(steps, 1)
    return out


# ---- the compiled step: projection, EMA and AdamW written element by element, fused by torch.compile (inductor)
# into one reduction pass (g . c and c . c of every tensor) and one pass reading p, g, c, m, v and writing p, c, m, v:
# 11 arrays, the bound of the global projection (the multi-tensor step: about 19; torch's fused AdamW: 7). lr and wd
# are 0-dim tensors: schedules do not recompile; new shapes or a changed beta do (about a minute for a ViT on 2 CPUs).


class Group(NamedTuple):
    """One param group's tensors and constants as the compiled function sees them (lr, weight_decay: 0-dim)."""

    params: List[Tensor]
    grads: List[Tensor]
    emas: List[Tensor]
    exp_avgs: List[Tensor]
    exp_avg_sqs: List[Tensor]
    lr: Tensor
    weight_decay: Tensor
    hyper: Tuple[float, float, float, float, bool]  # (beta1, beta2, eps, orth_beta, maximize)


Scalars = Tuple[Tensor, Tensor, Tensor]  # per param group: 1 - lr wd; per tensor: lr / (1 - b1^t), 1 / sqrt(1 - b2^t)


def dot_products(grads: Sequence[Tensor], emas: Sequence[Tensor]) -> Tensor:
    """(g_i . c_i, c_i . c_i) of every tensor, shape (n, 2): one pass reading g and c."""
    return torch.stack([torch.stack([torch.sum(g * c), torch.sum(c * c)]) for g, c in zip(grads, emas)])


def update_(groups: Sequence[Group], ks: Tensor, scalars: Sequence[Scalars],
            with_update_norm: bool) -> Optional[Tensor]:
    """u_i = g_i - k_i c_i, the EMA and AdamW on u_i, in place, in one pass (`ks`: one k per tensor). The bias
    corrections come in `scalars`, computed before: a power inside the pass would be evaluated per element."""
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


def fused_step_(groups: Sequence[Group], scalars: Sequence[Scalars], projection: str,
                with_update_norm: bool) -> Tuple[Tensor, Tensor, Optional[Tensor], bool]:
    """The two passes and the projection coefficient between them: the function torch.compile sees. The last
    value says whether it ran compiled (dynamo traces `is_compiling()` as the constant True)."""
    dots = dot_products([g for group in groups for g in group.grads], [c for group in groups for c in group.emas])
    gc, cc = dots[:, 0].sum(), dots[:, 1].sum()
    ks = safe_ratio(gc, cc).expand(dots.shape[0]) if projection == "global" else safe_ratio(dots[:, 0], dots[:, 1])
    return gc, cc, update_(groups, ks, scalars, with_update_norm), torch.compiler.is_compiling()


# ---- AdamW on a given gradient (torch.optim.AdamW's maths; SlowerAdamW feeds it g_t with a scaled lr) ---------
# `adamw_single` (the reference), `adamw_foreach` (torch._foreach_ ops), `adamw_fused` (torch's fused kernel, one
# pass, no temporaries: the default wherever torch supports it); tests keep them in agreement.

class AdamWGroup(NamedTuple):
    """The hyper-parameters of one param group, as the step functions take them: one object per group, listed once
    per parameter of the group (`fused`: the group runs torch's fused kernel)."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    orth_beta: float
    maximize: bool
    fused: bool

    @classmethod
    def of(cls, group: dict) -> "AdamWGroup":
        beta1, beta2 = group["betas"]
        return cls(group["lr"], beta1, beta2, group["eps"], group["weight_decay"], group.get("orth_beta", 0.0),
                   group["maximize"], bool(group["fused"]))

    def kwargs(self) -> dict:
        """The keyword arguments of `adamw_single` / `adamw_foreach` / `adamw_fused`."""
        return dict(lr=self.lr, beta1=self.beta1, beta2=self.beta2, eps=self.eps, weight_decay=self.weight_decay,
                    maximize=self.maximize)


def check_adamw_hparams(lr: float, betas: Tuple[float, float], eps: float, weight_decay: float) -> None:
    check_hparam("lr", lr, lr >= 0, ">= 0")
    check_hparam("eps", eps, eps >= 0, ">= 0")
    check_hparam("weight_decay", weight_decay, weight_decay >= 0, ">= 0")
    check_hparam("betas[0]", betas[0], 0 <= betas[0] < 1, "in [0, 1)")
    check_hparam("betas[1]", betas[1], 0 <= betas[1] < 1, "in [0, 1)")


def resolve_fused(group: dict, strict: bool) -> None:
    """fused=None: whether torch's fused kernel runs on the group; `strict`: fused=True where it cannot is an error."""
    if group["fused"] is None:
        group["fused"] = group["foreach"] is not False and fused_supported(group["params"])
    elif strict and group["fused"] and not fused_supported(group["params"]):
        raise ValueError("Invalid fused: True (torch's fused AdamW does not support these parameters' devices "
                         "or dtypes)")


def fused_supported(params: List[Tensor]) -> bool:
    """Whether torch's fused AdamW kernel (torch._fused_adamw_) runs on every parameter's device and dtype."""
    devices = _get_fused_kernels_supported_devices()
    return all(p.device.type in devices and torch.is_floating_point(p) for p in params)


def init_adamw_state(state: dict, p: Tensor, fused: bool = False) -> None:
    """torch.optim.AdamW's per-parameter state: a float32 step counter (on the parameter's device for the fused
    kernel, else on the CPU) and two moments shaped like p."""
    if "step" not in state:
        state["step"] = torch.zeros((), dtype=torch.float32, device=p.device if fused else "cpu")  # no host copy
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def adamw_single(params: List[Tensor], grads: List[Tensor], exp_avgs: List[Tensor], exp_avg_sqs: List[Tensor],
                 steps: List[Tensor], *, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                 maximize: bool, scratch: bool = False) -> None:
    """Reference path, one tensor at a time (`scratch` is ignored); reads its CPU step counters as Python numbers,
    as torch's. theta <- theta (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps), as the Adam paper's equivalent
    theta (1 - lr wd) - (lr sqrt(1 - b2^t) / (1 - b1^t)) m / (sqrt(v) + eps sqrt(1 - b2^t)): a pass less over v."""
    for p, g, m, v, step in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        if maximize:
            g = -g
        step += 1
        t = step.item()
        if weight_decay != 0:
            p.mul_(1 - lr * weight_decay)
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        bc2_sqrt = math.sqrt(1 - beta2 ** t)
        denom = v.sqrt().add_(eps * bc2_sqrt)
        p.addcdiv_(m, denom, value=-lr * bc2_sqrt / (1 - beta1 ** t))


def adamw_foreach(params: List[Tensor], grads: List[Tensor], exp_avgs: List[Tensor], exp_avg_sqs: List[Tensor],
                  steps: List[Tensor], *, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                  maximize: bool, scratch: bool = False) -> None:
    """The same update with multi-tensor ops, per (device, dtype) bucket. `scratch=True`: the caller owns `grads`
    (e.g. u_t), negated in place for `maximize` and reused as the sqrt(v) workspace, so the step allocates nothing
    (CPU: no page faults) and its peak memory is that of torch's foreach AdamW."""
    if not params:
        return
    buckets = Optimizer._group_tensors_by_device_and_dtype([params, grads, exp_avgs, exp_avg_sqs, steps])
    for (d_params, d_grads, d_m, d_v, d_steps), _ in buckets.values():
        if maximize:
            if scratch:
                torch._foreach_neg_(d_grads)
            else:
                d_grads = torch._foreach_neg(d_grads)
        torch._foreach_add_(d_steps, 1.0)
        if weight_decay != 0:
            torch._foreach_mul_(d_params, 1 - lr * weight_decay)
        torch._foreach_lerp_(d_m, d_grads, 1 - beta1)
        torch._foreach_mul_(d_v, beta2)
        torch._foreach_addcmul_(d_v, d_grads, d_grads, 1 - beta2)
        if scratch and d_v[0].device.type == "cpu":  # CPU foreach is a loop anyway: skip the copy pass
            denom = [torch.sqrt(v, out=w) for v, w in zip(d_v, d_grads)]
        elif scratch:
            denom = d_grads
            torch._foreach_copy_(denom, d_v)
            torch._foreach_sqrt_(denom)
        else:
            denom = torch._foreach_sqrt(d_v)
        del d_grads
        ts = [s.item() for s in d_steps]
        bc2_sqrt = [math.sqrt(1 - beta2 ** t) for t in ts]
        torch._foreach_add_(denom, [eps * b for b in bc2_sqrt])
        torch._foreach_addcdiv_(d_params, d_m, denom, [-lr * b / (1 - beta1 ** t) for b, t in zip(bc2_sqrt, ts)])


def adamw_fused(params: List[Tensor], grads: List[Tensor], exp_avgs: List[Tensor], exp_avg_sqs: List[Tensor],
                steps: List[Tensor], *, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                maximize: bool, scratch: bool = False) -> None:
    """torch's fused multi-tensor AdamW kernel (what torch.optim.AdamW(fused=True) runs): one pass over p, g, m, v
    per step, no temporaries. It does not write into `grads` (no grad_scale is passed). `lr` may also be a 0-dim
    tensor on the parameters' device (SlowerAdamW's lambda_t * lr), read by the kernel without a host sync."""
    if not params:
        return
    buckets = Optimizer._group_tensors_by_device_and_dtype([params, grads, exp_avgs, exp_avg_sqs, steps])
    for (d_params, d_grads, d_m, d_v, d_steps), _ in buckets.values():
        torch._foreach_add_(d_steps, 1)
        torch._fused_adamw_(d_params, d_grads, d_m, d_v, [], d_steps, lr=lr, beta1=beta1, beta2=beta2,
                            weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=maximize)
