"""Structured config of evaluation (`eval` key). Plain data: no torch, no Ray."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class EvalConfig:
    """Which evaluations run, when, and on what.

    `dataset` is None for the demo probe set (held-out digits / scenes), or a labelled folder / manifest.
    Which of them apply is the scenario's choice (`scenario.needs`): probes for representation learning
    (VideoMAE, DoRA), held-out pixel error for future prediction.
    """

    every: int = 0  # evaluate every N steps (0 = only at the end)
    metrics: List[str] = field(default_factory=lambda: ["knn", "linear"])  # knn | linear | attentive
    dataset: Optional[str] = None
    knn_k: int = 20
    knn_temperature: float = 0.07
    probe_epochs: int = 100  # linear probe: L-BFGS iterations, or SGD epochs
    max_probe_samples: int = 2000  # per split, a seeded subset when the probe set is larger
    batch_size: int = 64  # clips per forward pass when extracting features
    linear_optimizer: str = "lbfgs"  # lbfgs | sgd
    linear_weight_decay: float = 1e-4
    attentive_epochs: int = 20
    attentive_lr: float = 1e-3
    heldout_batches: int = 8  # out-of-stream pixel error: held-out batches evaluated
    seed: int = 0
