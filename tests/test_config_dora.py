"""Bad `scenario.dora.*` and new optimizer values fail in `compose` (before Ray starts) naming the key. The DoRA
ranges are written once, in raystream/models/config.py CHECKS; the builder reads the typed config and trusts them."""

import dataclasses

import pytest

from raystream.config import ConfigError, compose
from raystream.models.config import CHECKS as SCENARIO_CHECKS, DoraConfig

BAD_DORA = [
    ("num_objects", 0), ("local_crops", -1), ("local_size", 0), ("local_crop_min", 0.0), ("local_crop_max", 1.5),
    ("global_crop_min", 0.0), ("color_jitter", 1.2), ("grayscale", -0.1), ("flip", 2.0), ("out_dim", 1),
    ("hidden_dim", 0), ("bottleneck_dim", 0), ("head_layers", 0), ("freeze_last_layer_steps", -1),
    ("student_temp", 0.0), ("teacher_temp", -0.04), ("center_momentum", 1.0), ("momentum_teacher", 1.1),
    ("momentum_steps", 0), ("sinkhorn_epsilon", 0.0), ("sinkhorn_iters", 0), ("loss_rule", "dino"),
    ("global_crops", 0), ("global_crops", 3),
]


@pytest.mark.parametrize("key, value", BAD_DORA)
def test_bad_dora_value_fails_in_compose(key, value):
    with pytest.raises(ConfigError, match=rf"`scenario\.dora\.{key}` = "):
        compose(["scenario=dora", f"scenario.dora.{key}={value}"])


@pytest.mark.parametrize("overrides, heads", [(["scenario.dora.num_objects=4"], 3),  # tiny preset: 3 heads
                                              (["scenario.backbone.num_heads=2", "scenario.backbone.embed_dim=96",
                                                "scenario.dora.num_objects=3"], 2)])
def test_more_objects_than_heads_fails_in_compose(overrides, heads):
    with pytest.raises(ConfigError, match=rf"`scenario\.dora\.num_objects` = \d+: expected at most the backbone's "
                                          rf"{heads} attention heads"):
        compose(["scenario=dora", *overrides])
    compose(["scenario=videomae", *overrides])  # only DoRA tracks objects


def test_local_crop_min_above_max_is_named():
    with pytest.raises(ConfigError, match=r"scenario\.dora\.local_crop_min <= scenario\.dora\.local_crop_max"):
        compose(["scenario=dora", "scenario.dora.local_crop_min=0.5", "scenario.dora.local_crop_max=0.3"])


def test_two_global_crops_need_the_paper_loss_rule():
    with pytest.raises(ConfigError, match=r"scenario\.dora\.loss_rule = paper when scenario\.dora\.global_crops = 2"):
        compose(["scenario=dora", "scenario.dora.global_crops=2", "scenario.dora.loss_rule=official"])
    assert compose(["scenario=dora", "scenario.dora.global_crops=2"]).scenario.dora.global_crops == 2


def test_every_dora_key_is_checked_and_the_shipped_presets_pass():
    checked = {key for key, _, _ in SCENARIO_CHECKS}
    unchecked = {f.name for f in dataclasses.fields(DoraConfig)} - {k.split(".")[-1] for k in checked
                                                                      if k.startswith("dora.")}
    assert unchecked <= {"norm_last_layer"}, unchecked  # a bool: the structured config already types it
    compose(["scenario=dora"])
    compose(["scenario=dora_paper"])


@pytest.mark.parametrize("override, key", [("optimizer.weight_decay_end=-0.1", "optimizer.weight_decay_end"),
                                           ("optimizer.no_decay_1d=maybe", "optimizer.no_decay_1d")])
def test_bad_optimizer_weight_decay_keys_are_named(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose([override])


def test_dora_paper_schedules_weight_decay_from_0_04_to_0_4():
    opt = compose(["+experiment=dora_paper", "data.videos=venice.mp4", "eval.dataset=probe"]).optimizer
    assert (opt.weight_decay, opt.weight_decay_end, opt.no_decay_1d) == (pytest.approx(0.04), pytest.approx(0.4), True)
    default = compose([]).optimizer
    assert default.weight_decay_end is None and default.no_decay_1d is True
