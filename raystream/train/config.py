"""Structured config of the `trainer` group (`sweeps/trainer/*.yaml`). Plain data: importing it starts no Ray."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class TrainerConfig:
    """How one run executes on Ray Train: workers, steps, checkpoints, fault tolerance."""

    num_workers: int = 1
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    max_steps: Optional[int] = None  # None = one pass over the stream x stream.epochs
    log_every: int = 1
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    max_failures: int = 2
    storage_path: Optional[str] = None  # local dir or s3:// / gs://; None = ./raystream_results
    run_name: Optional[str] = None  # same name again = resume
    bf16: bool = True  # autocast on GPU only
    seed: int = 0
