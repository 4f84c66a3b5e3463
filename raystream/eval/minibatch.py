"""The mini-batch order of the probes that train with mini-batches (linear SGD / AdamW, attentive): a seeded
permutation per epoch, for a number of epochs or, when given, for exactly a number of iterations (the paper's
probes count iterations: 40k for VideoMAE's)."""

from __future__ import annotations

from typing import Iterator, Optional

import torch


def num_steps(n: int, batch_size: int, epochs: int, iterations: Optional[int]) -> int:
    """Optimizer steps of a probe: `iterations`, else `epochs` passes of ceil(n / batch_size) mini-batches."""
    return int(iterations) if iterations is not None else epochs * -(-n // batch_size)


def minibatches(n: int, batch_size: int, *, epochs: int, iterations: Optional[int],
                generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Index tensors of `num_steps(...)` mini-batches over n samples: a fresh permutation per pass, the last
    mini-batch of a pass possibly smaller."""
    remaining = num_steps(n, batch_size, epochs, iterations) if n > 0 else 0
    while remaining > 0:
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            if remaining == 0:
                return
            yield order[start:start + batch_size]
            remaining -= 1
