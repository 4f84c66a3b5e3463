"""Attentive probe on frozen tokens (V-JEPA style): one learnable query cross-attends over all of a clip's tokens,
then a linear layer classifies the attended vector. Only the probe is trained (AdamW, cosine schedule), for a number
of epochs or exactly a number of mini-batch iterations.

Tokens are cached by the caller (possibly in half precision to save memory) and cast to float per mini-batch.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from raystream.eval.minibatch import minibatches, num_steps


def default_heads(dim: int) -> int:
    """The most heads (up to 16) that keep at least 32 channels per head and divide `dim`."""
    for h in (16, 12, 8, 6, 4, 3, 2):
        if dim % h == 0 and dim // h >= 32:
            return h
    return 1


class AttentiveClassifier(nn.Module):
    """query (1, 1, D) -> cross-attention over LayerNorm(tokens) -> LayerNorm -> Linear(D, classes)."""

    def __init__(self, dim: int, num_classes: int, num_heads: Optional[int] = None):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(1, 1, dim))
        self.norm_tokens = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, num_heads or default_heads(dim), batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        nn.init.trunc_normal_(self.query, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        kv = self.norm_tokens(tokens)
        pooled, _ = self.attn(self.query.expand(tokens.shape[0], -1, -1), kv, kv, need_weights=False)
        return self.head(self.norm(pooled[:, 0]))


def attentive_probe_top1(train_tokens: torch.Tensor, train_labels: torch.Tensor, test_tokens: torch.Tensor,
                         test_labels: torch.Tensor, num_classes: Optional[int] = None, *, epochs: int = 20,
                         lr: float = 1e-3, weight_decay: float = 1e-4, batch_size: int = 64,
                         num_heads: Optional[int] = None, iterations: Optional[int] = None, seed: int = 0,
                         device: Optional[torch.device] = None) -> float:
    """Top-1 accuracy in [0, 1] of an attentive probe fitted on `train_tokens` (N, L, D), trained for `epochs`
    epochs or, when given, exactly `iterations` mini-batches.

    The probe lives on `device` (default: the tokens' device); cached tokens move there one mini-batch at a time.
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
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, num_steps(n, batch_size, epochs, iterations)))
    with torch.enable_grad():
        probe.train()
        for idx in minibatches(n, batch_size, epochs=epochs, iterations=iterations, generator=gen):
            logits = probe(train_tokens[idx.to(train_tokens.device)].to(device).float())
            opt.zero_grad()
            F.cross_entropy(logits, y[idx].to(device)).backward()
            opt.step()
            sched.step()
    probe.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, test_tokens.shape[0], batch_size):
            pred = probe(test_tokens[start:start + batch_size].to(device).float()).argmax(dim=1).cpu()
            correct += int((pred == test_labels[start:start + batch_size].long().cpu()).sum())
    return correct / max(1, test_tokens.shape[0])
