"""An independent, deliberately naive implementation of the paper's Algorithms 1-2 and of the published code's
per-slice (dim 0) projection, in float64, written from the equations (not from raystream.optim).

Global scope concatenates every tensor into one vector; per_tensor projects each tensor alone; dim0 uses the
published formula with torch.nn.functional.cosine_similarity / normalize.
"""

from __future__ import annotations

import math
from typing import List, Sequence

import torch
import torch.nn.functional as F


def project_reference(grads: Sequence[torch.Tensor], emas: Sequence[torch.Tensor], projection: str,
                      eps: float = 1e-8) -> List[torch.Tensor]:
    if projection == "global":
        g = torch.cat([x.flatten() for x in grads])
        c = torch.cat([x.flatten() for x in emas])
        cc = float(c @ c)
        u = g if cc == 0 else g - float(g @ c) / cc * c
        out, start = [], 0
        for x in grads:
            out.append(u[start:start + x.numel()].reshape(x.shape))
            start += x.numel()
        return out
    if projection == "per_tensor":
        out = []
        for g, c in zip(grads, emas):
            cc = float((c * c).sum())
            out.append(g.clone() if cc == 0 else g - float((g * c).sum()) / cc * c)
        return out
    if projection == "dim0":  # the authors' published code, verbatim in spirit
        out = []
        for g, c in zip(grads, emas):
            cos = F.cosine_similarity(g, c, dim=0, eps=eps)
            out.append(g - cos * g.norm(dim=0) * F.normalize(c, dim=0, eps=eps))
        return out
    raise ValueError(projection)


class ReferenceOptimizer:
    """Per-tensor hyper-parameters `hp[i]` = dict(lr, weight_decay, orth_beta, betas, eps)."""

    def __init__(self, params: Sequence[torch.Tensor], hp: Sequence[dict], projection: str, orth_init: str,
                 algorithm: str):
        self.params = [p.detach().clone().double() for p in params]
        self.hp = list(hp)
        self.projection, self.orth_init, self.algorithm = projection, orth_init, algorithm
        self.c = [torch.zeros_like(p) for p in self.params]
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0

    def step(self, grads: Sequence[torch.Tensor]) -> None:
        grads = [g.double() for g in grads]
        self.t += 1
        t = self.t
        u = project_reference(grads, self.c, self.projection, eps=self.hp[0].get("eps", 1e-8))
        for i, g in enumerate(grads):  # the EMA of RAW gradients
            beta = self.hp[i]["orth_beta"]
            if t == 1 and self.orth_init == "first_grad":
                self.c[i] = g.clone()
            else:
                self.c[i] = beta * self.c[i] + (1 - beta) * g
        for i, p in enumerate(self.params):
            h = self.hp[i]
            if self.algorithm == "sgd":  # Algorithm 1 (+ torch.optim.SGD's L2 weight decay, added to u)
                self.params[i] = p - h["lr"] * (u[i] + h["weight_decay"] * p)
                continue
            b1, b2 = h["betas"]  # Algorithm 2
            self.m[i] = b1 * self.m[i] + (1 - b1) * u[i]
            self.v[i] = b2 * self.v[i] + (1 - b2) * u[i] * u[i]
            p = p - h["lr"] * h["weight_decay"] * p
            m_hat = self.m[i] / (1 - b1 ** t)
            v_hat = self.v[i] / (1 - b2 ** t)
            self.params[i] = p - h["lr"] * m_hat / (v_hat.sqrt() + h["eps"])


def correlated_gradients(shapes, steps: int, seed: int = 0, rho: float = 0.8) -> List[List[torch.Tensor]]:
    """g_t = rho g_{t-1} + sqrt(1 - rho^2) noise: consecutive gradients with cosine about rho, like a video stream."""
    gen = torch.Generator().manual_seed(seed)
    g = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    seq = []
    for _ in range(steps):
        seq.append([x.clone() for x in g])
        g = [rho * x + math.sqrt(1 - rho * rho) * torch.randn(x.shape, generator=gen, dtype=torch.float64)
             for x in g]
    return seq
