"""Algorithm 1, Orthogonal-SGD: torch.optim.SGD's update (momentum, nesterov, L2 weight decay) on the projected
gradient u_t. The projection and the EMA are base.py's (see orthogonal.py for the equations); weight decay is added
to u_t, as SGD adds it to g_t.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor
from torch.optim import Optimizer

from raystream.optim.base import OrthogonalMixin, check_hparam, evaluate_closure, split


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
        groups = self._gradients()
        if not any(ps for _, ps, _ in groups):
            return loss
        foreach = self._foreach()
        u = self._project(groups, foreach)  # u_t of every parameter
        kernel = sgd_foreach if foreach else sgd_single
        for (group, ps, _), us in zip(groups, split(u, groups)):
            bufs = [self.state[p].get("momentum_buffer") for p in ps]
            kernel(ps, us, bufs, lr=group["lr"], momentum=group["momentum"], dampening=group["dampening"],
                   weight_decay=group["weight_decay"], nesterov=group["nesterov"], maximize=group["maximize"])
            if group["momentum"] != 0:
                for p, b in zip(ps, bufs):
                    self.state[p]["momentum_buffer"] = b
        self._update_emas()  # c_t = beta c_{t-1} + (1 - beta) g_t
        return loss
