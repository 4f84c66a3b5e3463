"""Structured config of the `sweep` group (`sweeps/sweep/*.yaml`). Plain data: importing it starts no Ray.

A sweep file names its search space, keyed by dotted config paths:

    grid:                       # every combination runs (one "cell" each)
      optimizer.name: [adamw, orthogonal_adamw]
      stream.order: [batch_along_time, shuffled]
      trainer.seed: [0, 1, 2]   # keys ending in `seed` are averaged over in the report (mean +- std)
    sample:                     # searched by Optuna, `num_samples` trials per grid cell
      optimizer.lr: loguniform(1e-5, 1e-3)
    fixed:                      # settings every trial shares; a command-line override of the same key wins
      trainer.max_steps: 40

A grid key may also be a config group (`optimizer: [adamw, orthogonal_adamw]` picks sweeps/optimizer/<v>.yaml).
`check_sweep` checks the structure of these fields (called from raystream/config/__init__.py's checks); that each key
exists in the composed config and each cell's values pass the range checks is checked by `raystream.tune.space.plan`,
before Ray starts.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Type

from raystream.checks import PATH_NAME, is_path_name
from raystream.tracking.names import is_seed_key
from raystream.config.sweep_study import StudyConfig, check_study

# Config groups a grid axis may select by name (sweeps/<group>/<value>.yaml); `sweep` itself is not one.
GROUPS = ("data", "stream", "scenario", "optimizer", "trainer")


@dataclass
class SweepConfig(StudyConfig):  # budget, compare, seeds: raystream/config/sweep_study.py (issue 68)
    name: str = "smoke"
    grid: Dict[str, Any] = field(default_factory=dict)
    # Grid cells left out: each entry names some grid axes with one value each, and a cell that has all of them is not
    # run (e.g. [{stream.order: shuffled, optimizer: orthogonal_adamw}]: shuffled runs of AdamW only).
    exclude: List[Any] = field(default_factory=list)  # checked in check_sweep, which names the entry
    sample: Dict[str, str] = field(default_factory=dict)
    fixed: Dict[str, Any] = field(default_factory=dict)
    num_samples: int = 1  # Optuna trials per grid cell (1 with no `sample` axes = one run per cell)
    metric: str = "loss"
    mode: str = "min"
    scheduler: Optional[str] = None  # None | asha
    grace_period: int = 5  # asha: reports a trial runs before it can be stopped
    reduction_factor: int = 2  # asha
    max_concurrent_trials: Optional[int] = None  # None = from the cluster's resources and each trial's workers
    run_name: Optional[str] = None  # None = <name>-<hash of the planned trials>; the same name again = resume
    seed: int = 0  # Optuna sampler seed
    # How often (s) the Tune experiment state (which trials finished) is saved and reaches trainer.storage_path.
    # Ray's default sync, 300 s, could lose 5 minutes of finished trials when the driver dies on a bucket (a resumed
    # sweep runs them again); each save writes a few small files.
    sync_period_s: float = 15.0
    description: str = ""


class SampleSpec(NamedTuple):
    """A parsed `sample` value: kind in loguniform | uniform | randint | choice, and its arguments."""

    kind: str
    args: tuple


_SAMPLE_RE = re.compile(r"^\s*([a-z_]+)\s*\((.*)\)\s*$", re.S)
_SAMPLE_KINDS = {"loguniform": 2, "uniform": 2, "randint": 2, "choice": 1}
SAMPLE_SYNTAX = "loguniform(low, high), uniform(low, high), randint(low, high) (high exclusive) or choice([a, b, ...])"


def parse_sample(text: Any) -> SampleSpec:
    """Parse `"loguniform(1e-5, 1e-3)"`-style text; raise ValueError saying what is wrong."""
    if not isinstance(text, str):
        raise ValueError(f"expected a string like {SAMPLE_SYNTAX}, got {text!r}")
    m = _SAMPLE_RE.match(text)
    if not m or m.group(1) not in _SAMPLE_KINDS:
        raise ValueError(f"expected {SAMPLE_SYNTAX}, got {text!r}")
    kind = m.group(1)
    try:
        args = ast.literal_eval(f"({m.group(2)},)") if m.group(2).strip() else ()
    except (ValueError, SyntaxError):
        raise ValueError(f"arguments of {text!r} are not literals") from None
    if len(args) != _SAMPLE_KINDS[kind]:
        raise ValueError(f"{kind} takes {_SAMPLE_KINDS[kind]} argument(s), got {text!r}")
    if kind == "choice":
        if not isinstance(args[0], (list, tuple)) or not args[0]:
            raise ValueError(f"choice takes a non-empty list, got {text!r}")
        return SampleSpec(kind, (list(args[0]),))
    low, high = args
    if kind == "randint":
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in args) or high <= low:
            raise ValueError(f"randint takes integers low < high, got {text!r}")
    else:
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in args) or high <= low:
            raise ValueError(f"{kind} takes numbers low < high, got {text!r}")
        if kind == "loguniform" and low <= 0:
            raise ValueError(f"loguniform takes 0 < low < high, got {text!r}")
    return SampleSpec(kind, (low, high))


def sample_bounds(spec: SampleSpec) -> List[Any]:
    """The extreme values a sampled axis can take (checked against the config's ranges before Ray starts)."""
    if spec.kind == "choice":
        return list(spec.args[0])
    low, high = spec.args
    return [low, high - 1] if spec.kind == "randint" else [low, high]


def check_sweep(sweep: Mapping[str, Any], error: Type[Exception] = ValueError) -> bool:
    """Check the structure of a `sweep` node; raise `error` naming the offending `sweep.*` key. True when fine."""

    def fail(key: str, value: Any, expected: str) -> None:
        raise error(f"sweep `{sweep.get('name')}` (sweeps/sweep/{sweep.get('name')}.yaml): config key `sweep.{key}` "
                    f"= {value!r}: expected {expected}")

    _check_axes(sweep, fail)
    _check_settings(sweep, fail)
    check_study(sweep, fail)
    return True


def _check_axes(sweep: Mapping[str, Any], fail: Callable[[str, Any, str], None]) -> None:
    """`sweep.grid`, `sweep.exclude`, `sweep.sample` and `sweep.fixed`: their keys and values."""
    grid = sweep.get("grid") or {}
    sample = sweep.get("sample") or {}
    fixed = sweep.get("fixed") or {}
    for key, values in grid.items():
        if not isinstance(key, str) or not key:
            fail("grid", key, "dotted config keys (e.g. stream.order) or group names")
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or isinstance(values, Mapping):
            fail(f"grid.{key}", values, "a list of values, e.g. [a, b]")
        if len(values) == 0:
            fail(f"grid.{key}", list(values), "a non-empty list of values")
        if "." not in key and key not in GROUPS:
            fail(f"grid.{key}", list(values), f"a dotted config key or one of the groups {', '.join(GROUPS)}")
    for i, entry in enumerate(sweep.get("exclude") or []):
        if not isinstance(entry, Mapping) or not entry:
            fail(f"exclude[{i}]", entry, "a mapping of grid axes to one value each, e.g. {stream.order: shuffled}")
        for key, value in entry.items():
            if key not in grid:
                fail(f"exclude[{i}].{key}", value, f"a grid axis ({', '.join(grid) or 'the grid is empty'})")
            if value not in list(grid[key]):
                fail(f"exclude[{i}].{key}", value, f"one of the axis' values {list(grid[key])}")
    for key, text in sample.items():
        try:
            parse_sample(text)
        except ValueError as exc:
            fail(f"sample.{key}", text, str(exc))
        if key in grid:
            fail(f"sample.{key}", text, "a key that is not also a grid axis")
        if "." not in key:
            fail(f"sample.{key}", text, "a dotted config key (e.g. optimizer.lr)")
    for key in fixed:
        if key in grid or key in sample:
            fail(f"fixed.{key}", fixed[key], "a key that is not also a grid or sample axis")
        if key.split(".")[0] == "sweep":
            fail(f"fixed.{key}", fixed[key], "a key outside sweep.*")


def _check_settings(sweep: Mapping[str, Any], fail: Callable[[str, Any, str], None]) -> None:
    """The sweep's settings: samples, metric and mode, scheduler, sync period, run name, concurrency."""
    if sweep.get("num_samples", 1) < 1:
        fail("num_samples", sweep.get("num_samples"), "an integer >= 1")
    if sweep.get("mode") not in ("min", "max"):
        fail("mode", sweep.get("mode"), "min or max")
    if sweep.get("scheduler") not in (None, "asha"):
        fail("scheduler", sweep.get("scheduler"), "null (run every trial to the end) or asha")
    if sweep.get("grace_period", 1) < 1:
        fail("grace_period", sweep.get("grace_period"), "an integer >= 1")
    if not sweep.get("sync_period_s", 15.0) > 0:
        fail("sync_period_s", sweep.get("sync_period_s"), "a number of seconds > 0")
    if sweep.get("reduction_factor", 2) < 2:
        fail("reduction_factor", sweep.get("reduction_factor"), "an integer >= 2")
    if sweep.get("run_name") is not None and not is_path_name(sweep.get("run_name")):
        fail("run_name", sweep.get("run_name"), f"null (<name>-<hash of the planned trials>) or {PATH_NAME}")
    mct = sweep.get("max_concurrent_trials")
    if mct is not None and mct < 1:
        fail("max_concurrent_trials", mct, "null (from the cluster's resources) or an integer >= 1")
    seeded = any(is_seed_key(k) for k in sweep.get("grid") or {})
    if sweep.get("num_samples", 1) > 1 and not sweep.get("sample") and not seeded:
        fail("num_samples", sweep.get("num_samples"),
             "1 when the sweep has no `sample` axes (repeat runs with a seed axis, e.g. grid.trainer.seed)")
    if sweep.get("scheduler") == "asha" and str(sweep.get("metric", "")).startswith("eval/"):
        fail("metric", sweep.get("metric"), "a per-step metric (e.g. loss) when scheduler is asha: eval/* is "
             "measured only at the end of a run")
