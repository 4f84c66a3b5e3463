"""`raystream eval` as a Ray Train job on every worker (raystream/train/eval_job.py): a real 2-worker training run
is evaluated by 2 workers, each extracting its part of the demo probe set; the results land in the training run's
MLflow run; a second evaluation of the same checkpoint and protocol encodes nothing; a probe longer than the
collective time-out trips nothing, in an evaluation job (the first one: every worker sleeps in it) and in a training
run's own evaluation; bad targets are named before Ray starts; a run in a bucket resolves and keeps its features
there."""

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from raystream.config import ConfigError
from raystream.eval.loaders import load_probe_source
from raystream.models import build_scenario
from raystream.train import eval_job
from raystream.train.eval_target import resolve
from raystream.train.evaluator import Evaluator
from raystream.train.faults import Faults
from raystream.train.run import RunOptions, fit

pytestmark = pytest.mark.slow
PROBE = ["eval.metrics=[knn,linear]", "eval.max_probe_samples=24", "eval.batch_size=8"]
TIMEOUT_S = 5  # torch.distributed's collective time-out of the long-probe tests
LONG_PROBE = ["eval.metrics=[knn]", "eval.max_probe_samples=24", "eval.batch_size=8",
              f"trainer.collective_timeout_s={TIMEOUT_S}"]


@pytest.fixture(scope="module")
def trained(ray_cluster, tiny):
    """The module's one training run (2 workers, 4 steps), which the evaluation jobs evaluate. It evaluates itself
    too (kNN after step 2, eval.every=3, and after the last), every worker sleeping twice the collective time-out in
    each evaluation: `test_a_training_runs_own_long_evaluation_trips_nothing` checks that it ended."""
    return fit(tiny("trainer.num_workers=2", "trainer.max_steps=4", "eval.every=3", "trainer.correlation_steps=0",
                    *LONG_PROBE), run_name="evaled",
               options=RunOptions(step_hooks=Faults(eval_delay_s=2 * TIMEOUT_S)))


def evaluate(cfg, target: str, step_hooks=None):
    return eval_job.run(cfg, eval_job.prepare(cfg, target), step_hooks)


def test_eval_job_on_two_workers_matches_one_process_and_reuses_its_features(trained, tiny, workdir, capsys):
    """The first evaluation is also the long one: every worker sleeps twice the collective time-out in it
    (faults.py's hook), and it trips nothing: it ends with every sample extracted and the one-process metrics."""
    cfg = tiny("trainer.num_workers=2", *PROBE, f"trainer.collective_timeout_s={TIMEOUT_S}")
    first = evaluate(cfg, trained["run_dir"], Faults(eval_delay_s=2 * TIMEOUT_S))
    assert first["seconds"] > 2 * TIMEOUT_S  # every rank probed for longer than one collective may wait
    source = load_probe_source(cfg.data, cfg.stream, cfg.eval)  # the demo probe set: fewer than 24 per split
    n_train, n_test = len(source.train), len(source.test)
    assert first["extracted"] == n_train + n_test  # every sample once, half of them by each worker
    # the same metrics as one process evaluating the checkpoint (kNN exactly; L-BFGS runs whole on each rank)
    scenario = build_scenario(cfg.scenario, cfg.stream, seed=0)
    scenario.model.load_state_dict(eval_job.read_model_state(trained["checkpoint_path"]))
    alone = Evaluator(cfg, scenario)(scenario.model)
    assert set(alone) == {"eval/knn_top1", "eval/linear_top1"}
    for key, value in alone.items():
        assert first[key] == pytest.approx(value, abs=1 / n_test + 1e-6), key  # batches differ: float noise
    # into the training run's MLflow run, at the checkpoint's last step
    run = MlflowClient(workdir["mlflow"]).get_run(trained["mlflow_run_id"])
    assert first["mlflow_run_id"] == trained["mlflow_run_id"]
    history = MlflowClient(workdir["mlflow"]).get_metric_history(trained["mlflow_run_id"], "eval/knn_top1")
    assert sorted(m.step for m in history) == [2, 3, 3]  # the run's own evaluations, then the job's
    latest = max(history, key=lambda m: (m.step, m.timestamp))
    assert (latest.step, latest.value) == (3, pytest.approx(first["eval/knn_top1"]))
    assert run.data.tags[eval_job.TAG_EVAL + "default"] == trained["checkpoint_path"]
    # a second evaluation of the checkpoint (given as its directory) under the same protocol encodes nothing; as
    # the command runs it (the run's recorded config, the overrides on top), saying what it runs
    capsys.readouterr()
    assert eval_job.main(cfg, trained["checkpoint_path"], overrides=["trainer.num_workers=2", *PROBE]) == 0
    out = capsys.readouterr().out
    assert f"{trained['checkpoint_path']} (step 3), eval.protocol=default: probes knn, linear, 2 worker(s)" in out
    assert "0 samples encoded" in out
    shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(first.items()) if k.startswith("eval/"))
    assert shown in out.splitlines()


