"""The paper's settings (supplementary Tables 5-7) as `+experiment=...`: every value of the tables the platform has
a key for, composed and checked here against the tables, and each backbone built on the meta device and counted."""

import contextlib

import pytest
import torch

from raystream.config import ConfigError, compose
from raystream.models import build_scenario
from raystream.models.vit import preset_shape

# The user's data: each experiment requires it (the demo is the default only outside the paper's experiments).
DATA = {
    "dora_paper": ["data.videos=/data/wt_venice.mp4", "eval.dataset=/data/probe"],
    "videomae_paper": ["data.videos=/data/ssv2.csv", "eval.dataset=/data/probe.csv"],
    "future_prediction_paper": ["data.videos=/data/ego4d.csv", "data.heldout_videos=/data/ego4d_heldout.csv"],
}

# Table 5 (DoRA), Table 6 (VideoMAE), Table 7 (future prediction): config key -> the table's value.
TABLES = {
    "dora_paper": {
        "scenario.name": "dora", "scenario.backbone.preset": "small", "scenario.dora.out_dim": 65536,
        "stream.frames_per_clip": 8, "stream.fps": 1, "stream.resolution": 224, "scenario.dora.local_crops": 6,
        "optimizer.lr": 5e-4, "optimizer.weight_decay": 0.04, "optimizer.weight_decay_end": 0.4,
        "stream.batch_size": 32, "stream.epochs": 1, "trainer.max_steps": None,
        "eval.protocol": "dino", "eval.dino.lr": 0.01, "eval.dino.epochs": 100, "eval.dino.batch_size": 512,
        "eval.dino.knn_ks": [10, 20, 100, 200], "eval.knn_temperature": 0.07, "eval.dino.resize": 256,
        "eval.dino.crop": 224, "eval.linear_features": "augmented", "eval.max_probe_samples": None,
    },
    "videomae_paper": {
        "scenario.name": "videomae", "scenario.backbone.preset": "base", "stream.frames_per_clip": 16,
        "stream.fps": 12, "stream.resolution": 224, "scenario.mask.ratio": 0.9, "optimizer.lr": 3e-4,
        "optimizer.weight_decay": 0.05, "optimizer.weight_decay_end": None, "stream.batch_size": 512,
        "trainer.max_steps": 260_000,
        "eval.protocol": "vjepa", "eval.vjepa.lr": 3e-4, "eval.vjepa.batch_size": 32,
        "eval.vjepa.iterations": 40_000, "eval.vjepa.frames_per_clip": 16, "eval.vjepa.fps": 12,
        "eval.max_probe_samples": None,
    },
    "future_prediction_paper": {
        "scenario.name": "future_prediction", "scenario.backbone.preset": "large", "scenario.decoder": "linear",
        "stream.frames_per_clip": 4, "stream.fps": 30, "stream.target_frames": 4, "stream.target_offset_s": 0.64,
        "stream.resolution": 224, "optimizer.lr": 1e-4, "optimizer.weight_decay": 1e-5,
        "optimizer.weight_decay_end": None, "stream.batch_size": 16, "trainer.max_steps": 540_000,
    },
}

# ViT-S/16 (384 dim, 6 heads, 12 blocks), ViT-B/16 (768, 12, 12), ViT-L/16 (1024, 16, 24), and the parameters of
# the backbone each scenario builds: DoRA's image ViT-S as timm's (21.7M); the video ViTs swap the 16 x 16 patch
# embedding for a 2 x 16 x 16 tubelet embedding, VideoMAE's also [CLS] and learned positions for fixed ones (86.2M);
# future prediction keeps them, as its ImageNet-21K start has them (304.1M).
BACKBONES = {
    "dora_paper": ((16, 384, 6, 12), 21_665_664),
    "videomae_paper": ((16, 768, 12, 12), 86_236_416),
    "future_prediction_paper": ((16, 1024, 16, 24), 304_088_064),
}


def paper(name, *extra):
    return compose([f"+experiment={name}", *DATA[name], *extra])


def value(cfg, dotted):
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


@pytest.mark.parametrize("name", sorted(TABLES))
def test_experiment_sets_its_table(name):
    cfg = paper(name)
    assert cfg.experiment == name
    for key, expected in TABLES[name].items():
        got = value(cfg, key)
        assert got == (pytest.approx(expected) if isinstance(expected, float) else expected), key
    opt = cfg.optimizer
    assert opt.warmup_steps > 0 and opt.min_lr_ratio < 1  # warm-up + cosine
    assert cfg.stream.order == "batch_along_time"
    assert cfg.trainer.use_gpu and cfg.trainer.bf16 is None  # bf16 on a GPU, fp32 on a CPU rehearsal
    assert cfg.stream.batch_size % cfg.trainer.num_workers == 0


@pytest.mark.parametrize("name", sorted(TABLES))
def test_a_paper_preset_autocasts_bf16_on_a_gpu_and_rehearses_in_fp32_on_a_cpu(name):
    """The CPU rehearsal (`trainer.use_gpu=false`) of a GPU preset must not autocast to bf16: on a CPU without bf16
    units that costs ~10x fp32 (it made the ViT-S VideoMAE rehearsal's correlation 4 x 260 s instead of 4 x 25 s)."""
    from raystream.train.step import autocast_for

    cfg = paper(name, "trainer.use_gpu=false")
    assert autocast_for(cfg.trainer, torch.device("cpu")) is contextlib.nullcontext
    assert autocast_for(cfg.trainer, torch.device("cuda")) is not contextlib.nullcontext
    assert autocast_for(compose([f"+experiment={name}", *DATA[name], "trainer.bf16=true"]).trainer,
                        torch.device("cpu")) is not contextlib.nullcontext  # asked for: on any device


@pytest.mark.parametrize("name", sorted(TABLES))
def test_experiment_builds_its_backbone_with_the_paper_parameter_count(name):
    cfg = paper(name)
    (patch, dim, heads, depth), params = BACKBONES[name]
    shape = preset_shape(cfg.scenario.backbone)
    assert (shape.patch_size, shape.embed_dim, shape.num_heads, shape.depth) == (patch, dim, heads, depth)
    with torch.device("meta"):  # shapes and counts only: nothing allocated
        scenario = build_scenario(cfg.scenario, cfg.stream, seed=0)
    model = scenario.model
    backbone = model.student.backbone if name == "dora_paper" else model.encoder
    assert sum(p.numel() for p in backbone.parameters()) == params
    if name == "dora_paper":
        assert model.student.head.last_layer.weight_v.shape[0] == 65536 and model.local_size == 112
    if name == "future_prediction_paper":
        assert type(model.decoder).__name__ == "LinearDecoder" and model.target_frames == 4


@pytest.mark.parametrize("name", sorted(TABLES))
def test_experiment_runs_only_on_the_data_the_user_names(name):
    for key in (o.split("=")[0] for o in DATA[name]):
        given = [o for o in DATA[name] if not o.startswith(f"{key}=")]
        with pytest.raises(ConfigError, match=rf"`{key}` is not set \(experiment '{name}'\)"):
            compose([f"+experiment={name}", *given])
    assert compose([]).data.videos is None  # the demo stays the default elsewhere


@pytest.mark.parametrize("name", sorted(TABLES))
def test_the_adamw_baseline_keeps_the_table_settings(name):
    cfg = paper(name, "optimizer=adamw")
    assert cfg.optimizer.name == "adamw"
    for key, expected in TABLES[name].items():
        if key.startswith("optimizer."):
            assert value(cfg, key) == (pytest.approx(expected) if isinstance(expected, float) else expected), key
