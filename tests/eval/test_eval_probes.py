"""probe_metrics: the metrics named in eval.metrics, on features from a frozen encoder, capped sample counts."""

import pytest
import torch

from raystream.data import ProbeSet
from raystream.eval import probe_metrics
from raystream.eval.config import EvalConfig


def EvalCfg(**kw):
    return EvalConfig(**{"metrics": ["knn", "linear", "attentive"], "probe_epochs": 50, "batch_size": 16,
                         "attentive_epochs": 10, **kw})


def _probe(n=120, classes=3):
    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % classes
    centres = torch.randn(classes, 4, 2, 4, 4, generator=g)
    x = centres[y] + 0.3 * torch.randn(n, 4, 2, 4, 4, generator=g)
    return ProbeSet(x[::2], y[::2], x[1::2], y[1::2], classes)


def _encode(seen):
    def encode(clips):
        seen.append(clips.shape[0])
        tokens = clips.flatten(2)  # (B, T, C*H*W): one token per frame
        return tokens.mean(1), tokens
    return encode


def test_all_probes_on_a_separable_probe_set():
    seen = []
    out = probe_metrics(_encode(seen), _probe(), EvalCfg())
    assert set(out) == {"eval/knn_top1", "eval/linear_top1", "eval/attn_top1"}
    assert min(out.values()) > 0.9
    assert max(seen) <= 16  # extracted in eval.batch_size chunks


def test_only_the_requested_metrics_and_a_sample_cap():
    seen = []
    out = probe_metrics(_encode(seen), _probe(), EvalCfg(metrics=["knn"], max_probe_samples=10))
    assert set(out) == {"eval/knn_top1"} and sum(seen) == 20
    with pytest.raises(ValueError, match="eval.metrics"):
        probe_metrics(_encode([]), _probe(), EvalCfg(metrics=["svm"]))
