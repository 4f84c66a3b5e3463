"""The plan's time of a whole trial from the finished trials of the same sweep (raystream/tune/plan_measured.py):
their wall times per step x each cell's steps, in the plan of the sweep extended; no store, no change (and none
created). Real MLflow (sqlite in tmp)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from raystream.config import compose
from raystream.tracking import names
from raystream.tune.identity import REUSED_FROM_TAG
from raystream.tune.plan import NOT_INCLUDED, make_plan


def _trial(client, eid, sweep, steps, seconds, status="FINISHED", **tags):
    run = client.create_run(eid, start_time=1_000_000, tags={names.ROLE_TAG: names.ROLE_TRIAL, names.SWEEP_TAG: sweep,
                                                             **tags})
    client.log_metric(run.info.run_id, "steps_done", steps)
    client.set_terminated(run.info.run_id, status, end_time=1_000_000 + int(seconds * 1000))


def test_an_extended_sweep_is_planned_at_its_finished_trials_wall_time(mlflow_uri):
    client = MlflowClient(mlflow_uri)
    eid = client.create_experiment("raystream")
    for seconds in (30.0, 36.0, 40.0):  # three finished trials of 4 steps: start, correlation, evaluation included
        _trial(client, eid, "smoke", 4, seconds)
    _trial(client, eid, "smoke", 4, 900.0, status="KILLED")  # stopped: not a measure
    _trial(client, eid, "smoke", 4, 1.0, **{REUSED_FROM_TAG: "x"})  # a reused trial's link: did not run here
    _trial(client, eid, "other", 4, 500.0)  # another sweep
    overrides = ["sweep=smoke", "trainer.max_steps=4", "sweep.max_concurrent_trials=2"]
    p = make_plan("sweep", compose(overrides), overrides, cpus=2)
    assert all(cp.steps == 4 for cp in p.cells)
    assert [cp.trial_s for cp in p.cells] == [{"low": 30.0, "estimate": 36.0, "high": 40.0}] * len(p.cells)
    assert p.wall_s["estimate"] == pytest.approx(36.0 * -(-len(p.cells) // 2))  # 2 at a time
    assert p.not_included[0].startswith("nothing of a trial: its time is measured, the wall time of 3 finished")


def test_without_a_store_the_plan_keeps_the_rate_and_creates_none(tmp_path, monkeypatch):
    db = tmp_path / "none.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    overrides = ["sweep=smoke", "trainer.max_steps=4"]
    p = make_plan("sweep", compose(overrides), overrides, cpus=2)
    assert p.not_included == list(NOT_INCLUDED) and not Path(db).exists()


def _finished_trial_of(client, eid, config, status="FINISHED"):
    """A trial run of an earlier sweep that ran `config` (its params as a sweep's child run stores them)."""
    from mlflow.entities import Param

    from raystream.tune.identity import identity

    run = client.create_run(eid, tags={names.ROLE_TAG: names.ROLE_TRIAL, names.SWEEP_TAG: "earlier"})
    params = [Param(k, v) for k, v in identity(config).items()]
    for i in range(0, len(params), 100):
        client.log_batch(run.info.run_id, params=params[i:i + 100])
    client.set_terminated(run.info.run_id, status)


def test_trials_that_finished_before_are_planned_as_reused_and_cost_nothing(mlflow_uri, tmp_path):
    """The plan of an extended sweep marks the cells the sweep will reuse (a FINISHED trial of the same identity in
    the experiment; a failed one is run again) and leaves them out of the wall time, the resource-hours and the
    budget's check; the text says how many."""
    from raystream.config import ConfigError
    from raystream.tune.budget import check_plan
    from raystream.tune.plan_text import text
    from raystream.tune.space import plan as sweep_plan

    overrides = ["sweep=smoke", "trainer.max_steps=4", "sweep.max_concurrent_trials=1"]
    cfg = compose(overrides)
    cells = sweep_plan(cfg, overrides).cells
    client = MlflowClient(mlflow_uri)
    eid = client.create_experiment(str(cfg.mlflow.experiment))
    _finished_trial_of(client, eid, cells[0].config)
    _finished_trial_of(client, eid, cells[1].config, status="FAILED")
    bench = _bench_file(tmp_path, cfg)
    p = make_plan("sweep", compose(overrides), overrides, cpus=2, rate_from=str(bench))
    assert [cp.reused for cp in p.cells] == [1] + [0] * (len(cells) - 1) and p.reused == 1
    each = p.cells[1].trial_s["estimate"]
    assert p.wall_s["estimate"] == pytest.approx(each * (len(cells) - 1))  # one at a time, the reused one left out
    assert "1 finished before with the same config: reused, not run" in text(p)
    rows = [line for line in text(p).splitlines() if line.startswith(p.cells[0].label)]
    assert rows[0].endswith("reused")  # the first cell's row
    one_trial_h = each / 3600  # a CPU trial holds 1 CPU: its CPU-hours
    fits = {"budget": one_trial_h * (len(cells) - 0.5)}  # over every trial but the reused one
    assert check_plan(fits, p.cells) is None
    with pytest.raises(ConfigError, match="sweep.budget"):
        check_plan({"budget": one_trial_h * (len(cells) - 1.5)}, p.cells)


def _bench_file(tmp_path, cfg, **extra):
    """A `raystream bench --json` object of `cfg`'s setting (its figures made up: the arithmetic is what is tested)."""
    import json

    bench = {"device": "cpu", "scenario": str(cfg.scenario.name), "backbone": str(cfg.scenario.backbone.preset),
             "frames_per_clip": int(cfg.stream.frames_per_clip), "resolution": int(cfg.stream.resolution),
             "bf16": False, "batch_size": int(cfg.stream.batch_size) // int(cfg.trainer.num_workers),
             "from_memory_steps_per_s": 4.0, "live_steps_per_s": 2.0, "optimizer": "orthogonal_adamw", **extra}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    return path


def test_a_bench_that_measured_a_trials_parts_puts_them_in_each_trials_time(tmp_path, monkeypatch):
    """With `trial_parts_s` in the bench file (raystream/bench/trial_parts.py) a trial's time is its steps plus its
    start, correlation, evaluations and checkpoints, and the plan no longer says they are missing; without them the
    time is the steps' alone and it says so (as for the shipped rates)."""
    from raystream.tune.plan import OUTSIDE_MEASURED

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'none.db'}")
    overrides = ["sweep=smoke", "trainer.max_steps=4"]
    cfg = compose(overrides)
    parts = {"process_start": 5.0, "build": 2.0, "correlation": 4.0, "evaluation": 1.5, "checkpoint": 0.25}
    bare = make_plan("sweep", cfg, overrides, cpus=2, rate_from=str(_bench_file(tmp_path, cfg)))
    full = make_plan("sweep", cfg, overrides, cpus=2, rate_from=str(_bench_file(
        tmp_path, cfg, trial_parts_s=parts, trial_process_chain=3)))
    cp, bare_cp = full.cells[0], bare.cells[0]
    assert cp.evaluations >= 1 and cp.checkpoints >= 1
    assert cp.outside_steps_s == pytest.approx(3 * 5.0 + 2.0 + 4.0 + cp.evaluations * 1.5 + cp.checkpoints * 0.25)
    assert cp.trial_s["estimate"] == pytest.approx(bare_cp.trial_s["estimate"] + cp.outside_steps_s)
    assert cp.trial_s["high"] == pytest.approx(bare_cp.trial_s["high"] + cp.outside_steps_s * full.spread)
    assert full.not_included[0] == OUTSIDE_MEASURED and bare.not_included == list(NOT_INCLUDED)
    assert bare_cp.outside_steps_s is None


