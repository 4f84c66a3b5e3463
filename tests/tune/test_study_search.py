"""What a sweep runs given what ran (raystream/tune/study_search.py): finished trials of the same identity reused and
linked once under the new parent (real MLflow, sqlite in tmp), the rest searched (every cell, or seed rounds for a
comparison), within the budget, and the summary's lines."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from raystream.config import compose
from raystream.tracking import names
from raystream.tune.adaptive import SeedSearcher
from raystream.tune.budget_search import BudgetSearcher
from raystream.tune.searcher import CELL_KEY, GridOptunaSearcher
from raystream.tune.space import plan
from raystream.tune.identity import find_reused
from raystream.tune.study_search import (budget_estimates, link_reused, parent_metrics, search_algorithm,
                                         summary_lines)
from test_identity import _store_trial

GRID = ["sweep.grid.trainer.seed=[0,1,2]", "sweep.grid.optimizer.name=[adamw,orthogonal_adamw]",
        "~sweep.grid.stream.order"]


def _suggest_all(searcher):
    cells = []
    for i in range(100):
        config = searcher.suggest(f"t{i}")
        if config is None or config == searcher.FINISHED:
            return cells
        cells.append(config[CELL_KEY])
        searcher.on_trial_complete(f"t{i}", {"loss": 1.0 + 0.1 * config[CELL_KEY], "time_total_s": 1.0})
    raise AssertionError("no end")


def test_a_sweep_extended_by_a_seed_runs_only_the_new_cells(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    eid = client.create_experiment("e")
    cfg = compose(GRID)
    the_plan = plan(cfg, GRID)
    old = {i: _store_trial(client, eid, c.config) for i, c in enumerate(the_plan.cells) if c.values["trainer.seed"] < 2}
    reused = find_reused(client, eid, the_plan)
    assert {i: r.info.run_id for i, r in reused.items()} == old
    search = search_algorithm(cfg, the_plan, reused)
    assert isinstance(search, GridOptunaSearcher)
    assert sorted(_suggest_all(search)) == [i for i, c in enumerate(the_plan.cells) if c.values["trainer.seed"] == 2]
    assert summary_lines(search, reused, the_plan.num_trials) == [
        "4 of 6 trials reused (finished before, same config), not run again"]

    parent = client.create_run(eid, tags={names.ROLE_TAG: names.ROLE_SWEEP}).info.run_id
    tags = lambda cell, trial: {names.TRIAL_TAG: trial, names.RUN_NAME_TAG: f"cell{cell}"}  # noqa: E731
    links = link_reused(client, reused, parent, tags)
    assert link_reused(client, reused, parent, tags) == links  # a resumed session links nothing twice
    children = client.search_runs([eid], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")
    assert sorted(r.info.run_name for r in children) == [f"cell{i}" for i in sorted(old)]


def test_a_comparison_with_seeds_and_a_budget_picks_the_searchers(tmp_path):
    overrides = [*GRID, "sweep.compare.axis=optimizer.name", "sweep.compare.baseline=adamw", "sweep.seeds.min=2",
                 "sweep.seeds.max=3", "sweep.budget=0.01"]
    cfg = compose(overrides)
    the_plan = plan(cfg, overrides)
    search = search_algorithm(cfg, the_plan, {}, estimates=[0.001] * len(the_plan.cells))
    assert isinstance(search, BudgetSearcher) and isinstance(search.searcher, SeedSearcher)
    assert search.ledger.budget.unit == "CPU-hours"
    ran = _suggest_all(search)
    assert sorted(the_plan.cells[c].values["trainer.seed"] for c in ran) == [0, 0, 1, 1]  # first round, then resolved
    lines = summary_lines(search, {}, the_plan.num_trials)
    assert lines[0].startswith("budget 0.01 CPU-hours, spent 0.001111 CPU-hours")
    assert lines[1].startswith("orthogonal_adamw vs adamw [all]: resolved (different), loss difference +0.3 ±")
    assert lines[-1] == "seed rounds: 2 trials of the full grid not run"
    assert parent_metrics(search)["study/spent_hours"] == pytest.approx(4 / 3600)


def test_a_budget_without_a_rate_is_kept_against_measured_trials(capsys):
    overrides = ["sweep=smoke", "trainer.max_steps=4", "sweep.budget=1.0"]
    assert budget_estimates(compose(overrides), overrides) is None
    assert "sweep.budget: the plan knows no rate for this setting" in capsys.readouterr().err
    assert budget_estimates(compose(["sweep=smoke"]), ["sweep=smoke"]) is None  # no budget: no plan made
