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
