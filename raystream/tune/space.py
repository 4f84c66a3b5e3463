"""From a composed config to the trials of a sweep: grid cells (each a fully composed, checked config) and the
Optuna distributions of the sampled axes.

`plan(cfg, overrides)` runs before Ray starts, so a sweep whose grid names an unknown key, or a value outside a
key's range, fails with a message naming `sweep.grid.<key>` (or `sweep.sample.<key>`, `sweep.fixed.<key>`).

Precedence, lowest first: the composed config, the sweep's `fixed`, the cell's grid values, then anything given on
the command line: a command-line override of a grid key collapses that axis to the given value.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import optuna.distributions as od
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from raystream.config import ConfigError, RunConfig, check, compose
from raystream.config.sweep import GROUPS, SampleSpec, parse_sample, sample_bounds


@dataclass
class Cell:
    """One combination of grid values and the composed config every trial of the cell starts from."""

    index: int
    values: Dict[str, Any]  # grid key -> value, in the sweep file's axis order
    config: Dict[str, Any]  # the composed config as a plain container

    @property
    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.values.items()) or "base"


@dataclass
class SweepPlan:
    """Everything the Tuner needs, computed and checked before Ray starts."""

    name: str
    cells: List[Cell]
    sample: Dict[str, SampleSpec]
    num_samples: int
    collapsed: Dict[str, Any] = field(default_factory=dict)  # grid axes fixed by a command-line override

    @property
    def num_trials(self) -> int:
        return len(self.cells) * self.num_samples

    @property
    def grid_keys(self) -> List[str]:
        return list(self.cells[0].values) if self.cells else []

    def fingerprint(self) -> str:
        """A short hash of what the trials will run; the default run name ends with it, so an unchanged sweep
        started again resumes, and a changed one starts fresh."""
        cells = []
        for c in self.cells:
            conf = {k: v for k, v in c.config.items() if k != "sweep"}
            cells.append({"values": c.values, "config": conf})
        sweep = self.cells[0].config["sweep"] if self.cells else {}
        payload = {
            "cells": cells,
            "sample": {k: list(v) for k, v in self.sample.items()},
            "num_samples": self.num_samples,
            "sweep": {k: sweep.get(k) for k in ("metric", "mode", "scheduler", "grace_period", "reduction_factor",
                                                 "seed")},
        }
        blob = json.dumps(payload, sort_keys=True, default=str).encode()
        return hashlib.sha1(blob).hexdigest()[:8]


def override_keys(overrides: Sequence[str]) -> List[str]:
    """The config keys a list of Hydra overrides sets (`+a.b=1` -> `a.b`, `optimizer=adamw` -> `optimizer`)."""
    keys = []
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~").strip()
        if key:
            keys.append(key)
    return keys


def _set(cfg: DictConfig, key: str, value: Any, where: str) -> None:
    if OmegaConf.select(cfg, key, default="__missing__") == "__missing__":
        raise ConfigError(f"config key `{where}`: `{key}` is not a config key (see `raystream sweep --cfg job`)")
    try:
        OmegaConf.update(cfg, key, value, merge=False)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"config key `{where}` = {value!r}: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0]}") from None


def _checked(cfg: DictConfig, where: str) -> None:
    try:
        check(cfg)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _check_cell(cfg: DictConfig, name: str, values: Dict[str, Any], fixed: Dict[str, Any]) -> None:
    """Range-check a cell; name the sweep key (`sweep.grid.<k>` / `sweep.fixed.<k>`) that set the bad value."""
    try:
        check(cfg)
    except ConfigError as exc:
        m = re.search(r"config key `([^`]+)`", str(exc))
        key = m.group(1) if m else ""
        where = (f"config key `sweep.grid.{key}`" if key in values else
                 f"config key `sweep.fixed.{key}`" if key in fixed else f"cell {values}")
        raise ConfigError(f"sweep `{name}`: {where}: {exc}") from None


def apply_values(cfg: DictConfig, values: Dict[str, Any], where: str = "sweep") -> DictConfig:
    """Set dotted `values` on a structured config (types checked by OmegaConf), then run the range checks."""
    for key, value in values.items():
        _set(cfg, key, value, f"{where}.{key}")
    _checked(cfg, f"sweep {where}")
    return cfg


def structured(container: Dict[str, Any]) -> DictConfig:
    """A plain config container back as a typed config (so assignments are type-checked)."""
    return OmegaConf.merge(OmegaConf.structured(RunConfig), container)


def plan(cfg: DictConfig, overrides: Sequence[str] = ()) -> SweepPlan:
    """Expand `cfg.sweep` into grid cells of composed, checked configs; raise ConfigError naming the key."""
    sweep = cfg.sweep
    user_keys = set(override_keys(overrides))
    grid = {k: list(v) for k, v in sweep.grid.items()}
    collapsed = {}
    for key in list(grid):
        if key in user_keys:
            collapsed[key] = OmegaConf.select(cfg, key) if key not in GROUPS else _group_choice(overrides, key)
            del grid[key]
    fixed = {k: v for k, v in OmegaConf.to_container(sweep.fixed, resolve=True).items() if k not in user_keys}
    sample = {k: parse_sample(v) for k, v in sweep.sample.items() if k not in user_keys}

    exclude = [dict(e) for e in OmegaConf.to_container(sweep.exclude, resolve=True)]
    group_keys = [k for k in grid if k in GROUPS]
    composed: Dict[Tuple, DictConfig] = {}
    cells: List[Cell] = []
    for combo in itertools.product(*grid.values()):
        values = dict(zip(grid, combo))
        if _excluded({**collapsed, **values}, exclude):
            continue
        index = len(cells)
        groups = tuple((k, values[k]) for k in group_keys)
        if groups not in composed:
            extra = [f"{k}={v}" for k, v in groups]
            try:
                composed[groups] = compose(list(overrides) + extra) if extra else copy.deepcopy(cfg)
            except ConfigError as exc:
                raise ConfigError(f"sweep `{sweep.name}`: config key `sweep.grid` with {', '.join(extra)}: {exc}") \
                    from None
        cell_cfg = copy.deepcopy(composed[groups])
        for key, value in fixed.items():
            _set(cell_cfg, key, value, f"sweep.fixed.{key}")
        for key, value in values.items():
            if key not in GROUPS:
                _set(cell_cfg, key, value, f"sweep.grid.{key}")
        _check_cell(cell_cfg, str(sweep.name), values, fixed)
        cells.append(Cell(index=index, values=values, config=OmegaConf.to_container(cell_cfg, resolve=True)))

    if not cells:
        raise ConfigError(f"sweep `{sweep.name}`: config key `sweep.exclude` leaves out every grid cell: expected at "
                          "least one cell to run")
    # Every sampled axis, at both ends of its range, must pass the checks of every key it sets.
    for key, spec in sample.items():
        for bound in sample_bounds(spec):
            probe = structured(cells[0].config)
            _set(probe, key, bound, f"sweep.sample.{key}")
            _checked(probe, f"sweep `{sweep.name}`: config key `sweep.sample.{key}` at {bound!r}")
    return SweepPlan(name=str(sweep.name), cells=cells, sample=sample, num_samples=int(sweep.num_samples),
                     collapsed=collapsed)


def _excluded(values: Dict[str, Any], exclude: Sequence[Dict[str, Any]]) -> bool:
    """Whether a cell with these axis values matches every key of one `sweep.exclude` entry."""
    return any(all(k in values and values[k] == v for k, v in entry.items()) for entry in exclude)


def _group_choice(overrides: Sequence[str], group: str) -> Optional[str]:
    for o in overrides:
        key, _, value = o.partition("=")
        if key.lstrip("+~") == group:
            return value
    return None


def optuna_space(sample: Dict[str, SampleSpec]) -> Dict[str, Any]:
    """The sampled axes as Optuna distributions (what `OptunaSearch(space=...)` takes)."""
    space = {}
    for key, spec in sample.items():
        if spec.kind == "loguniform":
            space[key] = od.FloatDistribution(float(spec.args[0]), float(spec.args[1]), log=True)
        elif spec.kind == "uniform":
            space[key] = od.FloatDistribution(float(spec.args[0]), float(spec.args[1]))
        elif spec.kind == "randint":
            space[key] = od.IntDistribution(int(spec.args[0]), int(spec.args[1]) - 1)
        else:
            space[key] = od.CategoricalDistribution(list(spec.args[0]))
    return space
