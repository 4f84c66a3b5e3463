"""The composed run config: Hydra composes `sweeps/` onto these structured dataclasses, then ranges are checked.

Every command (`train`, `sweep`, `data inspect`, ...) goes through `compose`, so an unknown key or a bad value fails
here, before Ray starts, with a message naming the key. Ray-free.

The config layer sits above the pure packages and tracking and below train and tune (pyproject.toml's
[tool.importlinter]): each section's schema lives with what it configures when that is lower (data, models, optim,
eval, tracking), and in this package when what it configures is higher, so composing imports nothing above it:

    __init__.py       RunConfig (every section), compose, check, flatten, ConfigError: the composed run config
    trainer.py        TrainerConfig: the `trainer` section (sweeps/trainer/*.yaml) and its checks
    sweep.py          SweepConfig: the `sweep` section (sweeps/sweep/*.yaml), its grid, samples and their checks
    sweep_study.py    StudyConfig: a sweep's budget, comparison and seed range (issue 68) and their checks
"""

from __future__ import annotations

import difflib
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
from raystream.optim import factory as optim_config
from raystream.optim.factory import OptimizerConfig
from raystream.tracking import config as tracking_config
from raystream.tracking.config import TrackingConfig
from raystream.config import trainer as train_config
from raystream.config.sweep import SweepConfig, check_sweep
from raystream.config.trainer import TrainerConfig


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
        raise ConfigError(f"invalid config (overrides {list(overrides)}): {_reason(exc)}"
                          f"{_did_you_mean(hydra_overrides)}") from None
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
                          f"for the keys): {_reason(exc)}{_did_you_mean([key])}") from None


# The sections a suggestion names first, the most often set first.
SECTION_ORDER = ("trainer", "optimizer", "stream", "data", "scenario", "eval", "mlflow", "sweep")


def schema_keys() -> List[str]:
    """Every dotted key of the schema, sections included (`trainer`, `trainer.seed`, ...)."""
    keys: List[str] = []

    def walk(node: Any, prefix: str) -> None:
        for k, v in node.items():
            keys.append(f"{prefix}{k}")
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")

    walk(OmegaConf.to_container(OmegaConf.structured(RunConfig), resolve=False), "")
    return keys


def nearest_keys(key: str, limit: int = 3) -> List[str]:
    """The schema keys a mistyped `key` most likely meant: those ending in the same name, shallowest and in
    SECTION_ORDER first (`seed` -> `trainer.seed`), else the closest spellings of the whole key at its depth
    (`trainer.sed` -> `trainer.seed`), else of its last name (`optimizer.lrr` -> `optimizer.lr`)."""
    keys = schema_keys()
    section, _, name = key.rpartition(".")

    def rank(k: str) -> Tuple[int, int]:
        top = k.split(".", 1)[0]
        return k.count("."), SECTION_ORDER.index(top) if top in SECTION_ORDER else len(SECTION_ORDER)

    same = sorted((k for k in keys if k.rpartition(".")[2] == name and k != key), key=rank)
    if same:
        return same[:limit]
    close = difflib.get_close_matches(key, [k for k in keys if k.count(".") == key.count(".")], n=limit,
                                      cutoff=0.8)
    if close:
        return close
    names = difflib.get_close_matches(name, sorted({k.rpartition(".")[2] for k in keys}), n=limit, cutoff=0.6)
    found = sorted((k for n in names for k in keys if k.rpartition(".")[2] == n), key=rank)
    in_section = [k for k in found if k.startswith(f"{section}.")] if section else []
    return (in_section or found)[:limit]


def _did_you_mean(overrides: Sequence[str]) -> str:
    """`; did you mean trainer.seed?` for each override whose key is not in the schema, "" when none is."""
    known = set(schema_keys())
    hints = []
    for text in overrides:
        key = text.split("=", 1)[0].lstrip("+~").strip()
        if not key or key in known or key.startswith("hydra.") or "@" in key:
            continue
        nearest = nearest_keys(key)
        if nearest:
            hints.append(f"`{key}`: did you mean {' or '.join(nearest)}?")
    return "".join(f"; {h}" for h in hints)


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
    ("", [Check("sweep", lambda v: check_sweep(v, ConfigError), "a valid sweep (see raystream/config/sweep.py)")]),
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
