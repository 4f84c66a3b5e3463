"""`raystream plan` against a small sweep actually run here: the smoke sweep's two optimizers (AdamW and
Orthogonal-AdamW along time, 2 passes of the 2 demo videos, 60 frames each: the stream decides the steps), planned at
the rate `raystream bench --json` measured for the same config a moment before, in this process; then its AdamW
trial run on the session's Ray cluster (the sweep narrowed to that cell: each trial costs its 7 Ray processes, about
30 CPU-s, and the AdamW cell is the one whose step the plan derives from the bench's, less Orthogonal-AdamW's step
plus AdamW's, so its time goes through the whole arithmetic). The narrowed sweep's plan is the full one's AdamW cell,
and its steps and trials must be the run's exactly (the trial's logged `loss` steps, its MLflow child runs), and the
trial's time in its training steps (`time/steps_s`, which leaves out its start, evaluations and checkpoints, as the
plan does) must lie within the range the plan states (printed; the test fails only SLACK-fold beyond it), and so must
its whole wall time (its MLflow child run) against the plan's trial time, which adds the parts of a trial the
bench measured outside its steps. That range is asked for with `--spread 3`
(the faster rate / 3 to the slower x 3), not the default 1.25 of a node of one's own: this 2-core machine is shared
(the suite's two workers, and on 2026-11-28 eight sessions at once, load average 22), and its speed moves within
minutes: trials ran at 0.96x and 0.38x the rate the bench had measured a minute before. What the test still
catches is a gross error of the arithmetic (seconds for milliseconds, a missing factor of the steps).
"""

from __future__ import annotations

import json

import pytest
from cli_driver import in_process
from mlflow import MlflowClient

from raystream.config import compose
from raystream.tune.sweep import run_sweep

pytestmark = pytest.mark.slow

# Beyond the stated range: the CI of 2026-11-28 (a fresh clone, with two more Ray tests run beside it by hand) saw
# the first trial take 13.2 s where the plan stated 0.18-2.97 s. A timing is no test's target (benchmarks/ hold
# those): the range is printed, and only an error of an order of magnitude fails the test.
SLACK = 10.0
SWEEP = ["sweep=smoke", "stream.order=batch_along_time", "stream.epochs=2", "data.demo.frames_per_video=60",
         "sweep.max_concurrent_trials=1", "trainer.correlation_steps=1", "eval.probe_epochs=1",
         "eval.max_probe_samples=100"]
ONE_CELL = "sweep.grid.optimizer.name=[adamw]"  # the sweep run: its AdamW cell alone


def _plan(run, overrides, bench):
    out = run("plan", "sweep", *overrides, "--rate-from", str(bench), "--spread", "3", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_plan_of_a_sweep_matches_the_sweep_run(ray_cluster, tmp_path, monkeypatch, capfd):
    overrides = [*SWEEP, f"data.demo.cache_dir={tmp_path / 'demo'}"]
    bench = tmp_path / "bench.json"
    with in_process(tmp_path, monkeypatch, capfd) as run:
        measured = run("bench", *overrides, "--device", "cpu", "--steps", "10", "--time-budget", "60",
                       "--compile", "off", "--json", str(bench))
        assert measured.returncode == 0, measured.stderr
        plan = _plan(run, overrides, bench)
        narrowed = [*overrides, ONE_CELL]
        one = _plan(run, narrowed, bench)
    assert plan["rate"]["source"] == f"raystream bench --json {bench}" and plan["concurrent_trials"] == 1
    assert plan["rate"]["order"] == "batch_along_time"  # the live rate read the order the trials read
    cells = {c["label"]: c for c in plan["cells"]}
    assert sorted(cells) == ["optimizer.name=adamw", "optimizer.name=orthogonal_adamw"] and plan["trials"] == 2
    assert {c["steps"] for c in cells.values()} == {12} and {c["limited_by"] for c in cells.values()} == {"the stream"}
    assert one["cells"] == [cells["optimizer.name=adamw"]]  # a cell's plan is the same in the narrowed sweep

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    outcome = run_sweep(compose(narrowed), narrowed, verbose=0)
    assert [t.status for t in outcome.trials] == ["finished"]

    client = MlflowClient(uri)
    children = client.search_runs([outcome.experiment_id], filter_string="tags.`raystream.role` = 'trial'")
    assert len(children) == one["trials"] == 1
    seconds = {}
    for child in children:
        cell = cells[f"optimizer.name={child.data.tags['raystream.grid.optimizer.name']}"]
        assert len(client.get_metric_history(child.info.run_id, "loss")) == cell["steps"]
        whole = (child.info.end_time - child.info.start_time) / 1000.0
        seconds[cell["label"]] = (child.data.metrics["time/steps_s"], whole, cell)
    spread = plan["spread"]
    for label, (took, whole, cell) in seconds.items():
        # the trial's time is its steps plus what the bench measured outside them (its start, correlation,
        # evaluations, checkpoints: raystream/bench/trial_parts.py), each side of the range moved by the spread
        stated, extra = cell["trial_s"], cell["outside_steps_s"]
        assert extra is not None and extra > 0, cell
        steps = {"low": stated["low"] - extra / spread, "high": stated["high"] - extra * spread}
        print(f"{label}: took {took:.2f} s in its steps, the plan stated {steps['low']:.2f}-{steps['high']:.2f} s; "
              f"{whole:.1f} s in all, the plan stated {stated['low']:.1f}-{stated['high']:.1f} s")
        assert steps["low"] / SLACK <= took <= steps["high"] * SLACK, (label, took, steps, plan["rate"])
        assert stated["low"] / SLACK <= whole <= stated["high"] * SLACK, (label, whole, stated)
