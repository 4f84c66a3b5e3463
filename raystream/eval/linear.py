"""Linear probe on cached frozen features: a single linear layer trained with cross-entropy, top-1 on the test set.

Features are standardised with the training set's mean and std. The default optimiser is full-batch L-BFGS
(deterministic, converges in ~100 iterations on cached features); `optimizer="sgd"` runs mini-batch SGD with
momentum and a cosine schedule for `epochs` epochs instead (for feature sets too large for one batch).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


def _standardise(train: torch.Tensor, test: torch.Tensor):
    mean, std = train.mean(0, keepdim=True), train.std(0, keepdim=True).clamp_min(1e-6)
    return (train - mean) / std, (test - mean) / std


def linear_probe_top1(train_features: torch.Tensor, train_labels: torch.Tensor, test_features: torch.Tensor,
                      test_labels: torch.Tensor, num_classes: Optional[int] = None, *, epochs: int = 100,
                      optimizer: str = "lbfgs", lr: Optional[float] = None, weight_decay: float = 1e-4,
                      batch_size: int = 256, seed: int = 0) -> float:
    """Top-1 accuracy in [0, 1] of a linear classifier fitted on `train_features` (N, D)."""
    if optimizer not in ("lbfgs", "sgd"):
        raise ValueError(f"eval.linear_optimizer = {optimizer!r}: expected lbfgs or sgd")
    if train_features.shape[0] != train_labels.shape[0]:
        raise ValueError(f"{train_features.shape[0]} training features but {train_labels.shape[0]} labels")
    x, x_test = _standardise(train_features.float(), test_features.float().to(train_features.device))
    y = train_labels.long().to(x.device)
    classes = int(num_classes) if num_classes is not None else int(y.max()) + 1
    gen = torch.Generator().manual_seed(seed)
    head = nn.Linear(x.shape[1], classes).to(x.device)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * 0.01)
        head.bias.zero_()

    def objective(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(head(xb), yb) + weight_decay * head.weight.pow(2).sum()

    with torch.enable_grad():
        if optimizer == "lbfgs":
            opt = torch.optim.LBFGS(head.parameters(), lr=lr or 1.0, max_iter=epochs, history_size=20,
                                    line_search_fn="strong_wolfe")

            def closure():
                opt.zero_grad()
                loss = objective(x, y)
                loss.backward()
                return loss

            opt.step(closure)
        else:
            opt = torch.optim.SGD(head.parameters(), lr=lr or 0.1, momentum=0.9)
            steps_per_epoch = -(-x.shape[0] // batch_size)
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs * steps_per_epoch)
            for _ in range(epochs):
                order = torch.randperm(x.shape[0], generator=gen).to(x.device)
                for start in range(0, x.shape[0], batch_size):
                    idx = order[start:start + batch_size]
                    opt.zero_grad()
                    objective(x[idx], y[idx]).backward()
                    opt.step()
                    sched.step()
    with torch.no_grad():
        pred = head(x_test).argmax(dim=1)
    return float((pred.cpu() == test_labels.long().cpu()).float().mean())
