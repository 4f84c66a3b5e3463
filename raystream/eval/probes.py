"""Run the probe evaluations named in `eval.metrics` on a labelled probe set with a frozen encoder.

The encoder is any `encode(clips) -> (features (B, D), tokens (B, L, D))` (a scenario chooses which backbone and
pooling: VideoMAE's mean-pooled encoder, DoRA's teacher [CLS]). Features are extracted once, without gradients, and
cached; the kNN classifier, linear probe and attentive probe then train on the cache. Metric names:
`eval/knn_top1`, `eval/linear_top1`, `eval/attn_top1`.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import torch

from raystream.eval.attentive import attentive_probe_top1
from raystream.eval.config import PROBE_METRICS, EvalConfig
from raystream.eval.knn import knn_top1
from raystream.eval.linear import linear_probe_top1

Encode = Callable[[torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]


@torch.no_grad()
def extract(encode: Encode, clips: torch.Tensor, *, batch_size: int = 64, device: Optional[torch.device] = None,
            keep_tokens: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Pooled features (N, D) float32 on `device`, and (when `keep_tokens`) tokens (N, L, D) float16 on the CPU."""
    feats, toks = [], []
    for start in range(0, clips.shape[0], batch_size):
        x = clips[start:start + batch_size]
        if device is not None:
            x = x.to(device)
        pooled, tokens = encode(x)
        feats.append(pooled.float())
        if keep_tokens:
            toks.append(tokens.to(dtype=torch.float16, device="cpu"))
    return torch.cat(feats), (torch.cat(toks) if keep_tokens else None)


def _subset(x: torch.Tensor, y: torch.Tensor, limit: int, seed: int):
    if x.shape[0] <= limit:
        return x, y
    idx = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))[:limit]
    return x[idx], y[idx]


def probe_metrics(encode: Encode, probe: Any, eval_cfg: EvalConfig,
                  device: Optional[torch.device] = None) -> Dict[str, float]:
    """The probe metrics in `eval_cfg.metrics` on `probe` (data.ProbeSet: train_x, train_y, test_x, test_y,
    num_classes), at most `eval_cfg.max_probe_samples` clips of each split (a seeded subset)."""
    metrics = [str(m) for m in eval_cfg.metrics]
    unknown = [m for m in metrics if m not in PROBE_METRICS]
    if unknown:
        raise ValueError(f"eval.metrics has {unknown}: expected a subset of {list(PROBE_METRICS)}")
    if not metrics:
        return {}
    seed = int(eval_cfg.seed)
    limit = int(eval_cfg.max_probe_samples)
    batch = int(eval_cfg.batch_size)
    train_x, train_y = _subset(probe.train_x, probe.train_y, limit, seed)
    test_x, test_y = _subset(probe.test_x, probe.test_y, limit, seed + 1)
    keep = "attentive" in metrics
    f_train, t_train = extract(encode, train_x, batch_size=batch, device=device, keep_tokens=keep)
    f_test, t_test = extract(encode, test_x, batch_size=batch, device=device, keep_tokens=keep)
    classes = int(probe.num_classes)
    out: Dict[str, float] = {}
    if "knn" in metrics:
        out["eval/knn_top1"] = knn_top1(f_train, train_y, f_test, test_y, classes, k=int(eval_cfg.knn_k),
                                        temperature=float(eval_cfg.knn_temperature))
    if "linear" in metrics:
        out["eval/linear_top1"] = linear_probe_top1(
            f_train, train_y, f_test, test_y, classes, epochs=int(eval_cfg.probe_epochs),
            optimizer=str(eval_cfg.linear_optimizer), lr=eval_cfg.linear_lr,
            batch_size=int(eval_cfg.linear_batch_size), iterations=eval_cfg.linear_iterations,
            weight_decay=float(eval_cfg.linear_weight_decay), seed=seed)
    if "attentive" in metrics:
        out["eval/attn_top1"] = attentive_probe_top1(
            t_train, train_y, t_test, test_y, classes, epochs=int(eval_cfg.attentive_epochs),
            iterations=eval_cfg.attentive_iterations, lr=float(eval_cfg.attentive_lr),
            batch_size=int(eval_cfg.attentive_batch_size or batch), seed=seed, device=f_train.device)
    return out
