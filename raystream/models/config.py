"""Structured config of the `scenario` group (`sweeps/scenario/*.yaml`). Plain data: no torch, no Ray."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from raystream.checks import Check, one_of


@dataclass
class BackboneConfig:
    """A ViT backbone: a preset (tiny | small | base | large) and optional overrides of its shape.

    `init`: `random` (seeded by `seed` and the run seed), a local `.pt`/`.safetensors` state dict (raystream's, or a
    published one: DINO/DoRA, timm, transformers ViT, official VideoMAE), or a raystream checkpoint / run directory
    (its `model.pt`), or an MLflow model (`models:/<model_id>`, `models:/<name>@<alias>`: a raystream model MLflow
    holds, fetched into the node's cache); see raystream/models/checkpoint.py and published.py. `init_from`: which network of a DINO/DoRA
    training checkpoint (`teacher`, DINO's evaluation default, or `student`).
    `pos_embed` (video backbones): `sinusoid` (VideoMAE) or `learned` (an image checkpoint's [CLS] and 2-D positions,
    shared by the time slices). `qkv_bias`: `qkv` (timm/DINO) or `qv` (VideoMAE's q and v biases, no k bias).
    """

    preset: str = "tiny"
    patch_size: Optional[int] = None
    embed_dim: Optional[int] = None
    depth: Optional[int] = None
    num_heads: Optional[int] = None
    tubelet_size: int = 2
    in_chans: int = 3
    init: str = "random"
    init_from: str = "teacher"  # teacher | student (DINO/DoRA training checkpoints)
    pos_embed: str = "sinusoid"  # sinusoid | learned (video backbones; images always learn theirs)
    qkv_bias: str = "qkv"  # qkv | qv
    seed: int = 0


@dataclass
class MaskConfig:
    """VideoMAE tube masking."""

    ratio: float = 0.9
    mode: str = "per_sample"  # per_sample | per_batch | fixed


@dataclass
class ScenarioConfig:
    """Which of the paper's scenarios a run trains: videomae | future_prediction | dora.

    `decoder` (VideoMAE, future prediction): `transformer`, MAE's light decoder of `decoder_depth` blocks, width and
    heads half the encoder's when `decoder_dim` / `decoder_heads` are None; or `linear` (future prediction only,
    the paper's Table 7): one linear map from each encoder token to the pixels of the target tubelet at the same
    place, so the clip and its targets must have the same number of frames.
    """

    name: str = "videomae"
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    mask: MaskConfig = field(default_factory=MaskConfig)
    decoder: str = "transformer"  # transformer | linear
    decoder_depth: int = 1
    decoder_dim: Optional[int] = None
    decoder_heads: Optional[int] = None
    norm_pix_loss: bool = True
    dora: "DoraConfig" = field(default_factory=lambda: DoraConfig())  # scenario.name=dora only


@dataclass
class DoraConfig:
    """DoRA (scenario.name=dora; see raystream/models/dora/). Defaults are the tiny CPU preset; the paper's values
    are in sweeps/scenario/dora_paper.yaml (2 global crops, 6 local crops, out_dim 65536, hidden 2048, bottleneck 256)."""

    num_objects: int = 3  # attention heads sampled per step = objects tracked = masked clips per clip
    global_crops: int = 1  # 1 (DoRA's released code) | 2 (the paper's Table 5, DINO's loss over both; loss.py)
    local_crops: int = 2
    local_size: Optional[int] = None  # null = stream.resolution // 2 (112 at 224), rounded to the patch size
    local_crop_min: float = 0.05  # local crops cover [min, max] of the frame's area
    local_crop_max: float = 0.4
    global_crop_min: float = 0.4  # the teacher's view covers [min, 1] of the frame's area
    color_jitter: float = 0.8  # probability of brightness/contrast/saturation jitter per frame
    grayscale: float = 0.2
    flip: float = 0.5
    out_dim: int = 256
    hidden_dim: int = 256
    bottleneck_dim: int = 64
    head_layers: int = 3
    norm_last_layer: bool = True
    freeze_last_layer_steps: int = 0
    student_temp: float = 0.1
    teacher_temp: float = 0.04
    center_momentum: float = 0.9
    momentum_teacher: float = 0.996  # cosine schedule to 1 over momentum_steps
    momentum_steps: Optional[int] = None  # null = the run's total steps (scenario.set_total_steps)
    sinkhorn_epsilon: float = 0.05
    sinkhorn_iters: int = 30
    loss_rule: str = "paper"  # paper | official (the official code's two quirks; see raystream/models/dora/loss.py)


# The options a `scenario` key takes; `raystream.models.build_scenario` and the ViT presets accept exactly these.
SCENARIOS = ("videomae", "future_prediction", "dora")
BACKBONE_PRESETS = ("tiny", "small", "base", "large")
MASK_MODES = ("per_sample", "per_batch", "fixed")
DORA_LOSS_RULES = ("paper", "official")
DECODERS = ("transformer", "linear")
INIT_FROM = ("teacher", "student")
POS_EMBEDS = ("sinusoid", "learned")
QKV_BIASES = ("qkv", "qv")

CHECKS = [
    one_of("name", SCENARIOS),
    one_of("backbone.preset", BACKBONE_PRESETS),
    Check("mask.ratio", lambda v: 0 < v < 1, "a masking ratio in (0, 1)"),
    one_of("mask.mode", MASK_MODES),
    *[Check(f"backbone.{key}", lambda v: v is None or v >= 1, "null (the preset's) or an integer >= 1")
      for key in ("patch_size", "embed_dim", "depth", "num_heads")],
    Check("backbone.tubelet_size", lambda v: v >= 1, "an integer >= 1 (frames per tubelet)"),
    Check("backbone.in_chans", lambda v: v >= 1, "an integer >= 1 (colour channels)"),
    Check("backbone.init", lambda v: bool(v), "random, a .pt/.safetensors file, a checkpoint dir or a models:/ URI"),
    one_of("backbone.init_from", INIT_FROM),
    one_of("backbone.pos_embed", POS_EMBEDS),
    one_of("backbone.qkv_bias", QKV_BIASES),
    one_of("decoder", DECODERS),
    Check("decoder_depth", lambda v: v >= 1, "an integer >= 1"),
    Check("decoder_dim", lambda v: v is None or v >= 1, "null (half the encoder's) or an integer >= 1"),
    Check("decoder_heads", lambda v: v is None or v >= 1, "null (half the encoder's) or an integer >= 1"),
    # DoRA's ranges (the only place they are written; dora/scenario.py trusts them).
    Check("dora.num_objects", lambda v: v >= 1, "an integer >= 1 (at most the backbone's heads)"),
    Check("dora.global_crops", lambda v: v in (1, 2), "1 (DoRA's released code) or 2 (the paper's Table 5)"),
    Check("dora", lambda v: v.global_crops == 1 or v.loss_rule == "paper",
          "scenario.dora.loss_rule = paper when scenario.dora.global_crops = 2 (the official rule has one global view)"),
    Check("dora.local_crops", lambda v: v >= 0, "an integer >= 0"),
    Check("dora.local_size", lambda v: v is None or v >= 1, "null (stream.resolution // 2) or a size in pixels >= 1"),
    *[Check(f"dora.{key}", lambda v: 0 < v <= 1, "an area fraction in (0, 1]")
      for key in ("local_crop_min", "local_crop_max", "global_crop_min")],
    Check("dora", lambda v: v.local_crop_min <= v.local_crop_max,
          "scenario.dora.local_crop_min <= scenario.dora.local_crop_max"),
    *[Check(f"dora.{key}", lambda v: 0 <= v <= 1, "a probability in [0, 1]")
      for key in ("color_jitter", "grayscale", "flip")],
    Check("dora.out_dim", lambda v: v >= 2, "an integer >= 2"),
    *[Check(f"dora.{key}", lambda v: v >= 1, "an integer >= 1")
      for key in ("hidden_dim", "bottleneck_dim", "head_layers", "sinkhorn_iters")],
    Check("dora.freeze_last_layer_steps", lambda v: v >= 0, "an integer >= 0 (steps)"),
    *[Check(f"dora.{key}", lambda v: v > 0, "a temperature > 0") for key in ("student_temp", "teacher_temp")],
    Check("dora.center_momentum", lambda v: 0 <= v < 1, "an EMA factor in [0, 1)"),
    Check("dora.momentum_teacher", lambda v: 0 <= v <= 1, "an EMA factor in [0, 1]"),
    Check("dora.momentum_steps", lambda v: v is None or v >= 1, "null (the run's total steps) or an integer >= 1"),
    Check("dora.sinkhorn_epsilon", lambda v: v > 0, "a value > 0"),
    one_of("dora.loss_rule", DORA_LOSS_RULES),
]


def decoder_error(scenario: "ScenarioConfig", stream: "Any") -> Optional[str]:
    """Why `scenario.decoder` cannot serve this scenario on this stream (a message naming the keys), or None.

    A `linear` decoder maps encoder token i to target token i: only future prediction has a target for every
    encoder token, and only when the clip and its targets have the same number of frames.
    """
    if scenario.decoder != "linear":
        return None
    if scenario.name != "future_prediction":
        return (f"config key `scenario.decoder` = 'linear' with `scenario.name` = {scenario.name!r}: expected "
                "scenario.name=future_prediction (a linear decoder cannot fill in tokens the encoder never saw)")
    if stream.target_frames != stream.frames_per_clip:
        return (f"config key `scenario.decoder` = 'linear' maps each input token to one target token: expected "
                f"`stream.target_frames` = `stream.frames_per_clip`, got {stream.target_frames} and "
                f"{stream.frames_per_clip}")
    return None
