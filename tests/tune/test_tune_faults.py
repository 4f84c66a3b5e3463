"""`raystream sweep` stopped by SIGTERM (a job scheduler, `timeout`): the real CLI, one real trial (tiny VideoMAE on
the demo stream) on the session's Ray cluster. The sweep ends as Ctrl-C ends it, with the signal named: exit 143,
the MLflow parent run and the interrupted trial's child run KILLED with "interrupted (SIGTERM ...)" in
`raystream.error`, the sweep lock given back; the same command again resumes the sweep to the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from cli_driver import wait_for
from raystream.tracking import names
from raystream.tune.lock import LOCK_FILE

pytestmark = pytest.mark.slow

SWEEP = """name: tiny_term
grid:
  optimizer.name: [adamw]
fixed:
  stream.batch_size: 4
  trainer.num_workers: 1
  trainer.max_steps: 4
  trainer.checkpoint_every: 2
  trainer.log_every: 1
  trainer.report_every: 2
  eval.metrics: []
"""


def _runs(client):
    exp = client.get_experiment_by_name("term")
    return client.search_runs([exp.experiment_id]) if exp else []


def test_sigterm_ends_the_sweep_killed_with_the_cause_and_the_same_command_resumes(ray_cluster, sweeps_dir, tmp_path):
    sweeps_dir("tiny_term", SWEEP)
    results, db = tmp_path / "results", tmp_path / "mlflow.db"
    cmd = [sys.executable, "-m", "raystream.cli", "sweep", "sweep=tiny_term", "sweep.run_name=termed",
           f"trainer.storage_path={results}", f"mlflow.tracking_uri=sqlite:///{db}", "mlflow.experiment=term"]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(RAY_ADDRESS=ray_cluster, RAYSTREAM_CONFIG_DIR=str(sweeps_dir.root), PYTHONUNBUFFERED="1")
    log = tmp_path / "first.log"
    with open(log, "w") as out:
        driver = subprocess.Popen(cmd, env={**env, "RAYSTREAM_STEP_DELAY_S": "1"}, cwd=tmp_path, stdout=out,
                                  stderr=subprocess.STDOUT)
        try:
            wait_for(driver, log, lambda: list(results.glob("termed-*/checkpoint_0*")), 300,
                     "no checkpoint of the trial", poll_s=0.5)
            assert (results / "sweeps" / "termed" / LOCK_FILE).exists()
            driver.send_signal(signal.SIGTERM)
            rc = driver.wait(timeout=180)
        finally:
            driver.kill()
            driver.wait()
    first = log.read_text()
    assert rc == 143, first[-3000:]
    assert "interrupted" in first and "run the same command again" in first, first[-3000:]
    assert not (results / "sweeps" / "termed" / LOCK_FILE).exists(), "the sweep lock was not given back"
    client = MlflowClient(f"sqlite:///{db}")
    runs = _runs(client)
    parent = next(r for r in runs if r.data.tags.get(names.ROLE_TAG) == names.ROLE_SWEEP)
    child = next(r for r in runs if r.data.tags.get(names.ROLE_TAG) == names.ROLE_TRIAL)
    for run in (parent, child):
        assert run.info.status == "KILLED", (run.data.tags, first[-3000:])
        assert run.data.tags[names.ERROR_TAG].startswith("interrupted (SIGTERM"), run.data.tags

    again = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "1 trials finished, 0 failed" in again.stdout and "(resumed)" in again.stdout, again.stdout[-3000:]
    assert client.get_run(parent.info.run_id).info.status == "FINISHED"
    resumed_child = client.get_run(child.info.run_id)  # the same child run continues from the trial's checkpoint
    assert resumed_child.info.status == "FINISHED", resumed_child.data.tags
    assert sorted(m.step for m in client.get_metric_history(child.info.run_id, "loss")) == [0, 1, 2, 3]
    assert not (results / "sweeps" / "termed" / LOCK_FILE).exists()
