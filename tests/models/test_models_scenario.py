"""The scenario interface: built from the composed config, registry, needs, evaluate, config checks."""

import pytest
import torch
from torch import nn

from raystream.config import ConfigError, compose
from raystream.eval.labelled_videos import ProbeSet
from raystream.models import Scenario, build_scenario, register_scenario
from raystream.models.scenario import unwrap
from scenario_helpers import correlated_batches


def _probe(n=24, classes=3):
    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % classes
    x = torch.rand(n, 4, 3, 32, 32, generator=g) * 0.2 + (y.float() / classes).view(-1, 1, 1, 1, 1)
    return ProbeSet(x[::2], y[::2], x[1::2], y[1::2], classes)


@pytest.mark.parametrize("choice, needs", [("videomae", {"probe"}), ("future_prediction", {"heldout"})])
def test_each_scenario_builds_from_the_composed_config_and_trains_a_step(choice, needs):
    cfg = compose([f"scenario={choice}"])
    sc = build_scenario(cfg.scenario, cfg.stream, seed=cfg.trainer.seed)
    assert isinstance(sc, Scenario) and isinstance(sc.model, nn.Module) and set(sc.needs) == needs
    batch = next(correlated_batches(1, batch=cfg.stream.batch_size, target=cfg.stream.target_frames))
    out = sc.model(batch)
    assert out["loss"].dim() == 0 and all(v.dim() == 0 for v in out.values())
    out["loss"].backward()
    assert all(p.grad is not None for p in sc.model.parameters())  # DDP needs no unused parameters
    sc.after_step(0)


def test_videomae_evaluate_reports_the_probe_metrics_and_restores_train_mode():
    cfg = compose(["scenario=videomae", "eval.metrics=[knn,linear,attentive]", "eval.attentive_epochs=2",
                   "eval.probe_epochs=20"])
    sc = build_scenario(cfg.scenario, cfg.stream)
    sc.model.train()
    wrapped = nn.ModuleDict({"m": sc.model})  # stand-in for a wrapper
    wrapped.module = sc.model
    metrics = sc.evaluate(wrapped, cfg.eval, probe=_probe())
    assert set(metrics) == {"eval/knn_top1", "eval/linear_top1", "eval/attentive_top1"}
    assert all(0.0 <= v <= 1.0 for v in metrics.values())
    assert sc.model.training
    assert unwrap(wrapped) is sc.model


def test_a_new_scenario_plugs_in_through_the_registry():
    class Echo(Scenario):
        name = "echo"
        needs = frozenset()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(()))

        def forward(self, batch):
            return {"loss": self.w * batch["frames"].mean()}

    calls = []

    class Counting(Echo):
        def after_step(self, step):
            calls.append(step)

    register_scenario("echo_test")(lambda scenario_cfg, stream_cfg, seed: Counting(Net(), seed))
    cfg = compose([])
    cfg.scenario.name = "echo_test"  # bypasses the config check on purpose: the registry is what is tested
    sc = build_scenario(cfg.scenario, cfg.stream)
    sc.after_step(3)
    assert calls == [3] and sc.evaluate(sc.model, cfg.eval) == {}


def test_unknown_scenario_is_a_clear_error():
    cfg = compose([])
    cfg.scenario.name = "nope"
    with pytest.raises(ValueError, match="scenario.name = 'nope'"):
        build_scenario(cfg.scenario, cfg.stream)


@pytest.mark.parametrize("override, key", [
    ("scenario.decoder_depth=0", "scenario.decoder_depth"),
    ("scenario.decoder=mlp", "scenario.decoder"),
    ("eval.linear_lr=0", "eval.linear_lr"),
    ("eval.attentive_iterations=0", "eval.attentive_iterations"),
    ("scenario.backbone.tubelet_size=0", "scenario.backbone.tubelet_size"),
    ("scenario.backbone.embed_dim=0", "scenario.backbone.embed_dim"),
    ("eval.metrics=[knn,svm]", "eval.metrics"),
    ("eval.knn_temperature=0", "eval.knn_temperature"),
    ("eval.linear_optimizer=adam", "eval.linear_optimizer"),
    ("eval.heldout_batches=0", "eval.heldout_batches"),
])
def test_bad_scenario_and_eval_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose([override])


def test_shape_errors_name_the_keys():
    cfg = compose(["stream.resolution=36"])
    with pytest.raises(ValueError, match="stream.resolution = 36"):
        build_scenario(cfg.scenario, cfg.stream)
    cfg = compose(["stream.frames_per_clip=3"])
    with pytest.raises(ValueError, match="scenario.backbone.tubelet_size"):
        build_scenario(cfg.scenario, cfg.stream)
