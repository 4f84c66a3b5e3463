"""Structured config of evaluation (`eval` key). Plain data: no torch, no Ray."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from raystream.checks import Check, one_of


@dataclass
class DinoProtocolConfig:
    """`eval.protocol=dino`: DINO's eval_knn.py and eval_linear.py (the paper's Table 1 and supplementary Table 5).

    Images are resized to `resize` (bicubic, short side) and centre-cropped to `crop`, scaled to the model's image
    size (`stream.resolution`): crop = resolution, resize = round(resolution * resize / crop) (224 px: 256 / 224)."""

    knn_ks: List[int] = field(default_factory=lambda: [10, 20, 100, 200])  # metrics eval/knn_top1_k<k>
    resize: int = 256
    crop: int = 224
    lr: float = 0.01  # scaled by batch_size / 256, as DINO's eval_linear.py
    batch_size: int = 512
    epochs: int = 100
    warmup_epochs: int = 10  # linear warm-up, then cosine to 0 (Table 5 names a warm-up, not its length)


@dataclass
class VjepaProtocolConfig:
    """`eval.protocol=vjepa`: V-JEPA's attentive probe (and a linear probe trained the same way), supplementary
    Table 6: AdamW, warm-up + cosine, no weight decay, batch 32, 40k iterations, clips of 16 frames at 12 fps."""

    lr: float = 3e-4
    batch_size: int = 32
    iterations: int = 40_000
    warmup_iterations: int = 4_000  # Table 6 names a warm-up, not its length: 10 % of the iterations
    frames_per_clip: int = 16
    fps: float = 12.0


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
    protocol: str = "default"  # default | dino (DINO's kNN + linear) | vjepa (V-JEPA's attentive + linear)
    linear_features: str = "augmented"  # dino: augmented (DINO's crops + flips, each epoch) | cached (centre crop)
    knn_k: int = 20
    knn_temperature: float = 0.07
    probe_epochs: int = 100  # linear probe: L-BFGS iterations, or SGD / AdamW epochs
    max_probe_samples: Optional[int] = 2000  # per split, a seeded subset when the probe set is larger; null: all
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
    dino: DinoProtocolConfig = field(default_factory=DinoProtocolConfig)
    vjepa: VjepaProtocolConfig = field(default_factory=VjepaProtocolConfig)


# The options an `eval` key takes.
PROBE_METRICS = ("knn", "linear", "attentive")
LINEAR_OPTIMIZERS = ("lbfgs", "sgd", "adamw")
PROTOCOLS = ("default", "dino", "vjepa")
LINEAR_FEATURES = ("augmented", "cached")
# the probes each protocol defines (eval.metrics picks among them)
PROTOCOL_METRICS = {"default": PROBE_METRICS, "dino": ("knn", "linear"), "vjepa": ("knn", "linear", "attentive")}

CHECKS = [
    Check("every", lambda v: v >= 0, "an integer >= 0 (0 = only at the end)"),
    Check("metrics", lambda v: all(m in PROBE_METRICS for m in v), "a list of knn, linear, attentive"),
    Check("knn_k", lambda v: v >= 1, "an integer >= 1"),
    Check("knn_temperature", lambda v: v > 0, "a temperature > 0"),
    Check("probe_epochs", lambda v: v >= 1, "an integer >= 1"),
    Check("max_probe_samples", lambda v: v is None or v >= 1, "null (every sample) or an integer >= 1"),
    one_of("protocol", PROTOCOLS),
    one_of("linear_features", LINEAR_FEATURES),
    Check("dino.knn_ks", lambda v: len(v) > 0 and all(k >= 1 for k in v), "a non-empty list of integers >= 1"),
    *(Check(key, lambda v: v >= 1, "an integer >= 1") for key in (
        "dino.resize", "dino.crop", "dino.batch_size", "dino.epochs", "vjepa.batch_size", "vjepa.iterations",
        "vjepa.frames_per_clip")),
    *(Check(key, lambda v: v >= 0, "an integer >= 0") for key in ("dino.warmup_epochs", "vjepa.warmup_iterations")),
    *(Check(key, lambda v: v > 0, "a number > 0") for key in ("dino.lr", "vjepa.lr", "vjepa.fps")),
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
    Check("", lambda v: all(m in PROTOCOL_METRICS[v.protocol] for m in v.metrics),
          "eval.metrics among the probes of eval.protocol (dino: knn, linear; default, vjepa: knn, linear, "
          "attentive)"),
]
