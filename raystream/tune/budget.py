"""A sweep's budget (issue 68): `sweep.budget` GPU-hours (CPU-hours where the trials use no GPU), or a cost
(`sweep.budget_cost` at `sweep.gpu_hour_price`), checked before Ray starts against the plan's estimate, and kept
while the sweep runs.

    check_budget(budget, estimates)   before Ray: refuse (ConfigError, exit 2) a budget below one trial, or one
                                      the plan's estimate of the whole sweep passes
    Ledger(budget, planned, ...)      while it runs: the spend so far, the estimates of the trials running, and
                                      whether the next trial fits; raystream.tune.budget_search.BudgetSearcher
                                      keeps it around the sweep's Ray Tune Searcher (this module imports no Ray:
                                      `raystream plan` checks the budget too)

Spend is measured: each finished trial's wall time (Tune's `time_total_s`, else the time since it was suggested)
times the GPUs its workers hold, or their CPUs where no GPU is used. The estimate of a trial is the plan's for its
cell, scaled by how the plan did on the trials that finished (measured / planned), so a plan that was short does not
let the sweep run past its cap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from raystream.config import ConfigError


@dataclass(frozen=True)
class Budget:
    hours: float  # resource-hours: GPU-hours, or CPU-hours for a sweep whose trials use no GPU
    unit: str  # "GPU-hours" | "CPU-hours"
    price: Optional[float] = None  # per resource-hour, when given
    key: str = "sweep.budget"  # the key that set it (named in every refusal)

    def said(self, hours: float) -> str:
        cost = f" ({hours * self.price:,.2f} at {self.price:g} per hour)" if self.price else ""
        return f"{hours:.4g} {self.unit}{cost}"


def trial_resources(config: Mapping[str, Any]) -> Tuple[float, str]:
    """(amount, unit) a trial holds while it runs: its workers' GPUs, or their CPUs where no GPU is used."""
    trainer = config["trainer"]
    workers = int(trainer["num_workers"])
    if trainer.get("use_gpu"):
        return float(workers), "GPU-hours"
    return workers * float(trainer.get("cpus_per_worker") or 1.0), "CPU-hours"


def budget_of(sweep: Mapping[str, Any], unit: str) -> Optional[Budget]:
    """The sweep's budget in `unit`, or None when it has none (keys checked by raystream.config.sweep_study)."""
    price = sweep.get("gpu_hour_price")
    if sweep.get("budget") is not None:
        return Budget(float(sweep["budget"]), unit, price, "sweep.budget")
    if sweep.get("budget_cost") is not None:
        return Budget(float(sweep["budget_cost"]) / float(price), unit, price, "sweep.budget_cost")
    return None


def check_budget(budget: Budget, estimates: Sequence[float]) -> None:
    """Before Ray starts: `estimates` are the plan's resource-hours of each trial. Raise ConfigError naming the key
    when the budget is below the cheapest trial, or below the whole sweep (the caller prints the plan)."""
    if not estimates:
        return
    if min(estimates) > budget.hours:
        raise ConfigError(f"config key `{budget.key}`: {budget.said(budget.hours)} is below one trial "
                          f"({budget.said(min(estimates))} by the plan): expected at least that")
    total = sum(estimates)
    if total > budget.hours:
        raise ConfigError(f"config key `{budget.key}`: the plan's estimate of the sweep, {budget.said(total)} "
                          f"for {len(estimates)} trials, is over the budget of {budget.said(budget.hours)}: raise "
                          "it, or run fewer trials (a smaller grid, sweep.seeds)")


@dataclass
class Ledger:
    """The running account of a sweep's spend against its budget (pickled with the searcher, so a resumed sweep
    keeps what the earlier sessions spent)."""

    budget: Budget
    planned: List[float]  # the plan's resource-hours of a trial of each cell
    resources: List[float]  # what a trial of each cell holds (GPUs, or CPUs)
    spent: float = 0.0
    planned_done: float = 0.0  # the plan's estimate of the trials whose spend is measured
    running: Dict[str, Tuple[int, float]] = field(default_factory=dict)  # trial id -> (cell, its start time)
    not_run: List[int] = field(default_factory=list)  # cells of trials the budget left out
    stopped: bool = False

    def estimate(self, cell: int) -> float:
        """The hours a trial of `cell` is expected to spend: the plan's, scaled by the plan's error so far."""
        scale = self.spent / self.planned_done if self.planned_done > 0 else 1.0
        return self.planned[cell] * scale

    def committed(self) -> float:
        return self.spent + sum(self.estimate(cell) for cell, _ in self.running.values())

    def fits(self, cell: int) -> bool:
        return self.committed() + self.estimate(cell) <= self.budget.hours

    def start(self, trial_id: str, cell: int) -> None:
        self.running[trial_id] = (cell, time.time())

    def finish(self, trial_id: str, wall_s: Optional[float]) -> None:
        if trial_id not in self.running:
            return
        cell, began = self.running.pop(trial_id)
        seconds = float(wall_s) if wall_s is not None else time.time() - began
        self.spent += seconds / 3600.0 * self.resources[cell]
        self.planned_done += self.planned[cell]

    def summary(self) -> Dict[str, Any]:
        """What the parent run records and the sweep's summary says."""
        return {"budget": self.budget.hours, "unit": self.budget.unit, "spent": self.spent,
                "price": self.budget.price, "stopped_by_budget": self.stopped, "not_run": list(self.not_run)}

    def line(self) -> str:
        text = f"budget {self.budget.said(self.budget.hours)}, spent {self.budget.said(self.spent)}"
        if self.stopped:
            text += f"; stopped by the budget, {len(self.not_run)} trials not run"
        return text


def plan_estimates(cells: Sequence[Any]) -> Optional[List[float]]:
    """The resource-hours of one trial of each cell by `raystream plan` (its CellPlans: the time's estimate x the GPUs
    a trial holds, or its CPUs without a GPU); None when a cell has no rate (no time to estimate)."""
    if any(cp.trial_s is None for cp in cells):
        return None
    return [cp.trial_s["estimate"] / 3600 * (cp.demand.get("GPU") or cp.demand.get("CPU") or 1.0) for cp in cells]


def check_plan(sweep: Mapping[str, Any], cells: Sequence[Any], samples: int = 1) -> Optional[str]:
    """Before Ray starts: raise ConfigError when the sweep's budget is below one trial or below the plan (its
    CellPlans, `samples` trials each); None when it fits or there is no budget, else a line saying why the budget
    could not be checked (no rate: the sweep then estimates trials from those it measures)."""
    per_cell = plan_estimates(cells)
    unit = "GPU-hours" if any((cp.demand.get("GPU") or 0) > 0 for cp in cells) else "CPU-hours"
    budget = budget_of(sweep, unit)
    if budget is None:
        return None
    if per_cell is None:
        return (f"{budget.key}: the plan knows no rate for this setting, so the budget is checked against the trials "
                "measured as they finish")
    # a trial the sweep reuses (finished before with the same identity) costs nothing
    check_budget(budget, [h for cp, h in zip(cells, per_cell) for _ in range(samples - cp.reused)])
    return None
