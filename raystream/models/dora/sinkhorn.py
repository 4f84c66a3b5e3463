"""Sinkhorn-Knopp: the balanced soft assignment of a frame's patches to DoRA's object prototypes.

DoRA (after SwAV) refines its object prototypes with an entropic optimal-transport assignment: every patch spreads
unit mass over the K prototypes, and every prototype receives the same total mass N / K, so no single object takes
the whole frame. The official code iterates on exp(logits / epsilon) with a max subtracted; with epsilon = 0.05
those exponentials under- and overflow for unnormalised prototypes, so this version iterates the same row/column
normalisations in the log domain (identical result where the official one is finite).
"""

from __future__ import annotations

import math

import torch


@torch.no_grad()
def sinkhorn_knopp(logits: torch.Tensor, epsilon: float = 0.05, iterations: int = 30) -> torch.Tensor:
    """Balanced assignment Q (..., N, K) of N items (patches) to K prototypes from similarity `logits` (..., N, K).

    Each row (item) of Q sums to 1; each column (prototype) sums to N / K after enough iterations. For N == K the
    result is doubly stochastic. Computed in float32 (or float64 input), without gradients.
    """
    if epsilon <= 0:
        raise ValueError(f"scenario.dora.sinkhorn_epsilon = {epsilon}: expected > 0")
    if iterations < 1:
        raise ValueError(f"scenario.dora.sinkhorn_iters = {iterations}: expected >= 1")
    x = logits.float() if logits.dtype not in (torch.float32, torch.float64) else logits
    n, k = x.shape[-2], x.shape[-1]
    log_q = x / epsilon
    log_q = log_q - torch.logsumexp(log_q.flatten(-2), dim=-1)[..., None, None]  # total mass 1
    for _ in range(iterations):
        log_q = log_q - torch.logsumexp(log_q, dim=-2, keepdim=True) - math.log(k)  # each prototype: 1 / K
        log_q = log_q - torch.logsumexp(log_q, dim=-1, keepdim=True) - math.log(n)  # each item: 1 / N
    return torch.exp(log_q + math.log(n))  # each item: 1
