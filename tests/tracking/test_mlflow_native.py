"""MLflow-native records (issue 62, items 1-3), through the run's record and its mirror, on a real sqlite store:
- the run's videos are dataset inputs (context training / heldout / probe) whose digest is the video index's: two
  runs on the same videos share it, other videos give another, `mlflow.search_runs` finds runs by it;
- a checkpoint is a LoggedModel of its run with its step and eval metrics linked, which
  `mlflow.pytorch.load_model("models:/<model_id>")` loads as the scenario's module, and `scenario.backbone.init`
  takes as `models:/<model_id>` or, registered, as `models:/raystream-table1-start@s0`;
- replaying a record twice writes one input of each kind and one model; a models:/ URI that names nothing, or a
  server that does not answer, is a clear error naming the URI, at once.
Videos are real mp4 files written with PyAV; the model is the default scenario's, built with torch."""

from __future__ import annotations

import json
import time

import mlflow
import numpy as np
import pytest
import torch

from raystream.config import ConfigError, compose
from raystream.data.demo.encode import write_video
from raystream.models import build_scenario
from raystream.models.checkpoint import CheckpointError, initialise
from raystream.tracking import client as make_client
from raystream.tracking import events, inputs, logged_model, mirror, registry, start_run
from raystream.tracking.store import prepare_store
from raystream.train import eval_target
from raystream.train.eval_job import read_model_state
from raystream.train.inputs import video_sets
from raystream.train.model_uri import fetched, model_file
from raystream.train.preflight import check_backbone_init, stream_plan
from raystream.train.resolved import videos_of


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    prepare_store(uri)
    return uri, make_client(uri)


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """Two folders of real videos: `a` (two videos) and `b` (the same two, one of them 8 frames longer)."""
    root = tmp_path_factory.mktemp("videos")
    rng = np.random.default_rng(0)
    for folder, extra in (("a", 0), ("b", 8)):
        for i, frames in enumerate((24, 24 + extra)):
            pixels = [rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for _ in range(frames)]
            (root / folder).mkdir(exist_ok=True)
            write_video(root / folder / f"clip_{i}.mp4", pixels, fps=12.0)
    return root


def _cfg(folder, tmp_path, **more):
    overrides = [f"data.videos={folder}", "stream.batch_size=2", "stream.frames_per_clip=4",
                 "stream.resolution=32", f"mlflow.tracking_uri=sqlite:///{tmp_path}/unused.db",
                 *(f"{k}={v}" for k, v in more.items())]
    return compose(overrides)


def _run_with_inputs(store, cfg, path) -> str:
    """A run whose record holds its dataset inputs (as `fit` appends them), mirrored twice (a replay)."""
    uri, client = store
    run_id = start_run(client, experiment="native", uri=uri, run_name="r")
    videos = videos_of(cfg)  # as `fit` resolves them
    stream_plan(cfg, videos.probed)
    record = events.Record(str(path))
    record.append([events.opened(run_id, uri), *inputs.input_events(run_id, video_sets(videos))])
    record.close()
    mirror.mirror_now(str(path))
    record.set_mirrored(0)  # a replay of the whole record
    mirror.mirror_now(str(path))
    return run_id


