"""The fault-injection hooks (raystream/train/faults.py): the failure fires once per run on the chosen rank; the
pause holds rank 0 before its step until the test removes the pause file. Then, through real runs paused at a known
step: a tracking outage and a storage path that fails mid-run (SIGTERM: tests/train/test_run_exit.py, whose local
run it stops; a local run's listeners and its skipped corrupt video: tests/train/test_ray_start.py)."""

import pytest

from raystream.train import faults


def test_fail_once_at_step_on_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSTREAM_FAIL_AT_STEP", "3")
    monkeypatch.setenv("RAYSTREAM_FAIL_RANK", "1")
    hooks = faults.from_env(str(tmp_path / "run"), "r")
    assert hooks["fail_marker"].startswith(str(tmp_path / "run"))
    for step in range(3):
        faults.before_step(hooks, step, rank=1)
    faults.before_step(hooks, 3, rank=0)  # other rank: no failure
    with pytest.raises(faults.FaultInjected, match="step 3|RAYSTREAM_FAIL_AT_STEP=3"):
        faults.before_step(hooks, 3, rank=1)
    faults.before_step(hooks, 3, rank=1)  # the restarted worker goes past it
    assert (tmp_path / "run" / ".fault_injected_step3").is_file()


def test_pause_holds_rank_0_before_its_step_until_the_file_is_removed(tmp_path, monkeypatch):
    """Rank 0 creates the pause file before step 2 and waits until it is removed; other steps and ranks go on; a
    pause nobody ends raises PauseTimedOut naming the hook and the file."""
    import threading
    import time

    paused = tmp_path / "paused"
    monkeypatch.setenv("RAYSTREAM_PAUSE_AT_STEP", "2")
    monkeypatch.setenv("RAYSTREAM_PAUSE_FILE", str(paused))
    hooks = faults.from_env(None, "r")
    faults.before_step(hooks, 1, rank=0)
    faults.before_step(hooks, 2, rank=1)
    assert not paused.exists()

    seen = {}

    def release():
        deadline = time.monotonic() + 30
        while not paused.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        seen["text"] = paused.read_text()
        time.sleep(0.3)
        seen["released_at"] = time.monotonic()
        paused.unlink()

    releaser = threading.Thread(target=release)
    releaser.start()
    faults.before_step(hooks, 2, rank=0)
    returned_at = time.monotonic()
    releaser.join()
    assert "paused before step 2 on rank 0" in seen["text"] and returned_at >= seen["released_at"]

    monkeypatch.setenv("RAYSTREAM_PAUSE_TIMEOUT_S", "0.2")
    with pytest.raises(faults.PauseTimedOut, match=f"RAYSTREAM_PAUSE_AT_STEP=2.*nobody removed {paused}"):
        faults.before_step(faults.from_env(None, "r"), 2, rank=0)
    monkeypatch.delenv("RAYSTREAM_PAUSE_FILE")
    with pytest.raises(ValueError, match="RAYSTREAM_PAUSE_FILE"):
        faults.from_env(None, "r")


def test_no_hooks_without_env(monkeypatch):
    for name in ("RAYSTREAM_FAIL_AT_STEP", "RAYSTREAM_STEP_DELAY_S", "RAYSTREAM_PAUSE_AT_STEP"):
        monkeypatch.delenv(name, raising=False)
    assert faults.from_env(None, "r") == {}
    faults.before_step({}, 0, 0)



def test_faults_wrap_the_batches_from_outside_the_step(tmp_path):
    """A `Faults` (what a test hands to `fit(options=RunOptions(step_hooks=...))`) survives pickling to a worker,
    places its marker in the run directory, and wraps the batches: the failure fires before step 1 once, the next
    pass goes through; without settings the batches are not wrapped at all."""
    import pickle
    from types import SimpleNamespace

    hooks = pickle.loads(pickle.dumps(faults.Faults(fail_at_step=1, eval_delay_s=0.5).for_run(str(tmp_path), "r")))
    assert hooks.settings["fail_marker"] == str(tmp_path / ".fault_injected_step1") and hooks.eval_delay_s == 0.5
    batches = [SimpleNamespace(step=s) for s in range(3)]
    seen = []
    with pytest.raises(faults.FaultInjected, match="RAYSTREAM_FAIL_AT_STEP=1"):
        for batch in hooks.around_steps(batches, rank=0, total=3):
            seen.append(batch.step)
    assert seen == [0]
    assert [b.step for b in hooks.around_steps(batches, rank=0, total=3)] == [0, 1, 2]  # the restart goes past it
    assert faults.Faults().around_steps(batches, rank=0, total=3) is batches
    with pytest.raises(ValueError, match="pause_file"):
        faults.Faults(pause_at_step=2)


def test_the_cli_translates_the_environment_and_the_training_code_reads_none(monkeypatch):
    """`raystream train` / `raystream eval` turn the documented variables into a `Faults`; nothing the run, its
    workers or a sweep execute reads them (the hooks come in as `step_hooks`)."""
    from pathlib import Path

    import raystream
    from raystream.cli import _step_hooks

    monkeypatch.setenv("RAYSTREAM_FAIL_AT_STEP", "1")
    monkeypatch.setenv("RAYSTREAM_STEP_DELAY_S", "0.25")
    assert _step_hooks().settings == {"fail_at_step": 1, "fail_rank": 0, "step_delay_s": 0.25}
    monkeypatch.delenv("RAYSTREAM_FAIL_AT_STEP")
    monkeypatch.delenv("RAYSTREAM_STEP_DELAY_S")
    assert _step_hooks() is None
    package = Path(raystream.__file__).parent
    words = ("from_env", "RAYSTREAM_FAIL", "RAYSTREAM_PAUSE", "RAYSTREAM_STEP_DELAY", "RAYSTREAM_EVAL_DELAY")
    readers = [str(path.relative_to(package)) for folder in ("train", "tune")
               for path in (package / folder).glob("*.py")
               if path.name != "faults.py" and any(word in path.read_text() for word in words)]
    assert readers == []

