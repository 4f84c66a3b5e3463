"""Structured config of evaluation (`eval` key). Plain data: no torch, no Ray."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class EvalConfig:
    """Which evaluations run, when, and on what.

    `dataset` is None for the demo probe set (held-out digits / scenes), or a labelled folder / manifest.
    """

    every: int = 0  # evaluate every N steps (0 = only at the end)
    metrics: List[str] = field(default_factory=lambda: ["knn", "linear"])  # knn | linear | attentive
    dataset: Optional[str] = None
    knn_k: int = 20
    knn_temperature: float = 0.07
    probe_epochs: int = 100
    max_probe_samples: int = 2000
