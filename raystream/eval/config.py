"""Structured config of evaluation (`eval` key). Plain data: no torch, no Ray."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from raystream.checks import Check, one_of


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
    probe_epochs: int = 100  # linear probe: L-BFGS iterations, or SGD / AdamW epochs
    max_probe_samples: int = 2000  # per split, a seeded subset when the probe set is larger
    batch_size: int = 64  # clips per forward pass when extracting features
    linear_optimizer: str = "lbfgs"  # lbfgs (full batch) | sgd (momentum 0.9) | adamw: mini-batch, cosine lr
    linear_lr: Optional[float] = None  # null: 1.0 for lbfgs, 0.1 for sgd, 1e-3 for adamw
    linear_batch_size: int = 256  # sgd / adamw mini-batch
    linear_iterations: Optional[int] = None  # sgd / adamw: null = probe_epochs epochs, else this many mini-batches
    linear_weight_decay: float = 1e-4
    attentive_epochs: int = 20
    attentive_iterations: Optional[int] = None  # null = attentive_epochs epochs, else this many mini-batches
    attentive_lr: float = 1e-3
    attentive_batch_size: Optional[int] = None  # null = batch_size
    heldout_batches: int = 8  # out-of-stream pixel error: held-out batches evaluated
    seed: int = 0


# The options an `eval` key takes.
PROBE_METRICS = ("knn", "linear", "attentive")
LINEAR_OPTIMIZERS = ("lbfgs", "sgd", "adamw")

CHECKS = [
    Check("every", lambda v: v >= 0, "an integer >= 0 (0 = only at the end)"),
    Check("metrics", lambda v: all(m in PROBE_METRICS for m in v), "a list of knn, linear, attentive"),
    Check("knn_k", lambda v: v >= 1, "an integer >= 1"),
    Check("knn_temperature", lambda v: v > 0, "a temperature > 0"),
    Check("probe_epochs", lambda v: v >= 1, "an integer >= 1"),
    Check("max_probe_samples", lambda v: v >= 1, "an integer >= 1"),
    Check("batch_size", lambda v: v >= 1, "an integer >= 1"),
    one_of("linear_optimizer", LINEAR_OPTIMIZERS),
    Check("linear_lr", lambda v: v is None or v > 0, "null (the optimizer's default) or a learning rate > 0"),
    Check("linear_batch_size", lambda v: v >= 1, "an integer >= 1"),
    Check("linear_iterations", lambda v: v is None or v >= 1, "null (probe_epochs epochs) or an integer >= 1"),
    Check("linear_weight_decay", lambda v: v >= 0, "a weight decay >= 0"),
    Check("attentive_epochs", lambda v: v >= 1, "an integer >= 1"),
    Check("attentive_iterations", lambda v: v is None or v >= 1,
          "null (attentive_epochs epochs) or an integer >= 1"),
    Check("attentive_lr", lambda v: v > 0, "a learning rate > 0"),
    Check("attentive_batch_size", lambda v: v is None or v >= 1, "null (eval.batch_size) or an integer >= 1"),
    Check("heldout_batches", lambda v: v >= 1, "an integer >= 1"),
]
