"""MLflow set-up on a real sqlite store in a temp dir: URIs, nested/resumed runs, exactly-once steps, plots."""

import math
from pathlib import Path

import pytest

from raystream.tracking import StepLogger, grad_cosine_plots, names, start_run, tracking_uri
from raystream.tracking import client as make_client
from raystream.tracking.plots import history


def test_tracking_uri_precedence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri(None) == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///rel/x.db")
    assert tracking_uri(None) == f"sqlite:///{tmp_path / 'rel' / 'x.db'}"

    class Node:
        tracking_uri = "http://mlflow.example:5000"

    class Cfg:
        mlflow = Node

    assert tracking_uri(Cfg) == "http://mlflow.example:5000"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One sqlite store for the module: creating its tables takes seconds."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    return uri, make_client(uri)


def test_child_run_nests_under_parent_and_resumes(store, tmp_path):
    uri, client = store
    parent = client.create_run(client.create_experiment("sweep", artifact_location=(tmp_path / "a").as_uri()))
    parent_id = parent.info.run_id
    run_id = start_run(client, experiment="ignored-for-children", uri=uri, run_name="trial-1",
                       parent_run_id=parent_id, tags={"k": "v"})
    run = client.get_run(run_id)
    assert run.data.tags[names.PARENT_RUN_TAG] == parent_id
    assert run.data.tags[names.TAG_RUN_NAME] == "trial-1" and run.data.tags["k"] == "v"
    assert run.info.experiment_id == parent.info.experiment_id and run.info.run_name == "trial-1"
    client.set_terminated(run_id, "KILLED")
    assert start_run(client, experiment="x", uri=uri, run_name="trial-1", resume_run_id=run_id) == run_id
    assert client.get_run(run_id).info.status == "RUNNING"
    other = start_run(client, experiment="solo", uri=uri, run_name="r", resume_run_id="0" * 32)
    assert other != run_id
    exp = client.get_experiment(client.get_run(other).info.experiment_id)
    assert exp.name == "solo" and exp.artifact_location == (Path(uri[len("sqlite:///"):]).parent / "mlruns").as_uri()


def test_step_logger_records_each_step_once_across_restarts(store, tmp_path):
    uri, client = store
    run_id = start_run(client, experiment="e", uri=uri, run_name="r")
    record = str(tmp_path / "run" / "events.jsonl")
    first = StepLogger(uri, run_id, record)
    for step in range(5):
        first.log({"loss": 1.0 / (step + 1), "grad_cos_prev": math.nan if step == 0 else 0.5}, step)
    assert first.close() == 0
    # a restarted loop replays steps 3.. from its checkpoint: the replayed steps are dropped, new ones kept
    second = StepLogger(uri, run_id, record)
    for step in range(3, 8):
        second.log({"loss": 1.0 / (step + 1), "grad_cos_prev": 0.5}, step)
    second.log({"loss": 123.0}, 7)  # the same step twice in one attempt is also dropped
    assert second.close() == 0 and second.last_step("loss") == 7
    loss = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))
    assert [s for s, _ in loss] == list(range(8))
    assert loss[7][1] == pytest.approx(1 / 8)
    assert sorted(m.step for m in client.get_metric_history(run_id, "grad_cos_prev")) == list(range(1, 8))


def test_grad_cosine_plots_are_written(store, tmp_path):
    uri, client = store
    run_id = start_run(client, experiment="e", uri=uri, run_name="r")
    logger = StepLogger(uri, run_id, str(tmp_path / "events.jsonl"))
    for step in range(30):
        logger.log({names.GRAD_COS_PREV: math.cos(step / 5), names.GRAD_COS_EMA: 0.1}, step)
    logger.close()
    series = history(client, run_id)
    assert len(series[names.GRAD_COS_PREV]) == 30
    files = grad_cosine_plots(series, tmp_path / "plots", title="t")
    assert [f.name for f in files] == ["grad_cosine.png", "grad_cosine_hist.png"]
    assert all(f.stat().st_size > 1000 and f.read_bytes()[:4] == b"\x89PNG" for f in files)
    assert grad_cosine_plots({}, tmp_path / "none") == [] and not Path(tmp_path / "none").exists()


