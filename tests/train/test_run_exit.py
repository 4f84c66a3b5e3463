"""MLflow never behind at exit (issue 51): whatever stops a run (a failure, Ctrl-C, SIGTERM) its driver closes the
MLflow run through the run's record and drains the record into MLflow with a bounded wait, saying what is left and
the upload command; a successful resume clears the earlier attempt's `raystream.error`, which the record keeps.
The driver's exit path without Ray: a real MLflow sqlite store and a record that rank 0 left unmirrored.
And no process of a run outlives its command (raystream/train/guard.py): real `raystream train` commands on a
local Ray of their own, SIGTERMed, and SIGKILLed while they shut down after a Ctrl-C; the process table is read
after each (a finished run: tests/train/test_ray_start.py; a killed driver mid-run: tests/train/test_guard.py)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
from cli_driver import train_process, wait_for
from leftovers import MARK_ENV, RunProcesses
from ray_env import RAY_TEST_ENV

from raystream.tracking import client as make_client
from raystream.tracking import events, mirror, names, start_run
from raystream.train import commands, run
from raystream.train.divergence import DivergedError


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    return uri, make_client(uri)


def _trained(path, run_id: str, uri: str, steps: int) -> str:
    """What rank 0 appended before the run stopped (the live mirror had written none of it)."""
    record = events.Record(str(path))
    record.append([events.opened(run_id, uri),
                   *(events.metrics(run_id, s, {"loss": 1.0 / (s + 1)}, 1000 + s) for s in range(steps))])
    record.close()
    return str(path)


def _stopped(record: str, uri: str, run_id: str, exc: BaseException, raised=RuntimeError) -> None:
    """The driver's exit path of a run that `exc` stopped (after `start_run`)."""
    with pytest.raises(raised):
        with run._closed_on_failure(record, uri, run_id, "r"):
            raise exc


def test_a_failure_drains_the_record_and_ends_the_run_failed(store, tmp_path, capsys):
    uri, client = store
    run_id = start_run(client, experiment="exit", uri=uri, run_name="r")
    record = _trained(tmp_path / "run" / events.FILE_NAME, run_id, uri, 9)
    _stopped(record, uri, run_id, RuntimeError("worker died"))
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == list(range(9))
    got = client.get_run(run_id)
    assert got.info.status == "FAILED" and got.data.tags[names.TAG_ERROR] == "RuntimeError: worker died"
    assert f"MLflow holds the whole record of run {run_id}" in capsys.readouterr().err
    assert events.Record(record).pending() == []


def test_ctrl_c_drains_the_record_and_ends_the_run_killed(store, tmp_path):
    uri, client = store
    run_id = start_run(client, experiment="exit", uri=uri, run_name="r")
    record = _trained(tmp_path / "run" / events.FILE_NAME, run_id, uri, 4)
    _stopped(record, uri, run_id, KeyboardInterrupt(), raised=run.Interrupted)
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == list(range(4))
    got = client.get_run(run_id)
    assert got.info.status == "KILLED" and got.data.tags[names.TAG_ERROR] == names.interrupted_cause("SIGINT")


def test_a_store_that_is_away_at_exit_costs_a_bounded_wait_and_names_the_upload(store, tmp_path, capsys):
    uri, client = store
    run_id = start_run(client, experiment="exit", uri=uri, run_name="r")
    away = "http://127.0.0.1:9"  # nothing listens there: refused at once
    record = _trained(tmp_path / "run" / events.FILE_NAME, run_id, away, 3)
    began = time.monotonic()
    _stopped(record, away, run_id, RuntimeError("worker died"))
    assert time.monotonic() - began < mirror.DRAIN_S + 5
    err = capsys.readouterr().err
    assert f"6 events of run {run_id} are not in MLflow yet" in err  # all but the first `open`
    assert f"{events.UPLOAD_COMMAND} {record}" in err
    assert mirror.main(record, tracking_uri=uri) == 0  # the store answers again: the upload closes the run
    got = client.get_run(run_id)
    assert got.info.status == "FAILED" and sorted(m.step for m in client.get_metric_history(run_id, "loss")) == [0, 1, 2]


def test_a_successful_resume_clears_the_earlier_error_and_the_record_keeps_it(store, tmp_path):
    from raystream.config import compose

    uri, client = store
    run_id = start_run(client, experiment="exit", uri=uri, run_name="r")
    record = _trained(tmp_path / "run" / events.FILE_NAME, run_id, uri, 2)
    _stopped(record, uri, run_id, RuntimeError("first attempt died"))
    assert client.get_run(run_id).data.tags[names.TAG_ERROR] == "RuntimeError: first attempt died"
    end = run.run_end(compose(["trainer.run_name=r"]), run_id, None)
    run.finish_run(uri, run_id, record, end)
    got = client.get_run(run_id)
    assert got.info.status == "FINISHED" and names.TAG_ERROR not in got.data.tags
    kept = [e for e, _ in events.Record(record).read() if e.get("key") == names.TAG_ERROR]
    assert [e["kind"] for e in kept] == ["tag", "untag"] and kept[0]["value"] == "RuntimeError: first attempt died"


