"""Orthogonal-AdamW's step over every tensor at once: the two fast implementations of Algorithm 2 beside the
reference (`single_tensor_orthogonal_adamw`, orthogonal_adamw.py, which dispatches to them), as torch's optim keeps
its functional forms apart from the class. The fourth, two Triton kernels, is triton_step.py's.

`multi_tensor_orthogonal_adamw`: u_t of every tensor in a few whole-model ops (projection.project_step, through a
flat workspace), torch's fused AdamW kernel (or its foreach ops) on u_t per param group, then every EMA.

`compiled_orthogonal_adamw`: projection, EMA and AdamW written element by element (`fused_step_`), fused by
torch.compile (inductor) into one reduction pass (g . c and c . c of every tensor) and one pass reading p, g, c, m, v
and writing p, c, m, v: 11 arrays, the bound of the global projection (the multi-tensor step: about 19; torch's fused
AdamW: 7). lr and wd are 0-dim tensors: schedules do not recompile; new shapes or a changed beta do (about a minute
for a ViT on 2 CPUs).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

from raystream.optim.adamw import AdamWGroup, adamw_foreach, adamw_fused
from raystream.optim.base import CompiledStep, run_compiled, runs
from raystream.optim.projection import Sums, Workspace, advance_emas_, project_step, safe_ratio


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


__all__ = ["multi_tensor_orthogonal_adamw", "compiled_orthogonal_adamw", "fused_step_", "Group"]
