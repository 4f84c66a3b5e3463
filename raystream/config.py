"""The composed run config: Hydra composes `sweeps/` onto these structured dataclasses, then ranges are checked.

Every command (`train`, `sweep`, `data inspect`, ...) goes through `compose`, so an unknown key or a bad value fails
here, before Ray starts, with a message naming the key. Ray-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from raystream import config_tree
from raystream.checks import Check
from raystream.data import config as data_config
from raystream.data.config import DataConfig, StreamConfig
from raystream.data.stream.orders import check_shards
from raystream.eval import config as eval_config
from raystream.eval.config import EvalConfig
from raystream.models import config as models_config
from raystream.models.config import ScenarioConfig
from raystream.models.vit import preset_shape
from raystream.optim import config as optim_config
from raystream.optim.config import OptimizerConfig
from raystream.tracking import config as tracking_config
from raystream.tracking.config import TrackingConfig
from raystream.train import config as train_config
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
    """The config tree shipped with the package (`sweeps/` in a checkout); users' own: `raystream.config_tree`."""
    return config_tree.shipped_dir()


def _register_schema() -> None:
    ConfigStore.instance().store(name="run_schema", node=RunConfig)


def compose(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """Compose `sweeps/<config_name>.yaml` with Hydra `overrides` and check every value.

    Overrides of a sweep axis (`sweep.grid.<key>=[...]`, `sweep.sample.<key>=...`, `sweep.fixed.<key>=...`, with
    or without `+`, or `~` to drop one) set the dotted key `<key>` of that mapping (Hydra alone would read it as
    a nested path). Raises ConfigError naming the key for unknown keys (with or without `+`), wrong types, unknown
    group options and bad ranges.
    """
    _register_schema()
    hydra_overrides, axis_overrides = _split_sweep_axis_overrides(overrides)
    if any(o.lstrip("+~").startswith("hydra.searchpath") for o in hydra_overrides):
        raise ConfigError("override `hydra.searchpath`: add a config directory with `--config-dir DIR` or "
                          f"${config_tree.ENV} instead (both are searched after the shipped tree)")
    try:
        shipped, *users = config_tree.search_path()
    except config_tree.ConfigTreeError as exc:
        raise ConfigError(str(exc)) from None
    if users:
        hydra_overrides.append("hydra.searchpath=[" + ",".join(f"'file://{d}'" for d in users) + "]")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(shipped), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=hydra_overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"invalid config (overrides {list(overrides)}): {_reason(exc)}") from None
    finally:
        GlobalHydra.instance().clear()
    _apply_sweep_axis_overrides(cfg, axis_overrides)
    _check_known_keys(cfg)
    check(cfg)
    return cfg


# `sweep.<mapping>.<dotted key>` overrides: the mapping's keys are themselves dotted config keys.
SWEEP_AXIS_MAPPINGS = ("grid", "sample", "fixed")


def _split_sweep_axis_overrides(overrides: Sequence[str]) -> Tuple[List[str], List[Any]]:
    """(overrides Hydra applies, parsed overrides of sweep axes applied after composition)."""
    prefixes = tuple(f"sweep.{m}." for m in SWEEP_AXIS_MAPPINGS)
    hydra_overrides, axis = [], []
    for text in overrides:
        if text.split("=", 1)[0].lstrip("+~").startswith(prefixes):
            try:
                axis.append(OverridesParser.create().parse_overrides([text])[0])
            except HydraException as exc:
                raise ConfigError(f"invalid override {text!r}: {_reason(exc)}") from None
        else:
            hydra_overrides.append(text)
    return hydra_overrides, axis


def _apply_sweep_axis_overrides(cfg: DictConfig, axis_overrides: Sequence[Any]) -> None:
    for o in axis_overrides:
        _, mapping, key = o.key_or_group.split(".", 2)
        node = cfg.sweep[mapping]
        if o.type == OverrideType.DEL:
            if key not in node:
                raise ConfigError(f"override `~{o.key_or_group}`: sweep `{cfg.sweep.name}` has no {mapping} axis "
                                  f"`{key}` (it has {', '.join(node) or 'none'})")
        with open_dict(node):
            if o.type == OverrideType.DEL:
                del node[key]
            else:
                node[key] = o.value()


