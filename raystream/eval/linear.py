"""Linear probe on cached frozen features: a single linear layer trained with cross-entropy, top-1 on the test set.

Features are standardised with the training set's mean and std. The default optimiser is full-batch L-BFGS
(deterministic, converges in ~100 iterations on cached features); `optimizer="sgd"` (momentum 0.9, DINO's linear
probe) or `"adamw"` (VideoMAE's in the paper) train on mini-batches with a cosine schedule, for `epochs` epochs or
exactly `iterations` mini-batches (for feature sets too large for one batch). `dino_linear_top1` is DINO's linear
probe (eval.protocol=dino): no standardisation, SGD with DINO's lr scaling, on fresh features per mini-batch.

With a `shard` of several ranks, the mini-batch probes train data-parallel: each rank takes
its part of every mini-batch, the gradients are summed over the ranks, and each rank counts its part of the test
set. Full-batch L-BFGS runs whole on every rank (the same result on each).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from raystream.eval.config import LINEAR_OPTIMIZERS
from raystream.eval.minibatch import minibatches, num_steps
from raystream.eval.shard import Shard
from raystream.schedule import probe_lr_schedule

DEFAULT_LR = {"lbfgs": 1.0, "sgd": 0.1, "adamw": 1e-3}  # when `lr` is None


def _standardise(train: torch.Tensor, test: torch.Tensor):
    mean, std = train.mean(0, keepdim=True), train.std(0, keepdim=True).clamp_min(1e-6)
    return (train - mean) / std, (test - mean) / std


def linear_probe_top1(train_features: torch.Tensor, train_labels: torch.Tensor, test_features: torch.Tensor,
                      test_labels: torch.Tensor, num_classes: Optional[int] = None, *, epochs: int = 100,
                      optimizer: str = "lbfgs", lr: Optional[float] = None, weight_decay: float = 1e-4,
                      batch_size: int = 256, iterations: Optional[int] = None, warmup: int = 0,
                      seed: int = 0, shard: Shard = Shard()) -> float:
    """Top-1 accuracy in [0, 1] of a linear classifier fitted on `train_features` (N, D).

    `epochs`: L-BFGS iterations, or mini-batch epochs; `iterations` (mini-batch optimizers) overrides them;
    `warmup`: mini-batch steps of linear lr warm-up before the cosine."""
    if optimizer not in LINEAR_OPTIMIZERS:
        raise ValueError(f"eval.linear_optimizer = {optimizer!r}: expected one of {', '.join(LINEAR_OPTIMIZERS)}")
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
        lr = DEFAULT_LR[optimizer] if lr is None else lr
        if optimizer == "lbfgs":
            opt = torch.optim.LBFGS(head.parameters(), lr=lr, max_iter=epochs, history_size=20,
                                    line_search_fn="strong_wolfe")

            def closure():
                opt.zero_grad()
                loss = objective(x, y)
                loss.backward()
                return loss

            opt.step(closure)
        else:
            opt = (torch.optim.SGD(head.parameters(), lr=lr, momentum=0.9) if optimizer == "sgd"
                   else torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0))  # decay: as the objective's
            n = x.shape[0]
            sched = probe_lr_schedule(opt, warmup, num_steps(n, batch_size, epochs, iterations))
            params = list(head.parameters())
            for idx in minibatches(n, batch_size, epochs=epochs, iterations=iterations, generator=gen):
                opt.zero_grad()
                shard.step(lambda r: F.cross_entropy(head(x[r]), y[r], reduction="sum"),
                           shard.part(idx).to(x.device), idx.shape[0], params)
                head.weight.grad.add_(head.weight.detach(), alpha=2 * weight_decay)  # the objective's decay term
                opt.step()
                sched.step()
    return shard.accuracy(lambda xb: head(xb).argmax(dim=1), x_test, test_labels)


def dino_linear_top1(train_features_of: Callable[[torch.Tensor], torch.Tensor], train_labels: torch.Tensor,
                     test_features: torch.Tensor, test_labels: torch.Tensor, num_classes: int, *, lr: float = 0.01,
                     batch_size: int = 512, epochs: int = 100, warmup_epochs: int = 0, seed: int = 0,
                     shard: Shard = Shard()) -> float:
    """Top-1 accuracy in [0, 1] of DINO's linear probe (eval_linear.py): Linear(D, classes), weights N(0, 0.01),
    zero bias, on the features as the encoder gives them (no standardisation); SGD with momentum 0.9, no weight
    decay, lr x batch_size / 256 (DINO's scaling), `warmup_epochs` of linear warm-up then cosine to 0, per step.

    `train_features_of(idx)` gives the features (B, D) of the training samples `idx` (fresh augmented views of
    them, or rows of a cache), on the device the probe trains on (the test features' device); with a `shard`,
    each rank asks only for its part of each mini-batch."""
    gen = torch.Generator().manual_seed(seed)
    y = train_labels.long()
    n = y.shape[0]
    steps_per_epoch = -(-n // batch_size)
    device = test_features.device
    head = nn.Linear(test_features.shape[1], int(num_classes)).to(device)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * 0.01)
        head.bias.zero_()
    opt = torch.optim.SGD(head.parameters(), lr=lr * batch_size / 256.0, momentum=0.9, weight_decay=0.0)
    sched = probe_lr_schedule(opt, warmup_epochs * steps_per_epoch, epochs * steps_per_epoch)
    params = list(head.parameters())
    for idx in minibatches(n, batch_size, epochs=epochs, iterations=None, generator=gen):
        local = shard.part(idx)
        with torch.enable_grad():
            opt.zero_grad()
            shard.step(lambda r: F.cross_entropy(head(train_features_of(r).float().to(device)), y[r].to(device),
                                                 reduction="sum"), local, idx.shape[0], params)
            opt.step()
        sched.step()
    return shard.accuracy(lambda xb: head(xb.float()).argmax(dim=1), test_features, test_labels)
