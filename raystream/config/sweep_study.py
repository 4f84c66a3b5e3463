"""The keys of a sweep that decide how much of it runs (issue 68): a budget, a comparison and a seed range.

    budget: 40              # GPU-hours (CPU-hours for a sweep whose trials use no GPU); null = no cap
    gpu_hour_price: 2.5     # price of one GPU-hour; with it the cap may be a cost instead:
    budget_cost: 100        #   the same cap as budget: 40
    compare:                # what the sweep is for: each value of `axis` against `baseline`
      axis: optimizer
      baseline: adamw
      metric: eval/knn_top1 # default: sweep.metric
      mode: max             # default: sweep.mode (which direction of the difference is better)
      margin: 0.0           # |difference| within it counts as "no practical difference" (0: never)
      alpha: 0.05           # chance of declaring a difference between two cells that have none
    seeds:                  # with `compare`: seeds added round by round while a comparison is open
      min: 2                # first round: the first `min` values of the grid's seed axis, in every cell
      max: 6                # at most this many values of the seed axis per cell

The grid keeps its seed axis (e.g. `trainer.seed: [0, 1, 2, 3, 4, 5]`): its values are the seeds, in the order
they are added, so every trial is a grid cell (its identity, reuse and resume as any other's). These settings are
sweep bookkeeping: they are no part of a trial's identity (raystream/tune/identity.py), so adding them to a sweep
reuses the trials it ran before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from raystream.tracking.names import is_seed_key


@dataclass
class CompareConfig:
    axis: Optional[str] = None  # a grid axis; null = no comparison (every cell runs every seed of the grid)
    baseline: Optional[Any] = None  # one of the axis' values
    metric: Optional[str] = None  # null = sweep.metric
    mode: Optional[str] = None  # null = sweep.mode
    margin: float = 0.0
    alpha: float = 0.05


@dataclass
class SeedsConfig:
    min: Optional[int] = None  # null (with max null): every seed of the grid's seed axis runs
    max: Optional[int] = None


@dataclass
class StudyConfig:
    """The fields SweepConfig takes from here (kept in one place so the sweep's own schema stays short)."""

    budget: Optional[float] = None
    budget_cost: Optional[float] = None
    gpu_hour_price: Optional[float] = None
    compare: CompareConfig = field(default_factory=CompareConfig)
    seeds: SeedsConfig = field(default_factory=SeedsConfig)


def seed_axis(grid: Mapping[str, Any]) -> Optional[str]:
    """The grid's seed axis (`trainer.seed`, any key ending in `seed`), the first when there are several."""
    return next((k for k in grid if is_seed_key(k)), None)


def check_study(sweep: Mapping[str, Any], fail: Callable[[str, Any, str], None]) -> None:
    """`sweep.budget*`, `sweep.compare.*` and `sweep.seeds.*`: `fail(key, value, expected)` names the first wrong
    one. (A budget below one trial needs the plan's estimate: raystream.tune.budget.check_budget.)"""
    _check_budget_keys(sweep, fail)
    compare = sweep.get("compare") or {}
    seeds = sweep.get("seeds") or {}
    grid = sweep.get("grid") or {}
    if compare.get("axis") is not None:
        _check_compare(compare, grid, sweep, fail)
    lo, hi = seeds.get("min"), seeds.get("max")
    if lo is None and hi is None:
        return
    if lo is None or hi is None:
        fail("seeds.min" if lo is None else "seeds.max", None, "both seeds.min and seeds.max, or neither")
    if not isinstance(lo, int) or lo < 2:
        fail("seeds.min", lo, "an integer >= 2 (an interval needs two seeds)")
    if not isinstance(hi, int) or hi < lo:
        fail("seeds.min", lo, f"at most seeds.max ({hi})")
    if compare.get("axis") is None:
        fail("seeds", {"min": lo, "max": hi}, "a comparison too (sweep.compare.axis): seeds are added while it is open")
    key = seed_axis(grid)
    if key is None:
        fail("seeds.max", hi, "a seed axis in the grid (e.g. grid.trainer.seed: [0, 1, 2, 3]) holding the seeds")
    if len(grid[key]) < hi:
        fail("seeds.max", hi, f"at most the {len(grid[key])} values of the seed axis grid.{key}")


def _check_budget_keys(sweep: Mapping[str, Any], fail: Callable[[str, Any, str], None]) -> None:
    for key in ("budget", "budget_cost", "gpu_hour_price"):
        value = sweep.get(key)
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            fail(key, value, "null or a number > 0")
    if sweep.get("budget") is not None and sweep.get("budget_cost") is not None:
        fail("budget_cost", sweep.get("budget_cost"), "null when sweep.budget is set (one cap: GPU-hours or a cost)")
    if sweep.get("budget_cost") is not None and sweep.get("gpu_hour_price") is None:
        fail("gpu_hour_price", None, "the price of one GPU-hour, which sweep.budget_cost needs")


def _check_compare(compare: Mapping[str, Any], grid: Mapping[str, Any], sweep: Mapping[str, Any],
                   fail: Callable[[str, Any, str], None]) -> None:
    axis = compare.get("axis")
    if axis not in grid:
        fail("compare.axis", axis, f"a grid axis ({', '.join(grid) or 'the grid is empty'})")
    if is_seed_key(axis):
        fail("compare.axis", axis, "an axis other than the seed axis (seeds are what is added)")
    if compare.get("baseline") not in list(grid[axis]):
        fail("compare.baseline", compare.get("baseline"), f"one of grid.{axis}'s values {list(grid[axis])}")
    if len(grid[axis]) < 2:
        fail("compare.axis", axis, "an axis with at least two values (the baseline and what it is compared with)")
    if compare.get("mode") not in (None, "min", "max"):
        fail("compare.mode", compare.get("mode"), "null (sweep.mode), min or max")
    margin = compare.get("margin", 0.0)
    if not isinstance(margin, (int, float)) or margin < 0:
        fail("compare.margin", margin, "a number >= 0")
    alpha = compare.get("alpha", 0.05)
    if not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        fail("compare.alpha", alpha, "a number between 0 and 1")
    if sweep.get("sample"):
        fail("compare.axis", axis, "no `sample` axes in the sweep (a comparison runs grid cells, seed by seed)")
    if sweep.get("scheduler") is not None:
        fail("compare.axis", axis, "scheduler null: a trial ASHA stops early has no final metric to compare")
