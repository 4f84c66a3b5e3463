"""Algorithm 1, Orthogonal-SGD: torch.optim.SGD's update (momentum, nesterov, L2 weight decay) on the projected
gradient u_t (see orthogonal_adamw.py for the equations); weight decay is added to u_t, as SGD adds it to g_t. Shaped
like orthogonal_adamw.py: `orthogonal_sgd` over plain lists, its single-tensor and multi-tensor paths differing in the
SGD kernel and in how the projection is computed (projection.project_step).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

import torch
from torch import Tensor
from torch.optim import Optimizer

from raystream.optim.base import OrthogonalMixin, check_hparam, evaluate_closure, gradients_by_group, runs
from raystream.optim.projection import Sums, Workspace, advance_emas_, project_step


def sgd_single(params: List[Tensor], grads: List[Tensor], bufs: List[Optional[Tensor]], *, lr: float,
               momentum: float, dampening: float, weight_decay: float, nesterov: bool, maximize: bool) -> None:
    """Reference path (torch.optim.SGD's maths); fills `bufs` in place with new momentum buffers."""
    for i, (p, d) in enumerate(zip(params, grads)):
        if maximize:
            d = -d
        if weight_decay != 0:
            d = d.add(p, alpha=weight_decay)
        if momentum != 0:
            if bufs[i] is None:
                bufs[i] = d.detach().clone()
            else:
                bufs[i].mul_(momentum).add_(d, alpha=1 - dampening)
            d = d.add(bufs[i], alpha=momentum) if nesterov else bufs[i]
        p.add_(d, alpha=-lr)


def sgd_foreach(params: List[Tensor], grads: List[Tensor], bufs: List[Optional[Tensor]], *, lr: float,
                momentum: float, dampening: float, weight_decay: float, nesterov: bool, maximize: bool) -> None:
    """Multi-tensor path of `sgd_single`; never writes into `grads`."""
    if not params:
        return
    if maximize:
        grads = torch._foreach_neg(grads)
    if weight_decay != 0:
        grads = torch._foreach_add(grads, params, alpha=weight_decay)
    if momentum != 0:
        old = [i for i, b in enumerate(bufs) if b is not None]
        if old:
            torch._foreach_mul_([bufs[i] for i in old], momentum)
            torch._foreach_add_([bufs[i] for i in old], [grads[i] for i in old], alpha=1 - dampening)
        for i, b in enumerate(bufs):
            if b is None:
                bufs[i] = grads[i].detach().clone()
        grads = torch._foreach_add(grads, bufs, alpha=momentum) if nesterov else bufs
    torch._foreach_add_(params, grads, alpha=-lr)


class SGDGroup(NamedTuple):
    """The hyper-parameters of one param group, listed once per parameter of the group."""

    lr: float
    momentum: float
    dampening: float
    weight_decay: float
    nesterov: bool
    maximize: bool
    orth_beta: float

    @classmethod
    def of(cls, group: dict) -> "SGDGroup":
        return cls(group["lr"], group["momentum"], group["dampening"], group["weight_decay"], group["nesterov"],
                   group["maximize"], group["orth_beta"])


def orthogonal_sgd(params: List[Tensor], grads: List[Tensor], emas: List[Tensor],
                   momentum_buffers: List[Optional[Tensor]], groups: List[SGDGroup], fresh: List[bool], *,
                   projection: str = "global", orth_init: str = "zero", orth_eps: float = 1e-8, foreach: bool = True,
                   with_update_norm: bool = False, workspace: Optional[Workspace] = None) -> Sums:
    """One Orthogonal-SGD step of every listed parameter, in place; `momentum_buffers` is filled with new buffers
    where momentum starts. Lists and returns as `orthogonal_adamw.orthogonal_adamw`:

        u_t = g_t - k c_{t-1} ;  c_t = beta c_{t-1} + (1 - beta) g_t ;  theta <- theta - lr u_t  (torch SGD's update)
    """
    u, sums = project_step(grads, emas, projection, orth_eps, (workspace or Workspace(rows=2)) if foreach else None,
                           with_update_norm)
    kernel = sgd_foreach if foreach else sgd_single
    for group, idx in runs(groups):
        bufs = [momentum_buffers[i] for i in idx]
        kernel([params[i] for i in idx], [u[i] for i in idx], bufs, lr=group.lr, momentum=group.momentum,
               dampening=group.dampening, weight_decay=group.weight_decay, nesterov=group.nesterov,
               maximize=group.maximize)
        for i, b in zip(idx, bufs):
            momentum_buffers[i] = b
    advance_emas_(emas, grads, [group.orth_beta for group in groups], fresh, orth_init == "first_grad", foreach)
    return sums


class OrthogonalSGD(OrthogonalMixin, Optimizer):
    """theta <- theta - lr u_t (with optional momentum / nesterov / L2 weight decay, as torch.optim.SGD).

    Extra state over torch.optim.SGD: one buffer per parameter, `state[p]["orth_ema"]`.
    """

    def __init__(self, params, lr: float = 1e-3, orth_beta: float = 0.9, projection: str = "global",
                 momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False, dampening: float = 0.0,
                 orth_init: str = "zero", *, maximize: bool = False, foreach: Optional[bool] = None,
                 diagnostics: bool = False):
        check_hparam("lr", lr, lr >= 0, ">= 0")
        check_hparam("momentum", momentum, momentum >= 0, ">= 0")
        check_hparam("weight_decay", weight_decay, weight_decay >= 0, ">= 0")
        check_hparam("nesterov", nesterov, not nesterov or (momentum > 0 and dampening == 0),
                     "nesterov only with momentum > 0 and dampening = 0")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, orth_beta=orth_beta, maximize=maximize, foreach=foreach)
        super().__init__(params, defaults)
        self._init_orthogonal(projection, orth_init, diagnostics=diagnostics)

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)
        params, grads, groups = [], [], []
        for group, ps, gs in gradients_by_group(self):
            params += ps
            grads += gs
            groups += [SGDGroup.of(group)] * len(ps)
        if not params:
            return loss
        emas, fresh = self._emas(params)
        self._store_emas(params, emas, fresh)
        bufs = [self.state[p].get("momentum_buffer") for p in params]
        cos_prev = self._cos_prev(params, grads)
        sums = orthogonal_sgd(params, grads, emas, bufs, groups, fresh, projection=self.projection,
                              orth_init=self.orth_init, orth_eps=self.orth_eps, foreach=self._foreach(),
                              with_update_norm=self._cosine is not None, workspace=self._workspace)
        for p, b, group in zip(params, bufs, groups):
            if group.momentum != 0:
                self.state[p]["momentum_buffer"] = b
        self._record_diagnostics(cos_prev, sums)
        return loss
