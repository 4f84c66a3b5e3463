"""Seeds until the answer is known (issue 68): a Ray Tune Searcher that adds seeds round by round only to the grid
cells whose comparison with the baseline is still open.

A sweep names its comparison (`sweep.compare`: the axis, its baseline value, the metric and its direction, a
margin, alpha) and a seed range (`sweep.seeds`: min, max; raystream/config/sweep_study.py). Cells that differ only
in the axis and the seed form a group: the baseline and the values compared with it. Round 1 runs the first `min`
seeds of the grid's seed axis in every cell; when a group's round has ended, each compared cell's difference from
the baseline (cell - baseline, paired by seed: the same seed is the same initial weights and the same stream) gets a
t interval. A comparison is resolved when its interval excludes zero (a difference) or lies inside
[-margin, margin] (none that matters); the open ones and the baseline get the next seed, up to `max`.

Looking after every round and adding seeds because of what was seen would make a plain 1 - alpha interval too
narrow (on a null, some look declares a difference far more often than alpha). Each look uses alpha / R, R = the
number of rounds there can be (max - min + 1): by the union bound, over all the looks of a study a comparison with
no difference is declared different with probability at most alpha (Bonferroni; tests/tune/test_adaptive.py
simulates it). The intervals reported are these per-look intervals.

Every trial is a grid cell (the seed is a grid value), so reuse (raystream/tune/identity.py) and Tune's resume
apply: cells already finished are given as `known` and not run again; the searcher's state is saved with the Tune
experiment, so a sweep interrupted mid-round resumes without suggesting a cell twice. A group whose baseline cell is
left out (sweep.exclude) has nothing to compare with: its cells run every seed up to `max`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ray.tune.search import Searcher
from scipy import stats

from raystream.tune.searcher import CELL_KEY, PickledSearcher

OPEN, DIFFERENT, EQUIVALENT = "open", "different", "equivalent"


@dataclass(frozen=True)
class Comparison:
    """What a sweep compares: `axis`'s values against `baseline`, on `metric` (`mode`: min or max is better)."""

    axis: str
    baseline: Any
    metric: str
    mode: str
    seed_key: str
    min_seeds: int
    max_seeds: int
    margin: float = 0.0
    alpha: float = 0.05

    @property
    def rounds(self) -> int:
        return self.max_seeds - self.min_seeds + 1

    @property
    def look_alpha(self) -> float:
        """The alpha of each look: alpha split evenly over the rounds there can be (Bonferroni)."""
        return self.alpha / self.rounds


def comparison_of(sweep: Mapping[str, Any], seed_key: str) -> Optional[Comparison]:
    """The sweep's comparison (None without `sweep.compare.axis` and `sweep.seeds`); keys checked in raystream.config.sweep_study."""
    compare, seeds = sweep.get("compare") or {}, sweep.get("seeds") or {}
    if compare.get("axis") is None or seeds.get("min") is None:
        return None
    return Comparison(axis=str(compare["axis"]), baseline=compare["baseline"],
                      metric=str(compare.get("metric") or sweep["metric"]), mode=str(compare.get("mode") or
                                                                                      sweep["mode"]),
                      seed_key=seed_key, min_seeds=int(seeds["min"]), max_seeds=int(seeds["max"]),
                      margin=float(compare.get("margin", 0.0)), alpha=float(compare.get("alpha", 0.05)))


def interval(diffs: Sequence[float], alpha: float) -> Tuple[float, float]:
    """(mean, half width) of the two-sided 1 - alpha t interval of paired differences (inf with fewer than 2)."""
    n = len(diffs)
    if n < 2:
        return (diffs[0] if diffs else math.nan), math.inf
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    return mean, float(stats.t.ppf(1 - alpha / 2, n - 1)) * sd / math.sqrt(n)


def verdict(mean: float, half: float, margin: float) -> str:
    if not math.isfinite(half):
        return OPEN
    if mean - half > 0 or mean + half < 0:
        return DIFFERENT
    if margin > 0 and -margin <= mean - half and mean + half <= margin:
        return EQUIVALENT
    return OPEN