@pytest.mark.slow
def test_a_tracking_outage_to_the_end_leaves_the_metrics_beside_the_checkpoints(ray_cluster, tiny, tiny_overrides,
                                                                               workdir, capfd):
    """The MLflow server dies after step 1 (the run paused before step 2) and stays down: training ends all the same, non-zero, naming the file of
    run's record beside the checkpoints and the command that writes it; that command, once the server is back,
    records every step exactly once and closes the run FINISHED."""
    import threading
    import time
    from pathlib import Path

    from mlflow_outage import restartable_mlflow

    from raystream.cli import main as cli_main
    from raystream.config import compose
    from raystream.tracking import client as make_client
    from raystream.tracking import events
    from raystream.train import commands

    paused = workdir["dir"] / "outage.paused"
    hooks = faults.Faults(pause_at_step=2, pause_file=str(paused))
    with restartable_mlflow() as server:
        overrides = [*tiny_overrides("trainer.num_workers=1"), f"mlflow.tracking_uri={server.uri}",
                     "trainer.run_name=outage"]
        client = make_client(server.uri)
        killed = {}

        def kill_after_step_1():
            """Once the run is paused before step 2 and the server holds step 1's loss: kill the server, then let
            the run go on (whatever happened, so the run never waits out its pause)."""
            try:
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:
                    runs = client.search_runs(client.get_experiment_by_name("train-tests").experiment_id,
                                              "tags.`mlflow.runName` = 'outage'") \
                        if paused.exists() and client.get_experiment_by_name("train-tests") else []
                    if runs and any(m.step >= 1 for m in client.get_metric_history(runs[0].info.run_id, "loss")):
                        server.kill()
                        killed["while_paused"] = paused.exists()
                        return
                    time.sleep(0.2)
            finally:
                paused.unlink(missing_ok=True)

        killer = threading.Thread(target=kill_after_step_1, daemon=True)
        killer.start()
        assert commands.main(compose(overrides), overrides, step_hooks=hooks) == 1
        killer.join()
        assert killed == {"while_paused": True}  # the server died with steps 2 to 5 still to come
        err = capfd.readouterr().err
        path = str(Path(workdir["storage"]) / "outage" / events.FILE_NAME)
        assert f"raystream tracking upload {path}" in err and server.uri in err
        waiting = events.Record(path).pending()
        assert waiting[-1]["kind"] == "end" and waiting[-1]["status"] == "FINISHED"
        assert {e["step"] for e in waiting if "loss" in e.get("values", {})} >= {5}
        run_id = waiting[-1]["run"]

        server.start()
        assert cli_main(["tracking", "upload", path]) == 0
        mlflow_run = client.get_run(run_id)
        assert mlflow_run.info.status == "FINISHED" and mlflow_run.data.tags["raystream.status"] == "finished"
        logged = {a.path for a in client.list_artifacts(run_id)}
        assert {"config.yaml", "plots"} <= logged  # the run's end waited with its metrics, and its model:
        models = client.search_logged_models([mlflow_run.info.experiment_id],
                                             filter_string=f"source_run_id = '{run_id}'")
        assert [(m.name, str(m.status)) for m in models] == [("outage", "READY")]
        assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == list(range(6))
        assert events.Record(path).pending() == []  # the record stays, mirrored in full


@pytest.mark.slow
def test_a_storage_path_failing_mid_run_ends_the_run_failed_naming_the_path(ray_cluster, tiny_overrides, workdir):
    """The run's directory on trainer.storage_path becomes unusable after the first checkpoint, while the run is
    paused before step 2 (moved away and a file left in its place: the storage behind the path is gone; as root, a read-only directory would still be
    written). The next checkpoint fails: `raystream train` exits 1 naming the path, the MLflow run is FAILED with
    the cause in `raystream.error`, and no retry loop keeps it going (Ray Train's controller fails the run)."""
    import json
    import os
    from pathlib import Path

    from cli_driver import train_process, wait_for
    from raystream.tracking import client as make_client

    overrides = tiny_overrides("trainer.num_workers=1", "trainer.run_name=lost")
    paused = workdir["dir"] / "lost.paused"
    env = {**os.environ, "RAY_ADDRESS": ray_cluster, "RAYSTREAM_PAUSE_AT_STEP": "2",
           "RAYSTREAM_PAUSE_FILE": str(paused)}
    run_dir = Path(workdir["storage"]) / "lost"
    err = workdir["dir"] / "lost.stderr"
    with train_process(overrides, env, workdir["dir"], err) as driver:
        wait_for(driver, err, paused.exists, 200, "no pause before step 2")
        assert list(run_dir.glob("checkpoint_0*")), "no checkpoint on storage before step 2"
        run_id = json.loads((run_dir / "raystream_run.json").read_text())["mlflow_run_id"]
        run_dir.rename(run_dir.with_name("lost.moved"))
        run_dir.write_text("the storage is gone")
        paused.unlink()  # the run goes on to its next checkpoint (after step 3)
        rc = driver.wait(timeout=180)
    text = err.read_text()
    assert rc == 1, text[-3000:]
    assert "raystream train: training failed" in text and str(run_dir) in text, text[-3000:]
    run = make_client(workdir["mlflow"]).get_run(run_id)
    assert run.info.status == "FAILED" and str(run_dir) in run.data.tags["raystream.error"], run.data.tags
