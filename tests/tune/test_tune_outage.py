"""A sweep whose MLflow tracking server dies during a trial and is still down when the sweep ends (MLflow's server
app on 127.0.0.1, stopped and started again on its port; a real local Ray cluster; a stand-in `fit` that meets
the outage as the real one does): the trial is kept as finished, the sweep exits 1 naming the tracking URI, the
saved file and one command, and that command writes the trial's metric values and the parent run's end (trial
counts, `sweep/trials.json`, the UI view, FINISHED) once the server is back."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import ray
import ray.cloudpickle
from mlflow import MlflowClient
from mlflow_outage import restartable_mlflow

import tune_tiny_fit
from raystream.cli import sweep_summary
from raystream.config import compose
from raystream.tracking import events, mirror, names
from raystream.tune.sweep import run_sweep

pytestmark = pytest.mark.slow

SWEEP = """name: tiny_outage
grid:
  optimizer.name: [adamw]
fixed:
  trainer.max_steps: 4
"""


@pytest.fixture
def shipped_fit(ray_cluster):
    ray.cloudpickle.register_pickle_by_value(tune_tiny_fit)  # trials import it by value, not from tests/
    yield tune_tiny_fit.fit_through_outage
    ray.cloudpickle.unregister_pickle_by_value(tune_tiny_fit)


def _stop_server_when_trial_is_ready(server, storage: Path) -> threading.Thread:
    def stop():
        deadline = time.monotonic() + 120
        while not (storage / tune_tiny_fit.OUTAGE_READY).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        server.kill()
        (storage / tune_tiny_fit.OUTAGE_GO).write_text("down")

    thread = threading.Thread(target=stop, daemon=True)
    thread.start()
    return thread


def test_a_sweep_ending_during_an_outage_saves_its_end_and_one_command_writes_it(shipped_fit, sweeps_dir, tmp_path,
                                                                                monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    sweeps_dir("tiny_outage", SWEEP)
    with restartable_mlflow() as server:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
        storage = tmp_path / "raystream_results"
        storage.mkdir()
        stopper = _stop_server_when_trial_is_ready(server, storage)
        outcome = run_sweep(compose(["sweep=tiny_outage"]), ["sweep=tiny_outage"], fit=shipped_fit, verbose=0)
        stopper.join(timeout=5)

        (trial,) = outcome.trials
        assert trial.status == "finished" and trial.unsent and Path(trial.unsent).is_file()
        assert outcome.unsent == str(storage / "sweeps" / outcome.run_name / events.FILE_NAME)
        capsys.readouterr()
        assert sweep_summary(outcome) == 1
        err = capsys.readouterr().err
        assert server.uri in err and outcome.unsent in err and f"raystream tracking upload {outcome.unsent}" in err
        waiting = events.Record(outcome.unsent).pending()
        assert events.record(trial.unsent) in waiting and waiting[-1]["status"] == "FINISHED"

        server.start()
        assert mirror.main(outcome.unsent) == 0
        assert events.Record(outcome.unsent).pending() == [] and events.Record(trial.unsent).pending() == []
        client = MlflowClient(server.uri)
        parent = client.get_run(outcome.parent_run_id)
        assert parent.info.status == "FINISHED"
        assert parent.data.tags[names.trials_count_tag("finished")] == "1"
        active_ms = float(parent.data.tags[names.ACTIVE_SECONDS_TAG]) * 1000
        assert active_ms > 0 and abs(parent.info.end_time - parent.info.start_time - active_ms) <= 100
        trials_json = Path(client.download_artifacts(outcome.parent_run_id, names.TRIALS_ARTIFACT, str(tmp_path)))
        assert '"status": "finished"' in trials_json.read_text()
        assert names.SHARED_VIEW_TAG_PREFIX + outcome.run_name in client.get_experiment(outcome.experiment_id).tags
        child = client.get_run(trial.metrics["mlflow_run_id"])
        assert child.info.status == "FINISHED"
        assert sorted(m.step for m in client.get_metric_history(child.info.run_id, "loss")) == [0, 1, 2, 3]
