"""The composed run config: Hydra composes `sweeps/` onto these structured dataclasses, then ranges are checked.

Every command (`train`, `sweep`, `data inspect`, ...) goes through `compose`, so an unknown key or a bad value fails
here, before Ray starts, with a message naming the key. Ray-free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence

from omegaconf import DictConfig, OmegaConf

from raystream.data.config import DataConfig, StreamConfig
from raystream.eval.config import EvalConfig
from raystream.models.config import ScenarioConfig
from raystream.optim.config import OptimizerConfig
from raystream.tracking.config import TrackingConfig
from raystream.train.config import TrainerConfig
from raystream.tune.config import SweepConfig, check_sweep


class ConfigError(ValueError):
    """A config key has a value outside what raystream accepts; the message names the key."""


@dataclass
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    scenario: ScenarioConfig = field(default_factory=ScenarioConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    mlflow: TrackingConfig = field(default_factory=TrackingConfig)
    experiment: str = "default"


def config_dir() -> Path:
    """The Hydra config tree: `$RAYSTREAM_CONFIG_DIR`, else `sweeps/` beside the package."""
    env = os.environ.get("RAYSTREAM_CONFIG_DIR")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "sweeps"


def _register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="run_schema", node=RunConfig)


def compose(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """Compose `sweeps/<config_name>.yaml` with Hydra `overrides` and check every value.

    Raises ConfigError naming the key for unknown keys, wrong types, unknown group options and bad ranges.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    _register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"invalid config (overrides {list(overrides)}): {exc}") from None
    finally:
        GlobalHydra.instance().clear()
    check(cfg)
    return cfg


# Range checks: (dotted key, predicate, what was expected). Modules add theirs with `register_check`.
_CHECKS: List[tuple] = []


def register_check(key: str, predicate: Callable[[Any], bool], expected: str) -> None:
    _CHECKS.append((key, predicate, expected))


def check(cfg: DictConfig) -> None:
    for key, predicate, expected in _CHECKS:
        value = OmegaConf.select(cfg, key)
        if not predicate(value):
            raise ConfigError(f"config key `{key}` = {value!r}: expected {expected}")
    bs, workers = cfg.stream.batch_size, cfg.trainer.num_workers
    if bs % workers != 0:
        raise ConfigError(
            f"config key `stream.batch_size` = {bs} is not divisible by `trainer.num_workers` = {workers}: "
            "every worker must hold an equal shard of each global batch"
        )
    if cfg.scenario.name == "dora":
        from raystream.models.vit import preset_shape

        try:
            heads = preset_shape(cfg.scenario.backbone).num_heads
        except ValueError as exc:  # embed_dim not divisible by num_heads
            raise ConfigError(f"config: {exc}") from None
        if cfg.scenario.dora.num_objects > heads:
            raise ConfigError(
                f"config key `scenario.dora.num_objects` = {cfg.scenario.dora.num_objects}: expected at most the "
                f"backbone's {heads} attention heads (`scenario.backbone.num_heads` or the preset's): one head is "
                "sampled per tracked object")


def flatten(cfg: DictConfig) -> Dict[str, Any]:
    """The composed config as flat `a.b.c -> value` pairs (MLflow params)."""
    out: Dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            out[prefix] = node

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return out


def _one_of(*options: str) -> Callable[[Any], bool]:
    return lambda v: v in options


register_check("stream.order", _one_of("batch_along_time", "batch_along_video", "shuffled"),
               "one of batch_along_time, batch_along_video, shuffled")
