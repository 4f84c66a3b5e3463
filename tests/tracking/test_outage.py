"""A tracking outage does not stop the metric writer from taking values: MLflow's tracking server (sqlite store,
127.0.0.1) is stopped while values are logged and started again on the same port; every step is then recorded
exactly once, in order."""

import math

from mlflow_outage import restartable_mlflow

from raystream.tracking import StepLogger, events, mirror, start_run
from raystream.tracking import client as make_client


def wait_for(check, what: str, timeout_s: float = 90.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.2)


def test_outage_is_named_buffered_saved_and_flushed_once_the_server_returns(tmp_path, capsys):
    record = str(tmp_path / "run" / events.FILE_NAME)
    with restartable_mlflow() as server:
        client = make_client(server.uri)
        run_id = start_run(client, experiment="outage", uri=server.uri, run_name="r")
        logger = StepLogger(server.uri, run_id, record, warn_after_s=1.0)
        for step in range(5):
            logger.log({"loss": 1.0 / (step + 1), "lr": 0.1}, step)
        logger.flush()
        wait_for(lambda: logger.pending == 0, "the first steps written")

        server.kill()
        for step in range(5, 40):  # returns at once: nothing waits for the dead server
            logger.log({"loss": 1.0 / (step + 1), "lr": 0.1, "nan": math.nan}, step)
            logger.flush()
        wait_for(lambda: "has not answered" in capsys.readouterr().err if logger.outage else False,
                 "a warning naming the outage")
        waiting = events.Record(record).pending()  # during the outage: in the record beside the checkpoints
        assert {e["run"] for e in waiting} == {run_id}
        assert [e["step"] for e in waiting if "loss" in e.get("values", {})] == list(range(5, 40))

        server.start()
        assert logger.close(timeout_s=90) == 0
        assert events.Record(record).pending() == []  # all written
        client = make_client(server.uri)
        loss = client.get_metric_history(run_id, "loss")
        assert sorted(m.step for m in loss) == list(range(40))  # each step exactly once
        assert {m.step: m.value for m in loss}[39] == 1 / 40
        assert "nan" not in client.get_run(run_id).data.metrics


def test_warning_names_the_uri(tmp_path, capsys):
    """The warning names the tracking URI, and a logger started during an outage takes values all the same."""
    with restartable_mlflow() as server:
        run_id = start_run(make_client(server.uri), experiment="outage", uri=server.uri, run_name="r")
        server.kill()
        record = str(tmp_path / events.FILE_NAME)
        logger = StepLogger(server.uri, run_id, record, warn_after_s=0.5)
        logger.log({"loss": 1.0}, 0)
        wait_for(lambda: logger.outage, "the outage noticed")
        assert logger.close(timeout_s=2) == 1  # still down: the value waits in the record
        assert server.uri in capsys.readouterr().err
        server.start()
        assert mirror.main(record) == 0  # `raystream tracking upload FILE`
        assert [m.step for m in make_client(server.uri).get_metric_history(run_id, "loss")] == [0]
        assert mirror.main(record) == 0  # again: nothing left to write, nothing written twice
        assert [m.step for m in make_client(server.uri).get_metric_history(run_id, "loss")] == [0]
        assert mirror.main(str(tmp_path / "elsewhere" / events.FILE_NAME)) == 2  # no record there


def test_a_trial_starting_during_an_outage_waits_for_the_server_and_says_so(capsys):
    """A sweep's trial calls `wait_for_store` before its run starts: it returns once the server answers again, after
    one warning naming the trial and the URI; a server that stays away ends the wait, named, after its limit."""
    import threading
    import time

    import pytest

    from raystream.tracking.store import TrackingStoreError, wait_for_store

    with restartable_mlflow() as server:
        server.kill()
        restart = threading.Timer(8.0, server.start)  # after the first check (3 tries, ~3 s) has failed
        restart.start()
        wait_for_store(server.uri, "trial t1 (adamw)", timeout_s=120, poll_s=0.5)
        restart.join()
        err = capsys.readouterr().err
        assert f"trial t1 (adamw) waits for the MLflow tracking server at {server.uri}" in err
        assert "answers again" in err

        server.kill()
        started = time.monotonic()
        with pytest.raises(TrackingStoreError, match=f"trial t2: MLflow tracking URI {server.uri}: no answer"):
            wait_for_store(server.uri, "trial t2", timeout_s=0.1, poll_s=0.1)
        assert time.monotonic() - started < 60  # one server check, not MLflow's minutes of retries
    wait_for_store("sqlite:////nonexistent/mlflow.db", "trial t3", timeout_s=0)  # a local store: no wait