def test_a_training_runs_own_long_evaluation_trips_nothing(trained):
    """`trained` evaluates itself after step 2 (eval.every=3, not a report step) and after step 3, each evaluation
    longer than the collective time-out. Rank 0 alone evaluating after step 2 while rank 1 waits in step 3's
    all-reduce would fail here (checked once by hand: gloo's time-out after 5 s); on every rank it does not."""
    assert trained["steps_done"] == 4 and 0.0 <= trained["eval/knn_top1"] <= 1.0


def test_bad_targets_fail_before_ray_starts(tmp_path, tiny, trained):
    cfg = tiny()
    (tmp_path / "empty").mkdir()
    for target, expected in [(tmp_path / "missing", "no such directory"),
                             (tmp_path / "empty", "no checkpoint in it"),
                             ("s3://", "cannot open it")]:
        with pytest.raises(ConfigError, match=expected):
            eval_job.prepare(cfg, str(target))
    with pytest.raises(ConfigError, match="does not fit"):  # another model than the one trained
        eval_job.prepare(tiny("scenario.backbone.preset=small"), trained["run_dir"])
    images = tmp_path / "videos"  # a `path label` list of videos under DINO's (image) protocol
    images.mkdir()
    (images / "train.csv").write_text("a.mp4 0\n")
    (images / "val.csv").write_text("b.mp4 1\n")
    with pytest.raises(ConfigError, match="DINO's protocol is defined on images"):
        eval_job.prepare(tiny("eval.protocol=dino", f"eval.dataset={images}"), trained["run_dir"])


def test_a_torn_checkpoint_is_named(tmp_path, trained):
    target = resolve(trained["run_dir"])
    torn = tmp_path / Path(target.checkpoint).name
    torn.mkdir()
    meta = json.loads((Path(target.checkpoint) / "meta.json").read_text())
    (torn / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="incomplete"):
        resolve(str(torn))


def test_a_run_records_its_config_where_eval_starts_from_it(trained):
    """`fit` writes the run's resolved config into raystream_run.json when it starts: `raystream eval` of the run
    gets its overrides (2 workers, 4 steps) without their being typed again."""
    from raystream.train.eval_target import run_config

    cfg, line = run_config(resolve(trained["run_dir"]), ["eval.max_probe_samples=5"])
    assert cfg.trainer.num_workers == 2 and cfg.trainer.max_steps == 4 and cfg.eval.max_probe_samples == 5
    assert f"recorded in {trained['run_dir']}/raystream_run.json" in line


def test_a_run_in_a_bucket_resolves_and_keeps_its_features_there(tmp_path, trained, tiny, monkeypatch):
    """No Ray: the target `s3://.../<run>` names its newest checkpoint and MLflow run, and the stored features
    are written and read back in the bucket."""
    import torch

    from local_cloud import local_s3
    from raystream.train.eval_target import features_uri
    from raystream.train.evaluator import StoredFeatures

    run_dir = Path(trained["run_dir"])
    with local_s3(tmp_path) as s3:
        for k, v in s3.env.items():
            monkeypatch.setenv(k, v)
        client = s3.client()
        for f in run_dir.rglob("*"):
            if f.is_file() and (f.name == "raystream_run.json" or f.parent.name.startswith("checkpoint_")):
                client.upload_file(str(f), s3.bucket, f"runs/evaled/{f.relative_to(run_dir)}")
        target = resolve(f"s3://{s3.bucket}/runs/evaled/")
        assert target.checkpoint == f"s3://{s3.bucket}/runs/evaled/{Path(trained['checkpoint_path']).name}"
        assert target.mlflow_run_id == trained["mlflow_run_id"] and target.step == 3
        uri = features_uri(target, tiny())
        assert uri.startswith(f"s3://{s3.bucket}/runs/evaled/eval_features/checkpoint_")
        saved = {"train_features": torch.ones(3, 2), "train_tokens": None, "test_features": torch.zeros(2, 2),
                 "test_tokens": None}
        assert StoredFeatures(uri, 0).load() is None
        StoredFeatures(uri, 0).save(saved, 5)
        back = StoredFeatures(uri, 1).load()
        assert torch.equal(back["train_features"], saved["train_features"]) and back["train_tokens"] is None