def _check_known_keys(cfg: DictConfig) -> None:
    """Every key is one of the schema's (`+optimizer.lrr=1` adds a key Hydra does not check)."""
    try:
        OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.to_container(cfg))
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        raise ConfigError(f"config key `{key}` is not a config key of raystream (see `raystream train --cfg job` "
                          f"for the keys): {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    """The message of `exc` and of what caused it (Hydra wraps OmegaConf's reason), without OmegaConf's
    `full_key: ...` trailer lines."""
    parts: List[str] = []
    while exc is not None and len(parts) < 4:
        line = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
        if line and line not in parts:
            parts.append(line)
        exc = exc.__cause__
    return ": ".join(parts)


# Each section's checks, declared by the package that owns it (raystream/checks.py): (section, checks).
SECTION_CHECKS: Tuple[Tuple[str, Sequence[Check]], ...] = (
    ("data", data_config.DATA_CHECKS),
    ("data.demo", data_config.DEMO_CHECKS),
    ("stream", data_config.STREAM_CHECKS),
    ("scenario", models_config.CHECKS),
    ("optimizer", optim_config.CHECKS),
    ("trainer", train_config.CHECKS),
    ("eval", eval_config.CHECKS),
    ("mlflow", tracking_config.CHECKS),
    ("", [Check("sweep", lambda v: check_sweep(v, ConfigError), "a valid sweep (see raystream/tune/config.py)")]),
)


def _required(*what: Any) -> Any:
    raise ConfigError(f"a config key is not set: expected {', '.join(str(w) for w in what)}")


# `key: ${required:what it is}` in a config file: the user must set `key` (an experiment's data, say). OmegaConf's
# own `???` cannot do this: merged over the schema's default it leaves the default in place.
OmegaConf.register_new_resolver("required", _required, replace=True)
_REQUIRED = re.compile(r"^\$\{required:(.*)\}$", re.S)


def required_keys(cfg: DictConfig) -> Dict[str, str]:
    """`{dotted key: what is expected}` of the values still `${required:...}`."""
    found = {key: _REQUIRED.match(value) for key, value in flatten(cfg, resolve=False).items() if isinstance(value, str)}
    return {key: match.group(1).strip() for key, match in found.items() if match}


def check(cfg: DictConfig) -> None:
    """Required values (`${required:...}`, e.g. an experiment's data.videos) are set, every section's range checks
    pass, then the checks across sections."""
    unset = required_keys(cfg)
    if unset:
        raise ConfigError("; ".join(f"config key `{key}` is not set (experiment {cfg.experiment!r}): expected "
                                    f"{what}; add `{key}=...`" for key, what in unset.items()))
    for section, checks in SECTION_CHECKS:
        for key, predicate, expected in checks:
            dotted = ".".join(k for k in (section, key) if k)
            value = OmegaConf.select(cfg, dotted)
            if not predicate(value):
                raise ConfigError(f"config key `{dotted}` = {value!r}: expected {expected}")
    try:
        check_shards(cfg.stream.batch_size, cfg.trainer.num_workers)
    except ValueError as exc:
        raise ConfigError(f"config key {exc}") from None
    problem = models_config.decoder_error(cfg.scenario, cfg.stream)
    if problem:
        raise ConfigError(problem)
    if cfg.scenario.name == "dora":
        try:
            heads = preset_shape(cfg.scenario.backbone).num_heads
        except ValueError as exc:  # embed_dim not divisible by num_heads
            raise ConfigError(f"config: {exc}") from None
        if cfg.scenario.dora.num_objects > heads:
            raise ConfigError(
                f"config key `scenario.dora.num_objects` = {cfg.scenario.dora.num_objects}: expected at most the "
                f"backbone's {heads} attention heads (`scenario.backbone.num_heads` or the preset's): one head is "
                "sampled per tracked object")


def flatten(cfg: DictConfig, resolve: bool = True) -> Dict[str, Any]:
    """The composed config as flat `a.b.c -> value` pairs (MLflow params); `resolve=False` keeps interpolations."""
    out: Dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            out[prefix] = node

    walk(OmegaConf.to_container(cfg, resolve=resolve), "")
    return out