def test_runs_on_the_same_videos_share_the_digest_and_search_finds_them(store, videos, tmp_path):
    uri, client = store
    first = _run_with_inputs(store, _cfg(videos / "a", tmp_path), tmp_path / "1" / events.FILE_NAME)
    second = _run_with_inputs(store, _cfg(videos / "a", tmp_path), tmp_path / "2" / events.FILE_NAME)
    other = _run_with_inputs(store, _cfg(videos / "b", tmp_path), tmp_path / "3" / events.FILE_NAME)

    def training(run_id):
        got = client.get_run(run_id).inputs.dataset_inputs
        assert len(got) == 1, [(d.dataset.name, d.dataset.digest) for d in got]  # the replay added none
        (one,) = got
        assert {t.key: t.value for t in one.tags}[inputs.CONTEXT_TAG] == inputs.TRAINING
        return one.dataset

    a1, a2, b = training(first), training(second), training(other)
    assert a1.digest == a2.digest != b.digest
    assert a1.name == "a" and a1.source_type == "local"
    profile = json.loads(a1.profile)
    assert profile["videos"] == 2 and profile["frames"] == 48 and len(profile["uris"]) == 2
    assert json.loads(b.profile)["frames"] == 56
    mlflow.set_tracking_uri(uri)
    found = mlflow.search_runs(search_all_experiments=True, filter_string=f"dataset.digest = '{a1.digest}'")
    assert set(found["run_id"]) == {first, second}
    found = mlflow.search_runs(search_all_experiments=True,
                               filter_string=f"dataset.digest = '{b.digest}' AND dataset.context = 'training'")
    assert set(found["run_id"]) == {other}


def test_heldout_videos_and_the_probe_set_are_inputs_of_their_own(store, videos, tmp_path):
    uri, client = store
    probe = tmp_path / "probe.csv"
    probe.write_text("path,label\n" + "".join(f"{videos / 'a' / f'clip_{i}.mp4'},{i}\n" for i in range(2)))
    cfg = _cfg(videos / "a", tmp_path, **{"data.heldout_videos": videos / "b", "eval.dataset": probe})
    run_id = _run_with_inputs(store, cfg, tmp_path / "r" / events.FILE_NAME)
    got = {next(t.value for t in d.tags if t.key == inputs.CONTEXT_TAG): d.dataset
           for d in client.get_run(run_id).inputs.dataset_inputs}
    assert set(got) == {"training", "heldout", "probe"}
    assert got["heldout"].name == "b" and json.loads(got["probe"].profile)["samples"] == 2
    assert got["probe"].name == "probe.csv"


def _checkpoint(tmp_path, cfg, step: int):
    """A checkpoint directory as rank 0 writes it (model.pt, meta.json) with random weights of `cfg`'s model."""
    model = build_scenario(cfg.scenario, cfg.stream, seed=3).model
    where = tmp_path / f"checkpoint_{step:08d}"
    where.mkdir(parents=True)
    torch.save(model.state_dict(), where / "model.pt")
    sizes = {"model.pt": (where / "model.pt").stat().st_size}  # complete: every file it lists is there
    (where / "meta.json").write_text(json.dumps({"next_step": step + 1, "file_sizes": sizes}))
    return where, model.state_dict()


def _trained_run(store, tmp_path, cfg, register=None):
    """A run whose record holds eval metrics at step 4 and, at its end, its checkpoint as a model event."""
    from omegaconf import OmegaConf  # the run's config as the driver records it

    uri, client = store
    run_id = start_run(client, experiment="native", uri=uri, run_name="start")
    path = str(tmp_path / "run" / events.FILE_NAME)
    where, state = _checkpoint(tmp_path / "run", cfg, 4)
    record = events.Record(path)
    record.append([events.opened(run_id, uri),
                   *(events.metrics(run_id, s, {"loss": 1.0 / (s + 1)}, 1000 + s) for s in range(5)),
                   events.metrics(run_id, 4, {"eval/knn_top1": 0.5, "drift/params": 0.25}, 2000)])
    record.flush()  # rank 0's writer has closed the record when the driver reads it
    record.append(logged_model.model_events(run_id, "start", OmegaConf.to_container(cfg, resolve=True), path,
                                            [(str(where), 4, True)], register))
    record.append([events.end(run_id, "FINISHED")])
    record.close()
    mirror.mirror_now(path)
    record.set_mirrored(0)
    mirror.mirror_now(path)  # replayed: still one model, one version
    return run_id, state