class SeedSearcher(PickledSearcher):
    """Suggests grid cells (`cells`: each cell's grid values, in the plan's order) round by round, as the module
    says; `known`: results (the metric, None for a failed trial) of cells already finished (reused)."""

    def __init__(self, cells: Sequence[Mapping[str, Any]], comparison: Comparison,
                 known: Optional[Mapping[int, Optional[float]]] = None):
        super().__init__(metric=comparison.metric, mode=comparison.mode)
        self.comparison = comparison
        self._cells = [dict(c) for c in cells]
        seeds = list(dict.fromkeys(c[comparison.seed_key] for c in self._cells))
        self._groups: Dict[Tuple, Dict[Any, Dict[int, int]]] = {}  # group -> arm -> seed index -> cell
        for index, values in enumerate(self._cells):
            group = tuple((k, repr(v)) for k, v in values.items() if k not in (comparison.axis, comparison.seed_key))
            arm = values[comparison.axis]
            self._groups.setdefault(group, {}).setdefault(arm, {})[seeds.index(values[comparison.seed_key])] = index
        self._results: Dict[int, Optional[float]] = dict(known or {})
        self._seeds: Dict[Tuple, int] = {g: comparison.min_seeds for g in self._groups}  # seeds a group has now
        self._verdicts: Dict[Tuple, Dict[Any, Tuple[str, float, float, int]]] = {g: {} for g in self._groups}
        self._queue: deque = deque()
        self._running: Dict[str, int] = {}  # trial id -> cell
        for group in self._groups:
            self._queue.extend(self._round_cells(group, list(self._arms(group))))
        for group in self._groups:
            self._advance(group)

    def _arms(self, group: Tuple) -> Dict[Any, Dict[int, int]]:
        return self._groups[group]

    def _has_baseline(self, group: Tuple) -> bool:
        return self.comparison.baseline in self._groups[group]

    def _round_cells(self, group: Tuple, arms: Sequence[Any]) -> List[int]:
        """The cells of `arms` at the group's seeds so far, not yet run, known or queued."""
        n = self._seeds[group] if self._has_baseline(group) else self.comparison.max_seeds
        cells = [self._groups[group][arm].get(s) for arm in arms for s in range(n)]
        taken = set(self._results) | set(self._running.values()) | set(self._queue)
        return [c for c in cells if c is not None and c not in taken]

    def _advance(self, group: Tuple) -> None:
        """When the group's round has ended: judge its comparisons, queue the next seed of the open ones."""
        pending = set(self._queue) | set(self._running.values())
        if not self._has_baseline(group) or any(c in pending for arm in self._arms(group).values()
                                                for c in arm.values()):
            return
        while True:
            open_arms = [arm for arm in self._arms(group) if arm != self.comparison.baseline and
                         self._verdicts[group].get(arm, (OPEN,))[0] == OPEN and self._judge(group, arm) == OPEN]
            if not open_arms or self._seeds[group] >= self.comparison.max_seeds:
                return
            self._seeds[group] += 1
            queued = self._round_cells(group, [self.comparison.baseline, *open_arms])
            self._queue.extend(queued)
            if queued:
                return  # else: the next seed's cells are all known already; judge again

    def _judge(self, group: Tuple, arm: Any) -> str:
        base, other = self._arms(group)[self.comparison.baseline], self._arms(group)[arm]
        diffs = []
        for s in range(self._seeds[group]):
            a, b = self._results.get(other.get(s)), self._results.get(base.get(s))
            if a is not None and b is not None:
                diffs.append(a - b)
        mean, half = interval(diffs, self.comparison.look_alpha)
        status = verdict(mean, half, self.comparison.margin)
        self._verdicts[group][arm] = (status, mean, half, self._seeds[group])
        return status

    # The Ray Tune Searcher interface.
    def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: Dict, **spec) -> bool:
        if config:
            raise ValueError("SeedSearcher takes its cells from the sweep plan; pass no param_space")
        return True

    def next_cell(self) -> Optional[int]:
        return self._queue[0] if self._queue else None

    def remaining(self) -> List[int]:
        return list(self._queue)

    def suggest(self, trial_id: str) -> Optional[Dict]:
        if not self._queue:
            return None if self._running else Searcher.FINISHED
        cell = self._queue.popleft()
        self._running[trial_id] = cell
        return {CELL_KEY: cell, **self._cells[cell]}

    def on_trial_complete(self, trial_id: str, result: Optional[Dict] = None, error: bool = False) -> None:
        cell = self._running.pop(trial_id, None)
        if cell is None:
            return
        value = None if error or not result else result.get(self.comparison.metric)
        self._results[cell] = float(value) if isinstance(value, (int, float)) else None
        self._advance(self._group_of(cell))

    def _group_of(self, cell: int) -> Tuple:
        return next(g for g, arms in self._groups.items() if any(cell in a.values() for a in arms.values()))


    def summary(self) -> List[Dict[str, Any]]:
        """Each comparison: its group, the value compared, resolved (different / equivalent) or open, the difference
        (value - baseline) and its interval's half width, seeds spent, trials saved against the full grid."""
        rows = []
        for group, verdicts in self._verdicts.items():
            for arm, (status, mean, half, seeds) in verdicts.items():
                rows.append({"group": {k: v for k, v in group}, "value": arm, "baseline": self.comparison.baseline,
                             "status": status, "difference": mean, "half_width": half, "seeds": seeds,
                             "saved": self.comparison.max_seeds - seeds, "metric": self.comparison.metric,
                             "better": _better(mean, half, status, self.comparison.mode)})
        return rows

    def trials_saved(self) -> int:
        """Cells of the full grid this search never ran (and were not reused)."""
        ran = set(self._results) | set(self._running.values()) | set(self._queue)
        return len(self._cells) - len(ran)


def _better(mean: float, half: float, status: str, mode: str) -> Optional[str]:
    """Which side the resolved difference favours: `value`, `baseline`, or None (open or equivalent)."""
    if status != DIFFERENT:
        return None
    value_lower = mean < 0
    return "value" if value_lower == (mode == "min") else "baseline"


def summary_lines(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    """The summary's lines: one a comparison."""
    lines = []
    for r in rows:
        where = ",".join(f"{k}={v}" for k, v in r["group"].items()) or "all"
        half = "inf" if not math.isfinite(r["half_width"]) else f"{r['half_width']:.4g}"
        state = "open" if r["status"] == OPEN else f"resolved ({r['status']})"
        lines.append(f"{r['value']} vs {r['baseline']} [{where}]: {state}, {r['metric']} difference "
                     f"{r['difference']:+.4g} ± {half}, {r['seeds']} seeds, {r['saved']} trials saved")
    return lines