def test_in_stream_average_names():
    assert names.in_stream_average_name("in_stream/mse") == "eval/mse_in_stream"
    assert names.in_stream_average_name("loss") == "eval/loss_in_stream"
    assert names.eval_name("knn_top1") == "eval/knn_top1" == names.eval_name("eval/knn_top1")


def test_a_refused_server_is_named_with_the_whole_exception_and_what_to_check():
    """Nothing listens at the URI: the message keeps the whole exception (it was cut mid-word, "Failed to est") and
    says what to check, after a few seconds' bounded tries (a server being started refuses for a moment)."""
    import time

    from raystream.tracking.store import TrackingStoreError, prepare_store

    with pytest.raises(TrackingStoreError):  # MLflow's modules imported: the time below is the request's
        prepare_store("http://127.0.0.1:1")
    t0 = time.time()
    with pytest.raises(TrackingStoreError) as err:
        prepare_store("http://127.0.0.1:1")
    assert time.time() - t0 < 15.0  # 3 tries, 1 + 2 s apart (it took 23 s)
    text = str(err.value)
    assert "http://127.0.0.1:1" in text and "Failed to establish a new connection" in text
    assert "Connection refused" in text and "Check that an MLflow tracking server runs at 127.0.0.1:1" in text
    assert "MLFLOW_TRACKING_URI" in text


def test_an_unreachable_server_fails_fast_naming_the_uri():
    import time

    from raystream.tracking.store import TrackingStoreError, prepare_store

    t0 = time.time()
    with pytest.raises(TrackingStoreError, match=r"http://127\.0\.0\.1:1"):
        prepare_store("http://127.0.0.1:1")
    assert time.time() - t0 < 30


def test_an_unwritable_sqlite_path_fails_naming_the_uri(tmp_path):
    from raystream.tracking.store import TrackingStoreError, prepare_store

    (tmp_path / "afile").write_text("not a directory")
    uri = f"sqlite:///{tmp_path / 'afile' / 'mlflow.db'}"
    with pytest.raises(TrackingStoreError, match=uri.replace(".", r"\.")):
        prepare_store(uri)


def _prepare_and_use(uri, experiment):
    from raystream.tracking.store import prepare_store

    prepare_store(uri)
    c = make_client(uri)
    return c.create_experiment(experiment)


def _driver(uri, experiment, barrier, results):
    """One driver, forked: starts with the others (`barrier`) and puts its experiment's id or its error."""
    try:
        barrier.wait(timeout=120)
        results.put((experiment, _prepare_and_use(uri, experiment)))
    except BaseException as exc:
        results.put((experiment, f"error: {type(exc).__name__}: {exc}"))


def _drivers(uri, experiments):
    """In a fresh (spawned) process: MLflow's store imported once, then one forked driver per experiment, all let go
    at once, so that each is its own process racing on the new file without paying MLflow's import each."""
    import multiprocessing

    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: F401  imported before the forks

    ctx = multiprocessing.get_context("fork")  # this process is new and has no thread: forking it is safe
    barrier, results = ctx.Barrier(len(experiments)), ctx.Queue()
    procs = [ctx.Process(target=_driver, args=(uri, e, barrier, results)) for e in experiments]
    for proc in procs:
        proc.start()
    got = dict(results.get(timeout=300) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
    return [got[e] for e in experiments]


def test_a_new_sqlite_store_is_created_once_and_appears_complete(tmp_path):
    """Several drivers at once on a new file: one creates and migrates it under a temporary name and moves it in
    whole; none sees a half-migrated store (sqlite3 `table _alembic_tmp_... already exists` before)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # the drivers are forked from one spawned process, not from this one: the suite's Ray driver may be live here
    # (tests/eval/test_eval_shard.py)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        ids = pool.submit(_drivers, uri, ["a", "b", "c"]).result(timeout=600)
    assert not [i for i in ids if i.startswith("error")], ids
    assert len(set(ids)) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]  # no temporary file left behind
    assert {e.name for e in make_client(uri).search_experiments()} >= {"a", "b", "c"}


def test_experiments_open_on_the_runs_table_in_the_mlflow_ui(store):
    from raystream.tracking.store import experiment_id

    uri, c = store  # the module's store (a new one costs a second of migrations): these names are used only here
    old = c.create_experiment("made-before")
    for name in ("new", "made-before"):
        exp = c.get_experiment(experiment_id(c, name, uri))
        assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert experiment_id(c, "made-before", uri) == old