register_check("stream.batch_size", lambda v: v >= 1, "an integer >= 1")
register_check("stream.frames_per_clip", lambda v: v >= 1, "an integer >= 1")
register_check("stream.fps", lambda v: v > 0, "a positive number of frames per second")
register_check("stream.clip_shift", lambda v: v >= 1, "an integer >= 1 (source frames)")
register_check("stream.target_frames", lambda v: v >= 0, "an integer >= 0")
register_check("stream.resolution", lambda v: v >= 8, "an integer >= 8 (pixels)")
register_check("stream.dtype", _one_of("float", "uint8"), "float or uint8")
register_check("stream.epochs", lambda v: v >= 1, "an integer >= 1")
register_check("data.decoder", _one_of("decord", "pyav"), "decord or pyav")
register_check("data.on_bad_video", _one_of("error", "skip"), "error or skip")
register_check("stream.target_offset_s", lambda v: v >= 0, "a time >= 0 (seconds)")
register_check("data.fps", lambda v: v is None or v > 0, "null or a positive source frame rate")
register_check("data.decode_timeout_s", lambda v: v > 0, "a positive number of seconds")
register_check("data.prefetch", lambda v: v >= 0, "an integer >= 0 (batches decoded ahead)")
register_check("data.max_read_through", lambda v: v >= 0, "an integer >= 0 (frames)")
register_check("data.max_open_videos", lambda v: v >= 1, "an integer >= 1")
register_check("data.read_ahead", lambda v: isinstance(v, bool), "true or false")
register_check("data.decord_reset_frames", lambda v: v >= 0, "an integer >= 0 (0 = never flush decord at keyframes)")
register_check("data.demo.kind", _one_of("moving_digits", "walking_tour"), "moving_digits or walking_tour")
register_check("data.demo.num_videos", lambda v: v >= 1, "an integer >= 1")
register_check("data.demo.frames_per_video", lambda v: v >= 1, "an integer >= 1")
register_check("data.demo.fps", lambda v: v > 0, "a positive frame rate")
register_check("data.demo.canvas", lambda v: v >= 16 and v % 2 == 0, "an even integer >= 16 (pixels)")
register_check("data.demo.objects_per_frame", lambda v: v >= 1, "an integer >= 1")
register_check("data.demo.drift_speed", lambda v: v >= 0, "a speed >= 0 (pixels per frame)")
register_check("data.demo.scene_frames", lambda v: v >= 1, "an integer >= 1 (frames)")
register_check("data.demo.digit_scale", lambda v: v >= 1, "an integer >= 1")
register_check("data.demo.crf", lambda v: 0 <= v <= 51, "an x264 crf in [0, 51]")
register_check("data.demo.probe_per_class", lambda v: v >= 2, "an integer >= 2")
register_check("data.demo.heldout_videos", lambda v: v >= 1, "an integer >= 1")
register_check("optimizer.name", _one_of("adamw", "sgd", "orthogonal_adamw", "orthogonal_sgd", "slower_adamw"),
               "one of adamw, sgd, orthogonal_adamw, orthogonal_sgd, slower_adamw")
register_check("optimizer.lr", lambda v: v >= 0, "a learning rate >= 0")
register_check("optimizer.weight_decay", lambda v: v >= 0, "a weight decay >= 0")
register_check("optimizer.orth_beta", lambda v: 0 <= v < 1, "an EMA factor in [0, 1)")
register_check("optimizer.projection", _one_of("global", "per_tensor", "dim0"), "global, per_tensor or dim0")
register_check("optimizer.orth_init", _one_of("zero", "first_grad"), "zero or first_grad")
register_check("optimizer.eps", lambda v: v >= 0, "an epsilon >= 0")
register_check("optimizer.momentum", lambda v: v >= 0, "a momentum >= 0")
register_check("optimizer.betas", lambda v: len(v) == 2 and all(0 <= b < 1 for b in v),
               "two Adam betas, each in [0, 1)")
register_check("optimizer.weight_decay_end", lambda v: v is None or v >= 0,
               "null (constant weight decay) or a final weight decay >= 0")
register_check("optimizer.warmup_steps", lambda v: v >= 0, "an integer >= 0 (steps)")
register_check("optimizer.min_lr_ratio", lambda v: 0 <= v <= 1, "a fraction of optimizer.lr in [0, 1]")
register_check("optimizer.grad_clip", lambda v: v >= 0, "a gradient-norm bound >= 0 (0 = no clipping)")
register_check("optimizer.no_decay_1d", lambda v: isinstance(v, bool), "true or false")
register_check("scenario.name", _one_of("videomae", "future_prediction", "dora"),
               "one of videomae, future_prediction, dora")
register_check("scenario.backbone.preset", _one_of("tiny", "small", "base", "large"), "tiny, small, base or large")
register_check("scenario.mask.ratio", lambda v: 0 < v < 1, "a masking ratio in (0, 1)")
register_check("scenario.mask.mode", _one_of("per_sample", "per_batch", "fixed"), "per_sample, per_batch or fixed")
for _key in ("patch_size", "embed_dim", "depth", "num_heads"):
    register_check(f"scenario.backbone.{_key}", lambda v: v is None or v >= 1, "null (the preset's) or an integer >= 1")
register_check("scenario.backbone.tubelet_size", lambda v: v >= 1, "an integer >= 1 (frames per tubelet)")
register_check("scenario.backbone.in_chans", lambda v: v >= 1, "an integer >= 1 (colour channels)")
register_check("scenario.backbone.init", lambda v: bool(v), "random, a .pt/.safetensors file or a checkpoint dir")
register_check("scenario.decoder_depth", lambda v: v >= 1, "an integer >= 1")
register_check("scenario.decoder_dim", lambda v: v is None or v >= 1, "null (half the encoder's) or an integer >= 1")
register_check("scenario.decoder_heads", lambda v: v is None or v >= 1, "null (half the encoder's) or an integer >= 1")
# scenario.dora.*: the ranges of raystream/models/dora/scenario.py's dora_options, checked here before Ray starts.
register_check("scenario.dora.num_objects", lambda v: v >= 1, "an integer >= 1 (at most the backbone's heads)")
register_check("scenario.dora.local_crops", lambda v: v >= 0, "an integer >= 0")
register_check("scenario.dora.local_size", lambda v: v is None or v >= 1,
               "null (stream.resolution // 2) or a size in pixels >= 1")
