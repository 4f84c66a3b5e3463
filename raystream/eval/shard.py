"""Which part of a probe's work this process does, and the few collectives that put the parts together.

An evaluation runs on every rank of a job at once (torch.distributed; no Ray here): each rank extracts the
features of its shard of the probe set (`part`: samples rank, rank + world, ...), the features are gathered on
every rank (`gather`, in the samples' order), and the probes train data-parallel: each rank takes its part of
every mini-batch (`part`), and the gradients of the mini-batch's mean loss are summed over the ranks
(`sum_grads`), so every rank holds the same probe after each step. Accuracies are counted on each rank's part of
the test set and summed (`total`). No rank waits in a collective while another works for long: every collective
comes after a few milliseconds of equal work on every rank.

`Shard()` (rank 0 of 1) is a single process: every function is then the identity, and the probes' results are
the same as without sharding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> "Shard":
        """This process's rank and world size in torch.distributed's default group (rank 0 of 1 without one)."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    def part(self, items: Sequence[T]) -> Sequence[T]:
        """This rank's items: rank, rank + world, ... (all of them on a single process)."""
        return items if self.world == 1 else items[self.rank::self.world]

    def gather(self, local: Optional[torch.Tensor], n: int) -> Optional[torch.Tensor]:
        """The (n, ...) rows every rank holds `part` of, in their order, on every rank (on `local`'s device). At probe
        scale the parts travel as pickled CPU tensors (`all_gather_object`)."""
        if self.world == 1 or local is None:
            return local

        parts: List[Optional[torch.Tensor]] = [None] * self.world
        dist.all_gather_object(parts, local.cpu())
        out = torch.empty((n, *local.shape[1:]), dtype=local.dtype)
        for r, p in enumerate(parts):
            out[r::self.world] = p
        return out.to(local.device)

    def sum_grads(self, params: Iterable[torch.Tensor]) -> None:
        """Sum every parameter's gradient over the ranks (a parameter without one counts as zeros)."""
        if self.world == 1:
            return

        params = list(params)
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])  # one collective per step
        dist.all_reduce(flat)
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p.grad))

    def total(self, value: float) -> float:
        """`value` summed over the ranks."""
        if self.world == 1:
            return float(value)

        t = torch.tensor([float(value)], dtype=torch.float64)
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.all_reduce(t)
        return float(t.item())

    def accuracy(self, predict, inputs: torch.Tensor, labels: torch.Tensor, batch_size: int = 4096) -> float:
        """Top-1 accuracy in [0, 1] of `predict(inputs[rows]) -> labels` over all of `inputs`, each rank predicting
        its part (in chunks of `batch_size` rows), the correct counts summed over the ranks."""
        rows = torch.arange(inputs.shape[0])[self.rank::self.world] if self.world > 1 else torch.arange(
            inputs.shape[0])
        correct = 0
        with torch.no_grad():
            for start in range(0, rows.shape[0], batch_size):
                r = rows[start:start + batch_size]
                pred = predict(inputs[r.to(inputs.device)]).cpu()
                correct += int((pred == labels[r].long().cpu()).sum())
        return self.total(correct) / max(1, inputs.shape[0])

    def step(self, loss_of, local: torch.Tensor, batch: int, params: List[torch.Tensor]) -> None:
        """Backward of this rank's share of a mini-batch's mean loss: `loss_of(local)` (the summed loss of the rows
        `local`, none when this rank's part is empty) / `batch` rows in the whole mini-batch; the gradients are then
        summed over the ranks (the caller zeroes them before and steps after)."""
        if local.numel() > 0:
            (loss_of(local) / batch).backward()
        self.sum_grads(params)