def test_a_sweep_adding_seeds_while_open_is_planned_from_its_first_round_to_every_seed(tmp_path, monkeypatch):
    """sweep.seeds (raystream/tune/adaptive.py): the plan says the least (every comparison settled by the first
    round's `min` seeds) and the most (every seed up to `max`) it will run."""
    from raystream.tune.plan_text import text

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'none.db'}")
    overrides = ["sweep=smoke", "trainer.max_steps=4", "+sweep.grid.trainer.seed=[0,1,2,3]",
                 "sweep.grid.stream.order=[batch_along_time]", "sweep.compare.axis=optimizer.name",
                 "sweep.compare.baseline=adamw", "sweep.seeds.min=2", "sweep.seeds.max=3"]
    cfg = compose(overrides)
    p = make_plan("sweep", cfg, overrides, cpus=1, rate_from=str(_bench_file(tmp_path, cfg)))
    r = p.seed_rounds
    assert (r["key"], r["min"], r["max"], r["trials_at_least"], r["trials_at_most"]) == ("trainer.seed", 2, 3, 4, 6)
    each = p.cells[0].trial_s["estimate"]
    assert (r["wall_s_at_least"], r["wall_s_at_most"]) == (pytest.approx(4 * each), pytest.approx(6 * each))
    assert "4 to 6 trials to run" in text(p)