for _key in ("local_crop_min", "local_crop_max", "global_crop_min"):
    register_check(f"scenario.dora.{_key}", lambda v: 0 < v <= 1, "an area fraction in (0, 1]")
register_check("scenario.dora", lambda v: v.local_crop_min <= v.local_crop_max,
               "scenario.dora.local_crop_min <= scenario.dora.local_crop_max")
for _key in ("color_jitter", "grayscale", "flip"):
    register_check(f"scenario.dora.{_key}", lambda v: 0 <= v <= 1, "a probability in [0, 1]")
register_check("scenario.dora.out_dim", lambda v: v >= 2, "an integer >= 2")
for _key in ("hidden_dim", "bottleneck_dim", "head_layers", "sinkhorn_iters"):
    register_check(f"scenario.dora.{_key}", lambda v: v >= 1, "an integer >= 1")
register_check("scenario.dora.freeze_last_layer_steps", lambda v: v >= 0, "an integer >= 0 (steps)")
for _key in ("student_temp", "teacher_temp"):
    register_check(f"scenario.dora.{_key}", lambda v: v > 0, "a temperature > 0")
register_check("scenario.dora.center_momentum", lambda v: 0 <= v < 1, "an EMA factor in [0, 1)")
register_check("scenario.dora.momentum_teacher", lambda v: 0 <= v <= 1, "an EMA factor in [0, 1]")
register_check("scenario.dora.momentum_steps", lambda v: v is None or v >= 1,
               "null (the run's total steps) or an integer >= 1")
register_check("scenario.dora.sinkhorn_epsilon", lambda v: v > 0, "a value > 0")
register_check("scenario.dora.loss_rule", _one_of("paper", "official"), "paper or official")
register_check("eval.every", lambda v: v >= 0, "an integer >= 0 (0 = only at the end)")
register_check("eval.metrics", lambda v: all(m in ("knn", "linear", "attentive") for m in v),
               "a list of knn, linear, attentive")
register_check("eval.knn_k", lambda v: v >= 1, "an integer >= 1")
register_check("eval.knn_temperature", lambda v: v > 0, "a temperature > 0")
register_check("eval.probe_epochs", lambda v: v >= 1, "an integer >= 1")
register_check("eval.max_probe_samples", lambda v: v >= 1, "an integer >= 1")
register_check("eval.batch_size", lambda v: v >= 1, "an integer >= 1")
register_check("eval.linear_optimizer", _one_of("lbfgs", "sgd"), "lbfgs or sgd")
register_check("eval.linear_weight_decay", lambda v: v >= 0, "a weight decay >= 0")
register_check("eval.attentive_epochs", lambda v: v >= 1, "an integer >= 1")
register_check("eval.attentive_lr", lambda v: v > 0, "a learning rate > 0")
register_check("eval.heldout_batches", lambda v: v >= 1, "an integer >= 1")
register_check("trainer.num_workers", lambda v: v >= 1, "an integer >= 1")
register_check("trainer.checkpoint_every", lambda v: v >= 1, "an integer >= 1")
register_check("trainer.keep_checkpoints", lambda v: v >= 1, "an integer >= 1")
register_check("trainer.max_failures", lambda v: v >= -1, "an integer >= -1 (-1 = retry forever)")
register_check("trainer.cpus_per_worker", lambda v: v > 0, "a number of CPUs > 0")
register_check("trainer.max_steps", lambda v: v is None or v >= 1, "null (the whole stream) or an integer >= 1")
register_check("trainer.log_every", lambda v: v >= 1, "an integer >= 1 (steps)")
register_check("trainer.report_every", lambda v: v >= 1, "an integer >= 1 (steps)")
register_check("trainer.run_name", lambda v: v is None or (bool(v) and "/" not in v and v.strip() == v),
               "null (a generated name) or a name without '/' or surrounding spaces")
register_check("trainer.ray_log_level", _one_of("DEBUG", "INFO", "WARNING", "ERROR"), "DEBUG, INFO, WARNING or ERROR")
register_check("mlflow.experiment", lambda v: bool(v), "a non-empty MLflow experiment name")
register_check("sweep", lambda v: check_sweep(v, ConfigError), "a valid sweep (see raystream/tune/config.py)")
