"""The tune layer on a real local Ray cluster, with a small stand-in for `raystream.train.run.fit`
(tune_tiny_fit.py: a real TorchTrainer run and a real MLflow child run, no video pipeline): Optuna's sampled
values reach the trials and MLflow, ASHA stops poor trials early, and the stopped trials' Train workers are given
back (every placement group removed, every CPU free again) so the other trials run; in the same sweep, a trial that
fails before its Train run exists is a FAILED child run and the sweep goes on. Besides: a SIGTERM as a trial ends
(trials that finish at once, no Train run). (The loopback address a local Ray started by raystream advertises:
tests/train/test_ray_start.py.)"""

from __future__ import annotations

import time

import pytest
import ray
import ray.cloudpickle
from mlflow import MlflowClient
from ray.util.placement_group import placement_group_table

import tune_tiny_fit
from raystream.cli import sweep_summary
from raystream.config import compose
from raystream.tracking import names
from raystream.tune.sweep import run_sweep

pytestmark = pytest.mark.slow

# 3 steps, ASHA's rungs at iterations 1 and 2: every trial's first loss is the same (the weights start at zero), so
# the first trial to train sets the bar at rung 2 and a trial of a smaller lr stops there (Optuna's seeded lrs:
# adamw 2.3e-3, then orthogonal_adamw 1.1e-3, stopped at iteration 2 of 3 on 2026-12-07). Tune takes a trial's
# results one at a time, in order, so the stop is decided on iteration 2 even where the worker has run on.
MAX_STEPS = 3
SWEEP = f"""name: tiny_asha
grid:   # (tune_tiny_fit trains with SGD whatever the name; orthogonal_sgd's trial fails before its Train run)
  optimizer.name: [adamw, orthogonal_adamw, orthogonal_sgd, sgd]
sample:
  optimizer.lr: loguniform(1e-4, 3e-2)
num_samples: 1   # grid x num_samples per cell is test_tune_space's; 3 trials train: one stopped, one after it
fixed:
  trainer.max_steps: {MAX_STEPS}
  trainer.log_every: 300   # tune_tiny_fit: ms between steps, so stopping early saves time
scheduler: asha
max_concurrent_trials: 1   # one at a time: trials report in a fixed order, so ASHA's decisions are deterministic
grace_period: 1
reduction_factor: 2
metric: loss
mode: min
"""


@pytest.fixture(scope="module")
def local_ray(ray_cluster):
    """The session's local Ray cluster (tests/conftest.py), with the tiny fit shipped to trials by value."""
    ray.cloudpickle.register_pickle_by_value(tune_tiny_fit)  # trials import it by value, not from tests/
    yield
    ray.cloudpickle.unregister_pickle_by_value(tune_tiny_fit)


def _run_name(config) -> str:
    return names.trial_run_name({"optimizer.name": config["optimizer.name"]}, {"optimizer.lr": config["optimizer.lr"]})


