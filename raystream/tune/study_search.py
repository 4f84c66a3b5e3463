"""What a sweep runs, given what has run already and what it may spend (issue 68): the trials it reuses, the Ray Tune
search algorithm of the rest (every grid cell x Optuna, or seeds round by round for a comparison), kept within the
budget, and the lines and params that say so.

    reused = identity.find_reused(client, experiment_id, the_plan)  # before the Tuner: finished, same identity
    links = link_reused(client, reused, parent_id, tags_of)    # each shown under the new parent run
    search = search_algorithm(cfg, the_plan, reused, estimates)
    ...tuner.fit()...
    lines = summary_lines(search, reused)                      # reused, budget and spend, each comparison
"""

from __future__ import annotations

import copy
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from ray.tune.search import Searcher

from raystream.config import ConfigError

from raystream.tune import identity
from raystream.tune.adaptive import SeedSearcher, comparison_of
from raystream.tune.adaptive import summary_lines as comparison_lines
from raystream.tune.budget import Ledger, budget_of, check_plan, plan_estimates, trial_resources
from raystream.tune.budget_search import BudgetSearcher
from raystream.tune.searcher import GridOptunaSearcher
from raystream.tune.space import SweepPlan, optuna_space
from raystream.config.sweep_study import seed_axis


STOPPED_BY_TAG = "raystream.stopped_by"  # the parent run of a sweep the budget ended: "budget"


def budget_estimates(cfg, overrides: Sequence[str]) -> Optional[List[float]]:
    """Before Ray starts, for a sweep with a budget: the plan's resource-hours of one trial of each cell, the budget
    checked against them (ConfigError naming the key, the plan printed first, on stderr); None without a budget or
    without a rate for the setting (said)."""
    if budget_of(cfg.sweep, "GPU-hours") is None:
        return None
    from raystream.tune.plan import make_plan, text  # lazy: the plan reads the streams' lengths

    # Per-trial estimates: the resources are not this machine's question here (a cluster may grow), so none limits.
    p = make_plan("sweep", copy.deepcopy(cfg), overrides, gpus=10 ** 6, cpus=10.0 ** 6)
    try:
        note = check_plan(cfg.sweep, p.cells, samples=int(cfg.sweep.num_samples))
    except ConfigError:
        print(text(p), file=sys.stderr, flush=True)
        raise
    if note:
        print(f"raystream: {note}", file=sys.stderr, flush=True)
    return plan_estimates(p.cells)