@pytest.mark.parametrize("command", ["raystream train", "raystream pretrain-start"])
@pytest.mark.parametrize("exc, code, said", [
    (run.Interrupted("run r interrupted by SIGTERM", "SIGTERM"), 143, "interrupted (SIGTERM); the MLflow run is "
                                                                      "marked KILLED. Resume from the last checkpoint"),
    (DivergedError("loss is nan at step 3", 3), 1, "loss is nan at step 3; the MLflow run is marked FAILED"),
    (RuntimeError("a worker died"), 1, "training failed: RuntimeError: a worker died"),
])
def test_a_run_that_ends_early_says_why_once_with_its_resume_command(command, exc, code, said, capsys):
    """`raystream train` and `raystream pretrain-start` end a run the same way (pretrain-start printed a traceback
    on SIGTERM, 2026-11-27): one message naming the cause, the exit code, and how to resume where it applies."""
    assert commands.said_why_it_ended(command, exc, f"{command} trainer.seed=1") == code
    err = capsys.readouterr().err
    assert err.startswith(f"{command}: ") and said in err and "Traceback" not in err
    assert (f"{command} trainer.seed=1" in err) == (not isinstance(exc, DivergedError))


def test_pretrain_start_interrupted_says_so_and_how_to_resume(tmp_path, monkeypatch, capsys):
    """The command's own path: its run (`fit`, here stopped as a SIGTERM stops it) ends in one message and 143."""
    from raystream.config import compose
    from raystream.train import start

    def interrupted(cfg, **kwargs):
        raise run.Interrupted("run table1_start_s0 interrupted by SIGTERM", "SIGTERM")

    monkeypatch.setattr(start, "fit", interrupted)
    overrides = [f"trainer.storage_path={tmp_path}", "trainer.run_name=table1_start_s0"]
    cfg = compose([f"+experiment={start.EXPERIMENT}", "eval.dataset=null", "eval.metrics=[]", *overrides])
    assert start.main(cfg, overrides) == 143
    err = capsys.readouterr().err
    assert "Traceback" not in err and "raystream pretrain-start: interrupted (SIGTERM)" in err
    assert f"raystream pretrain-start trainer.storage_path={tmp_path} trainer.run_name=table1_start_s0" in err


# ---- no process of a run outlives its command (issue 62; raystream/train/guard.py) -------------------------------

@contextmanager
def local_run(tmp_path, name: str):
    """A tiny `raystream train` on a local Ray of its own (no RAY_ADDRESS; its own RAY_TMPDIR), paused before step 2
    with its controller and worker up and its first checkpoint written: (driver, its RunProcesses, its stderr file).
    What the run left is killed when the block ends, whatever the test asserted."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))  # short: Ray's socket paths live under it
    mark, paused, err = uuid.uuid4().hex, tmp_path / f"{name}.paused", tmp_path / f"{name}.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}
    env.update(RAY_TEST_ENV, RAY_TMPDIR=str(ray_tmp), RAY_USAGE_STATS_ENABLED="0", RAYSTREAM_PAUSE_AT_STEP="2",
               RAYSTREAM_PAUSE_FILE=str(paused), **{MARK_ENV: mark})
    overrides = ["stream.batch_size=4", "trainer.max_steps=4", "trainer.checkpoint_every=2", "eval.metrics=[]",
                 "trainer.correlation_steps=0", "trainer.max_failures=0", "trainer.num_workers=1",
                 f"trainer.storage_path={tmp_path / 'results'}", f"mlflow.tracking_uri=sqlite:///{tmp_path / 'm.db'}",
                 f"trainer.run_name={name}"]
    processes = None
    try:
        with train_process(overrides, env, tmp_path, err) as driver:
            processes = RunProcesses(driver.pid, mark, ray_tmp)
            wait_for(driver, err, lambda: processes.note() or paused.exists(), 400, "the run paused before step 2")
            processes.note()
            assert any("TrainController" in line for line in processes.left()), processes.left()
            yield driver, processes, err
    finally:
        if processes is not None:
            processes.kill_left()
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.slow
def test_a_sigtermed_local_run_leaves_no_process_once_its_command_returns(tmp_path):
    """SIGTERM (a job scheduler, `timeout`, `ray job stop`), sent while the run is paused after its first checkpoint,
    stops the run as Ctrl-C does: the command exits 143 with the resume command printed, the MLflow run is KILLED
    with the cause in `raystream.error`, the run is resumable, and by the time the command returns every process of
    its local Ray has ended (the `ray::TrainController` outlived its command by a second or more before; by 50
    minutes once)."""
    import json

    import pyarrow.fs

    from raystream.train import checkpoint

    with local_run(tmp_path, "termed") as (driver, processes, err):
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=300) == 143, err.read_text()[-3000:]
        assert processes.left() == []
    said = err.read_text()
    assert "interrupted (SIGTERM)" in said and "trainer.run_name=termed" in said and "raystream train " in said
    run_dir = tmp_path / "results" / "termed"
    run_id = json.loads((run_dir / "raystream_run.json").read_text())["mlflow_run_id"]
    got = make_client(f"sqlite:///{tmp_path / 'm.db'}").get_run(run_id)
    assert got.info.status == "KILLED" and got.data.tags["raystream.error"].startswith("interrupted (SIGTERM")
    assert checkpoint.latest(pyarrow.fs.LocalFileSystem(), str(run_dir)) is not None  # resumable


@pytest.mark.slow
def test_a_driver_killed_while_it_shuts_down_leaves_no_process(tmp_path):
    """Ctrl-C, then SIGKILL while the driver closes the run (as a fault test that lost patience did, issue 62):
    nothing of the run is left within seconds; the command's own exit path never ran."""
    with local_run(tmp_path, "killed") as (driver, processes, err):
        driver.send_signal(signal.SIGINT)
        wait_for(driver, err, lambda: "MLflow holds the whole record" in err.read_text(), 300,
                 "the interrupted run closing its MLflow run")
        driver.send_signal(signal.SIGKILL)
        assert driver.wait(timeout=60) == -signal.SIGKILL
        deadline = time.monotonic() + 60
        while processes.left() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes.left() == []