def test_optuna_asha_sweep_releases_stopped_trials_workers(local_ray, sweeps_dir, mlflow_uri, tmp_path,
                                                          monkeypatch, capsys):
    """Besides ASHA's 3 trials that train, one (orthogonal_sgd, 3rd of 4) fails before its Train run exists: it is a
    FAILED child run with its grid values and reason, and the sweep goes on to the next trial and ends FINISHED."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.3")
    sweeps_dir("tiny_asha", SWEEP)
    cfg = compose(["sweep=tiny_asha"])
    outcome = run_sweep(cfg, ["sweep=tiny_asha"], fit=tune_tiny_fit.fit_or_fail_before_its_run, verbose=0)

    assert [t.status for t in outcome.trials] == ["finished", "finished", "failed", "finished"]  # in the order run
    trained = [t for t in outcome.trials if t.status == "finished"]
    iterations = [t.metrics["training_iteration"] for t in trained]  # in the order they ran
    assert min(iterations) < MAX_STEPS <= max(iterations), iterations  # ASHA stopped some early
    assert min(iterations[:-1]) < MAX_STEPS, iterations  # a trial ran after a stopped one (its workers were given back)
    per_cell = sorted(t.config["optimizer.name"] for t in trained)
    assert per_cell == ["adamw", "orthogonal_adamw", "sgd"]

    client = MlflowClient(mlflow_uri)
    parent = client.get_run(outcome.parent_run_id)
    assert parent.info.status == "FINISHED"
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{outcome.parent_run_id}'")
    assert len(children) == 4
    # Only the trial that could not start failed. The stand-in (tune_tiny_fit) ends the child run of a trial ASHA
    # stopped FAILED when the stop reaches its `except` before its actor ends, else leaves it RUNNING: which, depends
    # on timing. raystream's own fit is not that stand-in.
    (failed,) = outcome.failed
    stopped = {t.trial_id for t in trained if t.metrics["training_iteration"] < MAX_STEPS}
    failed_runs = {c.data.tags["raystream.trial_id"] for c in children if c.info.status == "FAILED"}
    assert failed_runs - stopped == {failed.trial_id}, (failed_runs, stopped)
    for t in trained:  # the sampled lr each trial ran with is the one in its MLflow child run
        child = next(c for c in children if c.data.tags["raystream.trial_id"] == t.trial_id)
        assert 1e-4 <= t.config["optimizer.lr"] <= 3e-2
        assert float(child.data.params["optimizer.lr"]) == pytest.approx(t.config["optimizer.lr"])
        assert child.data.tags["raystream.grid.optimizer.name"] == t.config["optimizer.name"]
        assert child.info.run_name == _run_name(t.config)  # named by its grid and sampled values
        assert child.info.status == "FINISHED" or t.metrics["training_iteration"] < MAX_STEPS, (child.info, t.metrics)

    # The trial that failed before its Train run existed: a FAILED child run, named by its grid values.
    assert failed.cell == {"optimizer.name": "orthogonal_sgd"}, failed.cell
    assert "cannot start: optimizer.name = orthogonal_sgd" in failed.error
    (run,) = [c for c in children if c.data.tags["raystream.trial_id"] == failed.trial_id]
    assert run.info.status == "FAILED" and run.data.tags["raystream.grid.optimizer.name"] == "orthogonal_sgd"
    assert run.data.tags["raystream.trial_id"] == failed.trial_id
    assert "cannot start: optimizer.name = orthogonal_sgd" in run.data.tags["raystream.error"]
    assert run.info.run_name == _run_name(failed.config) and run.info.run_name.startswith("orth_sgd-lr")

    # The terminal: a line per trial start and end, by name; Tune's tables only in the sweep's log file.
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any(f" {run.info.run_name} " in line and "failed: ValueError: cannot start" in line for line in lines), out
    adamw = _run_name(trained[0].config)
    assert any(f" {adamw} " in line and "finished: " in line for line in lines), out
    assert "╭" not in out and "Trial status" not in out and "Tuner.restore" not in out
    log = tmp_path / "raystream_results" / "sweeps" / outcome.run_name / "sweep.log"
    assert any(f"Ray's and Tune's output: {log}" in line for line in lines)
    assert "Configuration for experiment" in log.read_text()  # Tune's header, printed whatever its verbosity

    deadline = time.time() + 30
    while time.time() < deadline:
        leaked = [pg for pg in placement_group_table().values() if pg["state"] != "REMOVED"]
        if not leaked and ray.available_resources().get("CPU") == 2.0:
            break
        time.sleep(1)
    assert not leaked, leaked
    assert ray.available_resources().get("CPU") == 2.0


STOPPED = """name: tiny_stopped
grid:
  optimizer.name: [adamw, orthogonal_adamw, slower_adamw]
max_concurrent_trials: 1
"""


def test_a_sigterm_as_a_trial_ends_leaves_the_sweep_interrupted_not_finished(local_ray, sweeps_dir, mlflow_uri,
                                                                             tmp_path, monkeypatch):
    """A job scheduler's SIGTERM reaches an in-process sweep's driver as its first trial's function returns: the
    sweep did not run its plan, so it ends KILLED, with exit 143 and resumable (whether Tune counts that trial cut
    short, or ended with the next not yet made: test_tune_sweep_records.py)."""
    import os

    monkeypatch.chdir(tmp_path)
    sweeps_dir("tiny_stopped", STOPPED)
    storage = tmp_path / "raystream_results"
    storage.mkdir()
    (storage / tune_tiny_fit.DRIVER_PID).write_text(str(os.getpid()))
    cfg = compose(["sweep=tiny_stopped"])
    outcome = run_sweep(cfg, ["sweep=tiny_stopped"], fit=tune_tiny_fit.fit_then_sigterm_the_driver, verbose=0)

    assert outcome.signal == "SIGTERM" and outcome.interrupted, outcome
    assert sweep_summary(outcome) == 143
    parent = MlflowClient(mlflow_uri).get_run(outcome.parent_run_id)
    assert parent.info.status == "KILLED" and "SIGTERM" in parent.data.tags["raystream.error"]


def test_a_sweep_rejected_in_a_process_holding_a_ray_leaves_that_ray_running(local_ray, sweeps_dir, tmp_path,
                                                                             monkeypatch, capfd):
    """`raystream sweep` called where Ray is already initialized (a notebook's, this session's cluster) and rejected
    before it starts: it shuts down only a Ray it started itself."""
    from cli_driver import in_process

    sweeps_dir("bad", "name: bad\ngrid:\n  stream.bogus: [1, 2]\n")
    with in_process(tmp_path, monkeypatch, capfd) as run:
        out = run("sweep", "sweep=bad")
    assert out.returncode == 2 and "stream.bogus" in out.stderr, out.stderr
    assert ray.is_initialized()