def link_reused(client, reused: Mapping[int, Any], parent_run_id: str,
                tags_of: Callable[[int, str], Dict[str, str]]) -> Dict[int, str]:
    """cell -> the child run under `parent_run_id` that shows its reused trial (`tags_of(cell, trial id)`: the new
    sweep's tags of a trial). A trial linked by an earlier session of this sweep is not linked again."""
    have = {r.data.tags.get(identity.REUSED_FROM_TAG): r.info.run_id for r in client.search_runs(
        [client.get_run(parent_run_id).info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}'", max_results=10000)}
    links = {}
    for cell, run in reused.items():
        origin = run.info.run_id
        links[cell] = have.get(origin) or identity.link_reused(client, run, parent_run_id,
                                                               tags_of(cell, f"reused-{origin[:8]}"))
    return links


def search_algorithm(cfg, the_plan: SweepPlan, reused: Mapping[int, Any],
                     estimates: Optional[Sequence[float]] = None) -> Searcher:
    """The sweep's searcher: SeedSearcher when it names a comparison and a seed range, else every cell not reused x
    Optuna; wrapped in the budget when there is one. `estimates`: the plan's resource-hours of one trial of each
    cell (None when the plan has no rate: the budget then estimates a trial from the ones measured)."""
    sweep = cfg.sweep
    values = [c.values for c in the_plan.cells]
    comparison = comparison_of(sweep, seed_axis(sweep.grid) or "")
    if comparison is not None:
        known = {cell: _metric(run, comparison.metric) for cell, run in reused.items()}
        searcher: Searcher = SeedSearcher(values, comparison, known=known)
    else:
        searcher = GridOptunaSearcher(values, optuna_space(the_plan.sample), the_plan.num_samples,
                                      metric=sweep.metric, mode=sweep.mode, seed=int(sweep.seed),
                                      run_cells=[i for i in range(len(values)) if i not in reused])
    held = [trial_resources(c.config) for c in the_plan.cells]
    budget = budget_of(sweep, held[0][1]) if held else None
    if budget is None:
        return searcher
    planned = list(estimates) if estimates is not None else [0.0] * len(held)
    return BudgetSearcher(searcher, Ledger(budget, planned=planned, resources=[h for h, _ in held]))


def _metric(run, key: str) -> Optional[float]:
    value = run.data.metrics.get(key)
    return float(value) if value is not None else None


def summary_lines(search: Searcher, reused: Mapping[int, Any], planned: int) -> List[str]:
    """The sweep summary's lines of issue 68: how many trials were reused, the budget and its spend (and what it
    left out), each comparison and the trials the seed rounds saved."""
    lines = [f"{len(reused)} of {planned} trials reused (finished before, same config), not run again"] \
        if reused else []
    inner = search.searcher if isinstance(search, BudgetSearcher) else search
    if isinstance(search, BudgetSearcher):
        lines.append(search.ledger.line() + (f": cells {search.ledger.not_run}" if search.ledger.not_run else ""))
    if isinstance(inner, SeedSearcher):
        lines += comparison_lines(inner.summary())
        lines.append(f"seed rounds: {inner.trials_saved()} trials of the full grid not run")
    return lines


def parent_metrics(search: Searcher) -> Dict[str, float]:
    """What the parent run records of the budget and the spend (metrics: a resumed session updates them)."""
    if not isinstance(search, BudgetSearcher):
        return {}
    s = search.ledger.summary()
    return {"study/budget_hours": float(s["budget"]), "study/spent_hours": float(s["spent"]),
            "study/stopped_by_budget": float(s["stopped_by_budget"]), "study/not_run": float(len(s["not_run"]))}


def prepare_search(cfg, the_plan: SweepPlan, uri: str, parent_run_id: str, estimates: Optional[Sequence[float]],
                   tags_of: Callable[[int, str], Dict[str, str]]):
    """A new sweep's (searcher, reused trials): the finished trials of the same identity in the parent's experiment
    found and linked under it (said on stderr), the searcher of the rest built."""
    from raystream.tracking.store import client as mlflow_client, retry  # lazy: as the sweep's other MLflow reads

    client = mlflow_client(uri)
    experiment_id = retry(lambda: client.get_run(parent_run_id), "get parent run").info.experiment_id
    reused = retry(lambda: identity.find_reused(client, experiment_id, the_plan), "find finished trials")
    if reused:
        retry(lambda: link_reused(client, reused, parent_run_id, tags_of), "link reused trials")
        print(f"sweep {the_plan.name}: {len(reused)} of {the_plan.num_trials} trials finished before with the same "
              "config: reused, not run again", file=sys.stderr, flush=True)
    return search_algorithm(cfg, the_plan, reused, estimates), reused


def finish_study(uri: str, parent_run_id: str, search: Optional[Searcher], reused: Mapping[int, Any],
                 planned: int) -> List[str]:
    """The summary's lines of this session's search (none for a resumed one: Tune holds its searcher), the budget
    and spend recorded on the parent run (metrics, and tag `raystream.stopped_by` = budget when it stopped it)."""
    if search is None:
        return []
    from raystream.tracking.store import client as mlflow_client, retry  # lazy: as above

    client = mlflow_client(uri)
    try:
        for key, value in parent_metrics(search).items():
            retry(lambda key=key, value=value: client.log_metric(parent_run_id, key, value), "log the sweep's spend")
        if isinstance(search, BudgetSearcher) and search.ledger.stopped:
            retry(lambda: client.set_tag(parent_run_id, STOPPED_BY_TAG, "budget"), "tag the sweep's stop")
    except Exception as exc:  # the sweep's end (its record, the upload command) matters more than these
        print(f"raystream: could not record the sweep's spend in MLflow: {exc}", file=sys.stderr)
    return summary_lines(search, reused, planned)
