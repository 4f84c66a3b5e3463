"""probe_metrics: the metrics named in eval.metrics, on features from a frozen encoder, capped sample counts."""

import pytest
import torch

from raystream.eval.labelled_videos import ProbeSet
from raystream.eval import attentive_probe_top1, linear_probe_top1, probe_metrics
from raystream.eval.config import EvalConfig


def EvalCfg(**kw):
    return EvalConfig(**{"metrics": ["knn", "linear", "attentive"], "probe_epochs": 50, "batch_size": 16,
                         "attentive_epochs": 30, **kw})


def _probe(n=120, classes=3, noise=0.3):
    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % classes
    centres = torch.randn(classes, 4, 2, 4, 4, generator=g)
    x = centres[y] + noise * torch.randn(n, 4, 2, 4, 4, generator=g)
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
    assert set(out) == {"eval/knn_top1", "eval/linear_top1", "eval/attentive_top1"}
    assert min(out.values()) > 0.9
    assert max(seen) <= 16  # extracted in eval.batch_size chunks


def test_only_the_requested_metrics_and_a_sample_cap():
    seen = []
    out = probe_metrics(_encode(seen), _probe(), EvalCfg(metrics=["knn"], max_probe_samples=10))
    assert set(out) == {"eval/knn_top1"} and sum(seen) == 20
    with pytest.raises(ValueError, match="eval.metrics"):
        probe_metrics(_encode([]), _probe(), EvalCfg(metrics=["svm"]))


@pytest.mark.parametrize("settings, call", [
    (dict(metrics=["linear"], linear_optimizer="adamw", linear_lr=0.3, linear_batch_size=8, linear_iterations=3,
          linear_weight_decay=0.0),
     lambda f, y, ft, yt: linear_probe_top1(f, y, ft, yt, 3, epochs=50, optimizer="adamw", lr=0.3, batch_size=8,
                                            iterations=3, weight_decay=0.0, seed=0)),
    (dict(metrics=["attentive"], attentive_lr=0.2, attentive_batch_size=4, attentive_iterations=2),
     lambda f, y, ft, yt: attentive_probe_top1(f, y, ft, yt, 3, epochs=10, lr=0.2, batch_size=4, iterations=2,
                                               seed=0)),
])
def test_probe_settings_reach_the_probes(settings, call):
    """eval.linear_* / eval.attentive_* (the paper's probe lr, batch and iterations) are what the probes run with:
    the same number as calling the probe with them, and another number than the defaults give."""
    probe = _probe(noise=3.0)  # hard enough that the settings change the accuracy
    out = probe_metrics(_encode([]), probe, EvalCfg(**settings))
    (got,) = out.values()
    by_hand = call(*_features(settings["metrics"][0], probe))
    default = probe_metrics(_encode([]), probe, EvalCfg(metrics=settings["metrics"]))
    assert got == by_hand and got != next(iter(default.values()))


def _features(metric, probe):
    """What probe_metrics hands the probe: pooled features (linear) or tokens cached in float16 (attentive), train
    then test."""
    pick = (lambda t: t.mean(1)) if metric == "linear" else (lambda t: t.half())
    return (pick(probe.train_x.flatten(2)), probe.train_y, pick(probe.test_x.flatten(2)), probe.test_y)
