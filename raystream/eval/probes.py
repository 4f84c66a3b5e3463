"""Run the probe evaluations named in `eval.metrics` on a labelled probe set with a frozen encoder, under
`eval.protocol`.

The encoder is any `encode(clips) -> (features (B, D), tokens (B, L, D))` (a scenario chooses which backbone and
pooling: VideoMAE's mean-pooled encoder, DoRA's teacher [CLS]). The probe set is a loaders.ProbeSource (or a
data.ProbeSet of clips in memory), at most `eval.max_probe_samples` samples of each split (a seeded subset).
Features of the centre views are extracted once, without gradients; the probes train on them, except DINO's
augmented linear probe, which encodes fresh views of its mini-batches.

- default: kNN (eval.knn_k) `eval/knn_top1`, linear (eval.linear_*) `eval/linear_top1`, attentive
  (eval.attentive_*) `eval/attentive_top1`.
- dino: DINO's weighted kNN at each of eval.dino.knn_ks (`eval/knn_top1_k<k>`; k is capped by the number of
  training samples) and DINO's linear probe (`eval/linear_top1`, eval.dino.*; eval.linear_features).
- vjepa: V-JEPA's attentive probe (`eval/attentive_top1`) and a linear probe trained the same way
  (`eval/linear_top1`), both with eval.vjepa's AdamW settings on cached tokens / features; kNN as default.

Every function here takes lists of samples, so a rank can extract its own shard: with a `shard` of several ranks, each
rank encodes its part of the probe set, the features are gathered on every rank, and the probes train data-parallel. A
`cache` (FeatureCache) holds the centre views' features between evaluations of the same weights: when it has them,
nothing is encoded for them.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import numpy as np
import torch

from raystream.eval.attentive import attentive_probe_top1
from raystream.eval.config import PROTOCOL_METRICS, EvalConfig
from raystream.eval.knn import knn_top1
from raystream.eval.linear import dino_linear_top1, linear_probe_top1
from raystream.eval.loaders import ProbeSource, tensor_source
from raystream.eval.shard import Shard

Encode = Callable[[torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]
FEATURE_KEYS = ("train_features", "train_tokens", "test_features", "test_tokens")


class FeatureCache(Protocol):
    """Where the centre views' features of one model and probe set are kept (`FEATURE_KEYS`; tokens may be None)."""

    def load(self) -> Optional[Dict[str, Optional[torch.Tensor]]]:
        """The features saved earlier, or None."""

    def save(self, features: Dict[str, Optional[torch.Tensor]], extracted: int) -> None:
        """Keep `features` (called on every rank, with the same gathered features); `extracted`: the samples
        encoded for them."""