def test_a_checkpoint_is_a_logged_model_that_mlflow_and_raystream_load(store, tmp_path, monkeypatch):
    uri, client = store
    cfg = compose([])
    run_id, state = _trained_run(store, tmp_path, cfg)
    run = client.get_run(run_id)
    models = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'")
    assert len(models) == 1
    model = client.get_logged_model(models[0].model_id)  # with its metrics
    assert str(model.status) == "READY" and model.tags[logged_model.STEP_TAG] == "4"
    assert {(m.key, m.step, m.value) for m in model.metrics} == {("eval/knn_top1", 4, 0.5), ("drift/params", 4, 0.25)}
    assert [(o.model_id, o.step) for o in run.outputs.model_outputs] == [(model.model_id, 4)]
    assert len(client.get_metric_history(run_id, "eval/knn_top1")) == 1  # linked, not logged twice on the run
    mlflow.set_tracking_uri(uri)
    monkeypatch.setenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "true")  # MLflow 3's rule for pickled models
    loaded = mlflow.pytorch.load_model(f"models:/{model.model_id}")
    assert isinstance(loaded, torch.nn.Module) and not loaded.training
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())
    monkeypatch.setenv("RAYSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    registry.use(uri)
    target = build_scenario(cfg.scenario, cfg.stream, seed=0).model
    done = initialise(target, str(model_file(f"models:/{model.model_id}")))  # train fetches, models reads the file
    assert done is not None and "into the model" in done.line
    assert all(torch.equal(target.state_dict()[k], v) for k, v in state.items())
    evaluated = eval_target.resolve(f"models:/{model.model_id}")  # `raystream eval models:/<model_id>`
    assert evaluated.step == 4 and evaluated.mlflow_run_id == run_id and evaluated.tracking_uri == uri
    assert all(torch.equal(v, state[k]) for k, v in read_model_state(evaluated.checkpoint).items())
    assert eval_target.run_config(evaluated, [])[0].scenario.name == cfg.scenario.name


def test_a_registered_start_is_a_backbone_init_and_missing_ones_are_named(store, tmp_path, monkeypatch):
    uri, client = store
    cfg = compose([])
    _, state = _trained_run(store, tmp_path, cfg, register={"name": logged_model.START_MODEL, "alias": "s0"})
    versions = client.search_model_versions(f"name = '{logged_model.START_MODEL}'")
    assert len(versions) == 1 and client.get_model_version_by_alias(logged_model.START_MODEL, "s0").version in (1, "1")
    monkeypatch.setenv("RAYSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    given = compose([f"mlflow.tracking_uri={uri}", f"scenario.backbone.init=models:/{logged_model.START_MODEL}@s0"])
    assert "into the model" in check_backbone_init(given, say=False)  # the driver's check, before Ray
    target = build_scenario(fetched(given.scenario), given.stream, seed=0).model
    assert all(torch.equal(target.state_dict()[k], v) for k, v in state.items())
    missing = compose([f"mlflow.tracking_uri={uri}", f"scenario.backbone.init=models:/{logged_model.START_MODEL}@s9"])
    with pytest.raises(ConfigError, match=f"models:/{logged_model.START_MODEL}@s9.*no such model, alias"):
        check_backbone_init(missing, say=False)
    away = compose(["mlflow.tracking_uri=http://127.0.0.1:9", "scenario.backbone.init=models:/x@s0"])
    began = time.monotonic()
    with pytest.raises(ConfigError, match="models:/x@s0.*127.0.0.1:9 did not answer"):
        check_backbone_init(away, say=False)
    assert time.monotonic() - began < 30  # one refused connection, not minutes of retries
    registry.use(uri)  # the check above pointed this process at the server that is away
    with pytest.raises(CheckpointError, match="models:/nothing.*no such model"):
        fetched(compose(["scenario.backbone.init=models:/nothing"]).scenario)
    with pytest.raises(CheckpointError, match="models:/nothing.*fetched by the train layer"):
        initialise(target, "models:/nothing")  # the models package reaches no server


def test_a_model_waits_in_the_record_while_the_store_is_away_and_is_written_once_after(store, tmp_path):
    """A tracking outage at the run's end: the model event stays in the record (the mirror's mark before it), and
    `raystream tracking upload` writes one model when the store answers."""
    from omegaconf import OmegaConf  # the run's config as the driver records it

    uri, client = store
    cfg = compose([])
    run_id = start_run(client, experiment="native", uri=uri, run_name="outage")
    path = str(tmp_path / "run" / events.FILE_NAME)
    where, _ = _checkpoint(tmp_path / "run", cfg, 2)
    record = events.Record(path)
    record.append([events.opened(run_id, "http://127.0.0.1:9"),  # the store the run wrote to is away
                   *logged_model.model_events(run_id, "outage", OmegaConf.to_container(cfg, resolve=True), path,
                                              [(str(where), 2, True)]),
                   events.end(run_id, "FINISHED")])
    record.close()
    with pytest.raises(Exception):
        mirror.mirror_now(path)
    assert [e["kind"] for e in events.Record(path).pending()] == ["model", "end"]
    assert mirror.main(path, tracking_uri=uri) == 0
    assert mirror.main(path, tracking_uri=uri) == 0  # a second upload: nothing new
    exp = client.get_run(run_id).info.experiment_id
    (model,) = client.search_logged_models([exp], filter_string=f"source_run_id = '{run_id}'")
    assert str(model.status) == "READY" and client.get_run(run_id).info.status == "FINISHED"


def test_pretrain_start_registers_a_start_cached_before_registration(store, tmp_path, monkeypatch):
    """`raystream pretrain-start` with a start made before starts were registered (its start.json holds no
    `registered`): the command trains nothing and registers the start's final checkpoint as
    `raystream-table1-start` alias `s<seed>` through the start's record; start.json then says so."""
    from raystream.train import start

    uri, client = store
    monkeypatch.setenv("RAYSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    cfg = compose([f"+experiment={start.EXPERIMENT}", f"trainer.storage_path={tmp_path}", "trainer.seed=5",
                   f"mlflow.tracking_uri={uri}", "eval.dataset=null", "eval.metrics=[]"])
    home = start.start_dir(cfg)
    run_id = start_run(client, experiment="native", uri=uri, run_name=str(cfg.trainer.run_name))
    _, state = _checkpoint(home, cfg, 9)
    record = events.Record(events.path_in(str(home)))
    record.append([events.opened(run_id, uri), events.metrics(run_id, 9, {"eval/knn_top1": 0.7}, 5000)])
    record.close()
    (home / start.RECORD).write_text(json.dumps({"path": str(home), "config_hash": start.config_hash(cfg),
                                                 "steps": 10, "mlflow_run_id": run_id, "metrics": {}}))
    found = start.ensure_start(cfg)
    assert found["registered"] == "models:/raystream-table1-start@s5"
    assert json.loads((home / start.RECORD).read_text())["registered"] == found["registered"]
    version = client.get_model_version_by_alias("raystream-table1-start", "s5")
    assert version.run_id == run_id
    registry.use(uri)
    target = build_scenario(cfg.scenario, cfg.stream, seed=0).model
    initialise(target, str(model_file("models:/raystream-table1-start@s5")))
    assert all(torch.equal(target.state_dict()[k], v) for k, v in state.items())


def test_raystream_train_from_a_missing_alias_fails_before_ray_naming_the_uri(store, tmp_path, monkeypatch, capfd):
    """The command line's path (`check_inputs`): exit 2, the URI and what is wrong on stderr, Ray never started
    (`in_process` fails the test if the command started a Ray, whatever this worker's session cluster did before)."""
    from cli_driver import in_process

    uri, _ = store
    with in_process(tmp_path, monkeypatch, capfd) as run:
        out = run("train", f"mlflow.tracking_uri={uri}", f"trainer.storage_path={tmp_path}",
                  f"scenario.backbone.init=models:/{logged_model.START_MODEL}@s42")
    assert out.returncode == 2, out.stderr
    assert f"models:/{logged_model.START_MODEL}@s42" in out.stderr and "no such model, alias" in out.stderr
