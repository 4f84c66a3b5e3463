"""Structured config of the `sweep` group (`sweeps/sweep/*.yaml`). Plain data: importing it starts no Ray.

A sweep file names its search space: `grid` axes (every combination runs) and `sample` axes (searched by Optuna,
`num_samples` trials per grid cell), both keyed by dotted config paths, e.g. `optimizer.orth_beta: [0, 0.9]` and
`optimizer.lr: loguniform(1e-5, 1e-3)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional


@dataclass
class SweepConfig:
    name: str = "smoke"
    grid: Dict[str, Any] = field(default_factory=dict)
    sample: Dict[str, str] = field(default_factory=dict)
    num_samples: int = 1
    metric: str = "loss"
    mode: str = "min"
    scheduler: Optional[str] = None  # None | asha
    max_concurrent_trials: Optional[int] = None  # None = from the cluster's resources
