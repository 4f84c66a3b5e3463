"""A sweep's budget (raystream/tune/budget.py, budget_search.py): refused before Ray when the plan passes it or one
trial does not fit; while a real Tune run goes on, no trial starts that the estimate says would pass it, and the
cells not run are named."""

from __future__ import annotations

import pickle
import time

import pytest
from ray import tune

from raystream.config import ConfigError, compose
from raystream.tune.budget import Budget, Ledger, budget_of, check_budget, check_plan, trial_resources
from raystream.tune.budget_search import BudgetSearcher
from raystream.tune.searcher import CELL_KEY, GridOptunaSearcher


def test_the_budget_is_gpu_hours_or_a_cost_at_the_price():
    assert budget_of({"budget": 2.0}, "GPU-hours") == Budget(2.0, "GPU-hours", None, "sweep.budget")
    cost = budget_of({"budget_cost": 10.0, "gpu_hour_price": 2.5}, "GPU-hours")
    assert (cost.hours, cost.key) == (4.0, "sweep.budget_cost")
    assert budget_of({}, "GPU-hours") is None
    cfg = compose(["trainer.num_workers=2", "trainer.cpus_per_worker=1.5"])
    assert trial_resources(cfg) == (3.0, "CPU-hours")
    assert trial_resources(compose(["trainer=gpu", "trainer.num_workers=2"])) == (2.0, "GPU-hours")


def test_a_budget_below_one_trial_or_below_the_plan_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"`sweep.budget`: 0.5 GPU-hours .* is below one trial \(1 GPU-hours"):
        check_budget(Budget(0.5, "GPU-hours", 2.0), [1.0, 1.0])
    with pytest.raises(ConfigError, match=r"`sweep.budget_cost`: the plan's estimate of the sweep, 3 GPU-hours "
                                          r"\(6.00 at 2 per hour\) for 3 trials, is over the budget"):
        check_budget(Budget(2.5, "GPU-hours", 2.0, "sweep.budget_cost"), [1.0, 1.0, 1.0])
    check_budget(Budget(3.0, "GPU-hours"), [1.0, 1.0, 1.0])  # exactly the plan: runs


def test_the_ledger_scales_its_estimate_by_the_plans_error_so_far():
    ledger = Ledger(Budget(9.0, "CPU-hours"), planned=[1.0, 2.0], resources=[1.0, 1.0])
    assert ledger.fits(1) and ledger.estimate(1) == 2.0
    ledger.start("a", 0)
    ledger.finish("a", wall_s=2 * 3600)  # the plan said 1 hour, it took 2
    assert ledger.spent == 2.0 and ledger.estimate(1) == 4.0
    ledger.start("b", 1)  # committed: 2 spent + 4 estimated
    assert ledger.committed() == 6.0 and ledger.fits(1) is False  # 6 + 4 > 9


def _searcher(cells, budget_s, planned_s):
    grid = GridOptunaSearcher([{"x": c} for c in cells], {}, 1, metric="loss", mode="min")
    ledger = Ledger(Budget(budget_s / 3600, "CPU-hours"), planned=[planned_s / 3600] * len(cells),
                    resources=[1.0] * len(cells))
    return BudgetSearcher(grid, ledger)


def test_the_search_waits_while_trials_run_and_ends_when_none_fits(tmp_path):
    s = _searcher([0, 1, 2], budget_s=2.5, planned_s=1.0)
    assert s.suggest("t1")[CELL_KEY] == 0 and s.suggest("t2")[CELL_KEY] == 1
    assert s.suggest("t3") is None  # 2 running (2 s estimated) + 1 > 2.5: wait for one to end
    s.on_trial_complete("t1", {"loss": 1.0, "time_total_s": 1.0})
    s.on_trial_complete("t2", {"loss": 1.0, "time_total_s": 1.0})
    path = tmp_path / "searcher.pkl"
    s.searcher.save(str(path))  # as Tune saves a wrapper and what it wraps
    resumed = _searcher([0, 1, 2], budget_s=99, planned_s=99)
    resumed.searcher.restore(str(path))
    resumed.set_state(pickle.loads(pickle.dumps(s.get_state())))  # an interrupted sweep keeps what it spent
    assert resumed.ledger.spent == pytest.approx(2 / 3600)
    assert resumed.suggest("t3") == resumed.FINISHED
    assert resumed.ledger.stopped and resumed.ledger.not_run == [2]
    assert "stopped by the budget, 1 trials not run" in resumed.ledger.line()


def _trainable(config):
    time.sleep(1.0)
    return {"loss": float(config["x"])}


def test_a_tune_run_stops_starting_trials_at_the_budget(ray_by_value, tmp_path):
    """Five 1-second trials, one at a time, a budget of 3.5 CPU-seconds: three run, the last two are named."""
    searcher = _searcher([0, 1, 2, 3, 4], budget_s=3.5, planned_s=1.0)
    tuner = tune.Tuner(tune.with_resources(_trainable, {"CPU": 1}),
                       tune_config=tune.TuneConfig(metric="loss", mode="min", search_alg=searcher, num_samples=5,
                                                   max_concurrent_trials=1),
                       run_config=tune.RunConfig(verbose=0, storage_path=str(tmp_path)))
    results = tuner.fit()
    assert sorted(r.config["x"] for r in results) == [0, 1, 2]
    ledger = searcher.ledger
    assert ledger.stopped and ledger.not_run == [3, 4]
    assert 3.0 / 3600 <= ledger.spent <= 3.5 / 3600


def _cell_plan(seconds, demand):
    from raystream.tune.plan import CellPlan

    return CellPlan(label="c", trials=1, steps=10, limited_by="the stream", global_batch=8, workers=1, demand=demand,
                    evaluations=1, checkpoints=1, optimizer="adamw",
                    trial_s=None if seconds is None else {"low": seconds, "estimate": seconds, "high": seconds})


def test_the_plans_estimate_is_checked_against_the_budget():
    """`raystream plan` and the sweep check the same: 2 cells x 2 samples of 1 GPU-hour over a 3 GPU-hour budget."""
    cells = [_cell_plan(3600, {"GPU": 1.0, "CPU": 4.0}), _cell_plan(3600, {"GPU": 1.0, "CPU": 4.0})]
    with pytest.raises(ConfigError, match=r"`sweep.budget`: the plan's estimate of the sweep, 4 GPU-hours for 4 "):
        check_plan({"budget": 3.0}, cells, samples=2)
    assert check_plan({"budget": 4.0}, cells, samples=2) is None and check_plan({}, cells) is None
    cpu = [_cell_plan(1800, {"CPU": 2.0})]  # no GPU: CPU-hours, 0.5 h x 2 CPUs
    with pytest.raises(ConfigError, match=r"0.5 CPU-hours is below one trial \(1 CPU-hours by the plan"):
        check_plan({"budget": 0.5}, cpu)
    assert "knows no rate" in check_plan({"budget": 1.0}, [_cell_plan(None, {"CPU": 1.0})])
