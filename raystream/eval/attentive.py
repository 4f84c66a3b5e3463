"""Attentive probe on frozen tokens, as V-JEPA's `AttentiveClassifier` (src/models/attentive_pooler.py, depth 1):
one learned query goes through a cross-attention block over a clip's tokens (LayerNorm of the tokens,
cross-attention with the encoder's head count, a residual; LayerNorm, an MLP of ratio 4, a residual), then a linear
layer classifies it. Only the probe is trained (AdamW, warm-up + cosine), for a number of epochs or exactly a number
of mini-batch iterations.

Tokens are cached by the caller (possibly in half precision to save memory) and cast to float per mini-batch.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from raystream.eval.minibatch import minibatches, num_steps
from raystream.eval.shard import Shard
from raystream.schedule import probe_lr_schedule


def default_heads(dim: int) -> int:
    """Heads when the encoder's are not known (a plain feature function): the most (up to 16) that keep at least
    32 channels per head and divide `dim`."""
    for h in (16, 12, 8, 6, 4, 3, 2):
        if dim % h == 0 and dim // h >= 32:
            return h
    return 1


class CrossAttention(nn.Module):
    """Queries (B, n, D) attend over tokens (B, N, D): q from the queries, k and v from the tokens, `num_heads`
    heads, an output projection (V-JEPA's CrossAttention, qkv_bias=True)."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"attentive probe: {num_heads} heads do not divide the token width {dim}")
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        b, n, d = q.shape
        h = self.num_heads
        q = self.q(q).reshape(b, n, h, d // h).transpose(1, 2)
        k, v = self.kv(x).reshape(b, x.shape[1], 2, h, d // h).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class CrossAttentionBlock(nn.Module):
    """q + xattn(q, norm1(x)), then q + mlp(norm2(q)) (V-JEPA's CrossAttentionBlock; MLP: Linear, GELU, Linear)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.xattn = CrossAttention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q = q + self.xattn(q, self.norm1(x))
        return q + self.mlp(self.norm2(q))


class AttentivePooler(nn.Module):
    """One learned query (1, 1, D) pooled over the tokens by one CrossAttentionBlock: (B, N, D) -> (B, 1, D)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.query_tokens = nn.Parameter(torch.zeros(1, 1, dim))
        self.cross_attention_block = CrossAttentionBlock(dim, num_heads, mlp_ratio)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cross_attention_block(self.query_tokens.expand(x.shape[0], -1, -1), x)


class AttentiveClassifier(nn.Module):
    """AttentivePooler, then Linear(D, classes). Initialised as V-JEPA's: truncated normal (std 0.02) query and
    linear weights, zero biases, unit LayerNorms; the block's output projections divided by sqrt(2)."""

    def __init__(self, dim: int, num_classes: int, num_heads: Optional[int] = None, mlp_ratio: float = 4.0):
        super().__init__()
        self.pooler = AttentivePooler(dim, num_heads or default_heads(dim), mlp_ratio)
        self.linear = nn.Linear(dim, num_classes)
        nn.init.trunc_normal_(self.pooler.query_tokens, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        block = self.pooler.cross_attention_block
        with torch.no_grad():
            block.xattn.proj.weight.div_(math.sqrt(2.0))
            block.mlp[2].weight.div_(math.sqrt(2.0))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.linear(self.pooler(tokens)[:, 0])


def attentive_probe_top1(train_tokens: torch.Tensor, train_labels: torch.Tensor, test_tokens: torch.Tensor,
                         test_labels: torch.Tensor, num_classes: Optional[int] = None, *, epochs: int = 20,
                         lr: float = 1e-3, weight_decay: float = 1e-4, batch_size: int = 64,
                         num_heads: Optional[int] = None, iterations: Optional[int] = None, warmup: int = 0,
                         seed: int = 0, device: Optional[torch.device] = None, shard: Shard = Shard()) -> float:
    """Top-1 accuracy in [0, 1] of an attentive probe fitted on `train_tokens` (N, L, D), trained for `epochs`
    epochs or, when given, exactly `iterations` mini-batches (`warmup` of them warming the lr up, then cosine).

    `num_heads`: the encoder's (None: `default_heads`). The probe lives on `device` (default: the tokens'
    device); cached tokens move there one mini-batch at a time. With a `shard` of several ranks the probe trains
    data-parallel (each rank its part of every mini-batch, gradients summed).
    """
    if train_tokens.dim() != 3:
        raise ValueError(f"attentive probe expects tokens (N, L, D), got shape {tuple(train_tokens.shape)}")
    if train_tokens.shape[0] != train_labels.shape[0]:
        raise ValueError(f"{train_tokens.shape[0]} training clips but {train_labels.shape[0]} labels")
    device = torch.device(device) if device is not None else train_tokens.device
    y = train_labels.long().cpu()
    classes = int(num_classes) if num_classes is not None else int(y.max()) + 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        probe = AttentiveClassifier(train_tokens.shape[-1], classes, num_heads).to(device)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(probe.parameters(), lr=lr, weight_decay=weight_decay)
    n = train_tokens.shape[0]
    sched = probe_lr_schedule(opt, warmup, num_steps(n, batch_size, epochs, iterations))
    params = list(probe.parameters())
    with torch.enable_grad():
        probe.train()
        for idx in minibatches(n, batch_size, epochs=epochs, iterations=iterations, generator=gen):
            opt.zero_grad()
            shard.step(lambda r: F.cross_entropy(probe(train_tokens[r.to(train_tokens.device)].to(device).float()),
                                                 y[r].to(device), reduction="sum"),
                       shard.part(idx), idx.shape[0], params)
            opt.step()
            sched.step()
    probe.eval()
    return shard.accuracy(lambda t: probe(t.to(device).float()).argmax(dim=1), test_tokens, test_labels, batch_size)
