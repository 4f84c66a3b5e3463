"""What a sweep records in MLflow when things go wrong, on a real sqlite store: a trial that failed before its
Train run existed still gets a FAILED child run with its grid values and reason; an interrupt leaves no child run
RUNNING; the parent's duration is the time the sweep ran, not the pause before a resume; a trial that failed in
an earlier session keeps its grid values."""

from __future__ import annotations

import time
from types import SimpleNamespace

from mlflow import MlflowClient

from raystream.config import compose
from raystream.tracking import events, names
from raystream.tracking.mirror import catch_up
from raystream.tracking.store import prepare_store
from raystream.tune.searcher import CELL_KEY
from raystream.tune.space import plan
from raystream.train import storage
from raystream.tracking.parent import ParentClose
from raystream.tune.sweep import TrialOutcome, _outcome, sweep_status
from raystream.tune.sweep_run import parent_run
from raystream.tune.trial import record_failed_trial, trial_tags


def _sweep(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    prepare_store(uri)
    cfg = compose([])
    p = plan(cfg)
    return uri, p, parent_run(uri, "records", "smoke-x", cfg, p, None)


def _children(client, parent):
    exp = client.get_run(parent).info.experiment_id
    return client.search_runs([exp], filter_string=f"tags.`{names.PARENT_RUN_TAG}` = '{parent}'")


def test_a_trial_failing_before_its_run_exists_becomes_a_failed_child_run(tmp_path):
    uri, p, parent = _sweep(tmp_path)
    info = {"name": "smoke", "run_name": "smoke-x", "cell_values": [c.values for c in p.cells]}
    tags = trial_tags(info, 1, "t1", {"optimizer.lr": 0.5})
    try:
        raise RuntimeError("Training failed.\nDivergedError: loss is nan at step 3")
    except RuntimeError as exc:
        record_failed_trial(uri, parent, "smoke-x-t1", tags, exc)
    (child,) = _children(MlflowClient(uri), parent)
    assert child.info.status == "FAILED" and child.info.run_name == "smoke-x-t1"
    assert child.data.tags[names.ERROR_TAG] == "DivergedError: loss is nan at step 3"
    assert child.data.tags[names.GRID_TAG_PREFIX + "optimizer.name"] == str(p.cells[1].values["optimizer.name"])
    assert child.data.tags[names.SAMPLE_TAG_PREFIX + "optimizer.lr"] == "0.5"


def test_an_interrupt_kills_running_children_and_the_pause_is_not_counted(tmp_path):
    uri, p, parent = _sweep(tmp_path)
    client = MlflowClient(uri)
    exp = client.get_run(parent).info.experiment_id
    child = client.create_run(exp, tags={names.PARENT_RUN_TAG: parent}).info.run_id
    # a stopped trial whose run already ended FAILED with its killed actor's error: it was interrupted, not broken
    died = client.create_run(exp, tags={names.PARENT_RUN_TAG: parent, names.TRIAL_TAG: "t2"}).info.run_id
    client.set_tag(died, names.ERROR_TAG, "ActorDiedError: The actor died unexpectedly before finishing this task")
    client.set_terminated(died, "FAILED")
    meta = {"active_s": 30.0}  # an earlier session ran 30 s; this one 2 s, after a long pause
    stopped = [TrialOutcome("t2", {}, {}, "unfinished"), TrialOutcome("t3", {}, {}, "finished")]
    closing = ParentClose(uri, client.get_run(parent).info, "smoke-x", storage.resolve(str(tmp_path)), meta,
                          time.time() - 2.0)
    assert closing.end("KILLED", "SIGTERM", trials=stopped) is None and closing.saved is None
    for run_id in (child, died):
        stopped = client.get_run(run_id)
        assert stopped.info.status == "KILLED"
        assert stopped.data.tags[names.ERROR_TAG].startswith("interrupted (SIGTERM")
    run = client.get_run(parent)
    assert run.info.status == "KILLED" and "SIGTERM" in run.data.tags[names.ERROR_TAG]
    assert 31.5 <= (run.info.end_time - run.info.start_time) / 1000 <= 40
    assert float(run.data.tags[names.ACTIVE_SECONDS_TAG]) >= 32
    assert meta["active_s"] >= 32


def test_a_trial_failed_in_an_earlier_session_keeps_its_cell():
    p = plan(compose([]))
    restored = SimpleNamespace(config={}, metrics={"trial_id": "abc"}, error=RuntimeError("bad.mp4: not a video"),
                               path="/x/trial_abc")
    saved = {"abc": SimpleNamespace(status="ERROR", config={CELL_KEY: 2})}
    out = _outcome(restored, p, saved)
    assert out.status == "failed" and out.cell == p.cells[2].values and out.error == "RuntimeError: bad.mp4: not a video"


def test_an_interrupt_during_an_outage_is_saved_and_written_when_the_sweep_resumes(tmp_path, capsys):
    uri, p, parent = _sweep(tmp_path)
    client = MlflowClient(uri)
    (tmp_path / "sweep").mkdir()
    where = storage.resolve(str(tmp_path / "sweep"))
    away = "http://127.0.0.1:9"  # nothing listens there: the store is away
    info = client.get_run(parent).info
    closing = ParentClose(away, info, "smoke-x", where, {"active_s": 5.0}, time.time())
    error = closing.end("KILLED", "SIGTERM", trials=[TrialOutcome("t1", {}, {}, "unfinished")])
    assert error and "Connection" in error
    assert closing.saved == str(tmp_path / "sweep" / events.FILE_NAME)
    assert client.get_run(parent).info.status == "RUNNING"  # nothing written yet

    catch_up(closing.saved, "the last session", tracking_uri=uri)  # the sweep starts again: the store answers
    run = client.get_run(parent)
    assert run.info.status == "KILLED" and run.data.tags[names.ERROR_TAG].startswith("interrupted (SIGTERM")
    assert run.data.tags[names.trials_count_tag("unfinished")] == "1"
    assert events.Record(closing.saved).pending() == []
    catch_up(closing.saved, "the last session", tracking_uri=uri)  # nothing left: no-op
    assert "WARNING" not in capsys.readouterr().err


def test_a_sweep_whose_tuner_fails_ends_its_parent_failed_with_the_error(tmp_path):
    uri, p, parent = _sweep(tmp_path)
    client = MlflowClient(uri)
    closing = ParentClose(uri, client.get_run(parent).info, "smoke-x", storage.resolve(str(tmp_path)),
                          {"active_s": 0.0}, time.time())
    assert closing.end("FAILED", failure="TuneError: experiment state is corrupt") is None
    run = client.get_run(parent)
    assert run.info.status == "FAILED" and run.data.tags[names.ERROR_TAG] == "TuneError: experiment state is corrupt"


def test_a_signal_before_every_planned_trial_was_made_leaves_the_sweep_killed():
    """A SIGTERM just as a trial ends, before Tune makes the next one: every made trial ended, but the plan was not run
    (an e2e run once reported such a sweep FINISHED, exit 0, with 1 of 4 trials)."""
    done = [TrialOutcome("t1", {}, {}, "finished")]
    assert sweep_status(done, planned=4, signalled=True) == "KILLED"
    assert sweep_status(done, planned=4, signalled=False) == "FINISHED"  # no signal: Tune chose to stop
    assert sweep_status(done * 4, planned=4, signalled=True) == "FINISHED"  # the signal came after the end
    assert sweep_status([TrialOutcome("t1", {}, {}, "unfinished")], planned=1, signalled=True) == "KILLED"
    assert sweep_status([TrialOutcome("t1", {}, {}, "failed")], planned=1, signalled=False) == "FAILED"
    assert sweep_status([], planned=2, signalled=False, reused=2) == "FINISHED"  # every trial reused: none ran
    assert sweep_status(done, planned=4, signalled=True, reused=3) == "FINISHED"  # the one to run ended