@torch.no_grad()
def extract(encode: Encode, source: ProbeSource, samples: Sequence[Any], *, batch_size: int = 64,
            device: Optional[torch.device] = None, keep_tokens: bool = False, view: str = "centre",
            rng: Optional[np.random.Generator] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Pooled features (N, D) float32 on `device` of `samples` seen in `view`, and (when `keep_tokens`) their
    tokens (N, L, D) float16 on the CPU."""
    rng = rng if rng is not None else np.random.default_rng(0)
    feats, toks = [], []
    bf16 = device is not None and torch.device(device).type == "cuda"
    for start in range(0, len(samples), batch_size):
        x = source.load(samples[start:start + batch_size], view, rng)
        if device is not None:
            x = x.to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):  # bf16 on GPU, as training
            pooled, tokens = encode(x)
        feats.append(pooled.float())
        if keep_tokens:
            toks.append(tokens.to(dtype=torch.float16, device="cpu"))
    return torch.cat(feats), (torch.cat(toks) if keep_tokens else None)


def extract_sharded(encode: Encode, source: ProbeSource, samples: Sequence[Any], shard: Shard, **kwargs
                    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """`extract` of all `samples`, each rank encoding its part of them (`shard.part`), gathered on every rank."""
    if len(samples) < shard.world:
        raise ValueError(f"the probe set has {len(samples)} samples in a split, fewer than the {shard.world} workers "
                         "that share its extraction: use fewer workers (trainer.num_workers) or more samples")
    feats, toks = extract(encode, source, shard.part(samples), **kwargs)
    return shard.gather(feats, len(samples)), shard.gather(toks, len(samples))


def _features(encode: Encode, source: ProbeSource, train: Sequence[Any], test: Sequence[Any], keep: bool,
              batch: int, device, shard: Shard, cache: Optional[FeatureCache]) -> Dict[str, Any]:
    """The centre views' features and tokens of `train` and `test` (`FEATURE_KEYS`), from `cache` when it has
    them (with tokens when `keep` asks for them), else extracted over the shard and saved there."""
    found = cache.load() if cache is not None else None
    usable = found is not None and (not keep or found.get("train_tokens") is not None)
    if cache is not None and shard.total(float(usable)) < shard.world:  # all ranks reuse, or all extract
        usable = False
    if usable:
        return {k: (v.to(device) if k.endswith("features") and v is not None and device is not None else v)
                for k, v in found.items()}
    out: Dict[str, Any] = {}
    for split, samples in (("train", train), ("test", test)):
        out[f"{split}_features"], out[f"{split}_tokens"] = extract_sharded(
            encode, source, samples, shard, batch_size=batch, device=device, keep_tokens=keep)
    if cache is not None:
        cache.save(out, len(train) + len(test))
    return out


def labels_of(samples: Sequence[Any]) -> torch.Tensor:
    return torch.tensor([int(s.label) for s in samples], dtype=torch.long)


def subset(samples: Sequence[Any], limit: Optional[int], seed: int) -> Sequence[Any]:
    """At most `limit` of `samples` (a seeded subset, in their order); all of them when `limit` is None."""
    if limit is None or len(samples) <= limit:
        return samples
    keep = np.sort(np.random.default_rng(seed).permutation(len(samples))[:limit])
    return [samples[i] for i in keep]


def probe_metrics(encode: Encode, probe: Any, eval_cfg: EvalConfig, device: Optional[torch.device] = None,
                  num_heads: Optional[int] = None, shard: Shard = Shard(),
                  cache: Optional[FeatureCache] = None) -> Dict[str, float]:
    """The probe metrics in `eval_cfg.metrics` of `eval_cfg.protocol` on `probe` (a ProbeSource, or a
    data.ProbeSet); `num_heads`: the encoder's attention heads (the attentive probe's). With a `shard` of several
    ranks, every rank calls this at once and gets the same metrics."""
    protocol, metrics = _protocol_and_metrics(eval_cfg)
    if not metrics:
        return {}
    source = probe if isinstance(probe, ProbeSource) else tensor_source(probe)
    seed = int(eval_cfg.seed)
    limit = None if eval_cfg.max_probe_samples is None else int(eval_cfg.max_probe_samples)
    train, test = subset(source.train, limit, seed), subset(source.test, limit, seed + 1)
    keep = "attentive" in metrics
    batch = int(eval_cfg.batch_size)
    feats = _features(encode, source, train, test, keep, batch, device, shard, cache)
    f_train, t_train, f_test, t_test = (feats[k] for k in FEATURE_KEYS)
    y_train, y_test = labels_of(train), labels_of(test)
    classes = int(source.num_classes)
    out: Dict[str, float] = {}
    if protocol == "dino":
        if "knn" in metrics:
            for k in eval_cfg.dino.knn_ks:
                out[f"eval/knn_top1_k{int(k)}"] = knn_top1(f_train, y_train, f_test, y_test, classes, k=int(k),
                                                           temperature=float(eval_cfg.knn_temperature), shard=shard)
        if "linear" in metrics:
            out["eval/linear_top1"] = _dino_linear(encode, source, train, f_train, f_test, y_test, eval_cfg, device,
                                                   shard)
        return out
    if "knn" in metrics:
        out["eval/knn_top1"] = knn_top1(f_train, y_train, f_test, y_test, classes, k=int(eval_cfg.knn_k),
                                        temperature=float(eval_cfg.knn_temperature), shard=shard)
    if protocol == "vjepa":
        v = eval_cfg.vjepa
        same_way = dict(lr=float(v.lr), batch_size=int(v.batch_size), iterations=int(v.iterations),
                        warmup=int(v.warmup_iterations), weight_decay=0.0, seed=seed,
                        shard=shard)
        if "linear" in metrics:
            out["eval/linear_top1"] = linear_probe_top1(f_train, y_train, f_test, y_test, classes,
                                                        optimizer="adamw", **same_way)
        if "attentive" in metrics:
            out["eval/attentive_top1"] = attentive_probe_top1(t_train, y_train, t_test, y_test, classes,
                                                              num_heads=num_heads, device=f_train.device, **same_way)
        return out
    return {**out, **_default_protocol(metrics, eval_cfg, feats, y_train, y_test, classes, num_heads, shard)}


def _protocol_and_metrics(eval_cfg: EvalConfig) -> Tuple[str, List[str]]:
    """`eval.protocol` and `eval.metrics`, checked: a known protocol, metrics it measures."""
    protocol = str(eval_cfg.protocol)
    metrics = [str(m) for m in eval_cfg.metrics]
    allowed = PROTOCOL_METRICS.get(protocol)
    if allowed is None:
        raise ValueError(f"eval.protocol = {protocol!r}: expected one of {list(PROTOCOL_METRICS)}")
    unknown = [m for m in metrics if m not in allowed]
    if unknown:
        raise ValueError(f"eval.metrics has {unknown}: expected a subset of {list(allowed)} "
                         f"(eval.protocol = {protocol})")
    return protocol, metrics


def _default_protocol(metrics: List[str], eval_cfg: EvalConfig, feats: Dict[str, torch.Tensor], y_train, y_test,
                      classes: int, num_heads: Optional[int], shard: Shard) -> Dict[str, float]:
    """The default protocol's linear and attentive probes (its kNN is measured with the others')."""
    f_train, t_train, f_test, t_test = (feats[k] for k in FEATURE_KEYS)
    seed, out = int(eval_cfg.seed), {}
    if "linear" in metrics:
        out["eval/linear_top1"] = linear_probe_top1(
            f_train, y_train, f_test, y_test, classes, epochs=int(eval_cfg.probe_epochs),
            optimizer=str(eval_cfg.linear_optimizer), lr=eval_cfg.linear_lr,
            batch_size=int(eval_cfg.linear_batch_size), iterations=eval_cfg.linear_iterations,
            weight_decay=float(eval_cfg.linear_weight_decay), seed=seed, shard=shard)
    if "attentive" in metrics:
        out["eval/attentive_top1"] = attentive_probe_top1(
            t_train, y_train, t_test, y_test, classes, epochs=int(eval_cfg.attentive_epochs),
            iterations=eval_cfg.attentive_iterations, lr=float(eval_cfg.attentive_lr),
            batch_size=int(eval_cfg.attentive_batch_size or eval_cfg.batch_size), num_heads=num_heads,
            seed=seed, device=f_train.device, shard=shard)
    return out


def _dino_linear(encode: Encode, source: ProbeSource, train: Sequence[Any], f_train: torch.Tensor,
                 f_test: torch.Tensor, y_test: torch.Tensor, eval_cfg: EvalConfig,
                 device: Optional[torch.device], shard: Shard) -> float:
    """DINO's linear probe: on fresh augmented views of each mini-batch (eval.linear_features=augmented), or on
    the cached centre-crop features (cached)."""
    d = eval_cfg.dino
    rng = np.random.default_rng([int(eval_cfg.seed), 1, *([shard.rank] if shard.world > 1 else [])])  # per rank
    if str(eval_cfg.linear_features) == "cached":
        def features_of(idx: torch.Tensor) -> torch.Tensor:
            return f_train[idx.to(f_train.device)]
    else:
        def features_of(idx: torch.Tensor) -> torch.Tensor:
            return extract(encode, source, [train[i] for i in idx.tolist()], batch_size=int(eval_cfg.batch_size),
                           device=device, view="augment", rng=rng)[0]
    return dino_linear_top1(features_of, labels_of(train), f_test, y_test, int(source.num_classes), lr=float(d.lr),
                            batch_size=int(d.batch_size), epochs=int(d.epochs), warmup_epochs=int(d.warmup_epochs),
                            seed=int(eval_cfg.seed), shard=shard)
