"""Checks that fail on the driver, naming the key, before any worker starts."""

import pytest

from raystream.config import ConfigError, compose
from raystream.train.preflight import check_resources


def test_more_workers_than_cluster_cpus_names_the_key():
    cfg = compose(["trainer.num_workers=4", "stream.batch_size=8"])
    with pytest.raises(ConfigError, match=r"trainer.num_workers` = 4 .* needs 4 CPUs but the Ray cluster has 2"):
        check_resources(cfg.trainer, {"CPU": 2.0})
    check_resources(cfg.trainer, {"CPU": 4.0})


def test_cpus_per_worker_counts():
    cfg = compose(["trainer.num_workers=2", "trainer.cpus_per_worker=2", "stream.batch_size=8"])
    with pytest.raises(ConfigError, match="cpus_per_worker"):
        check_resources(cfg.trainer, {"CPU": 3.0})


def test_gpus_asked_for_but_missing():
    cfg = compose(["trainer.use_gpu=true"])
    with pytest.raises(ConfigError, match=r"trainer.use_gpu` = true .* needs 1 GPUs but the Ray cluster has 0"):
        check_resources(cfg.trainer, {"CPU": 8.0})
    check_resources(cfg.trainer, {"CPU": 8.0, "GPU": 1.0})


@pytest.mark.parametrize("override, key", [
    ("trainer.max_steps=0", "trainer.max_steps"),
    ("trainer.log_every=0", "trainer.log_every"),
    ("trainer.report_every=0", "trainer.report_every"),
    ("trainer.cpus_per_worker=0", "trainer.cpus_per_worker"),
    ("trainer.run_name=a/b", "trainer.run_name"),
    ("trainer.ray_log_level=LOUD", "trainer.ray_log_level"),
])
def test_trainer_ranges(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose([override])


def test_batch_not_divisible_by_workers():
    with pytest.raises(ConfigError, match=r"stream.batch_size = 4 is not divisible by the number of training "
                                          r"workers \(trainer.num_workers\) = 3"):
        compose(["stream.batch_size=4", "trainer.num_workers=3"])


def test_main_reports_bad_videos_before_ray_starts(tmp_path, capsys):
    from raystream.train.commands import main

    cfg = compose([f"data.videos={tmp_path / 'missing.mp4'}", f"trainer.storage_path={tmp_path / 'results'}",
                   f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    assert main(cfg) == 2
    err = capsys.readouterr().err
    assert "raystream train:" in err and "missing.mp4" in err
    assert not (tmp_path / "results").exists() and not (tmp_path / "mlflow.db").exists()


def test_triton_true_on_cpu_workers_fails_before_ray_starts(tmp_path, capsys):
    from raystream.train.commands import main

    cfg = compose(["optimizer.triton=true", f"trainer.storage_path={tmp_path / 'results'}",
                   f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    assert main(cfg) == 2
    err = capsys.readouterr().err
    assert ("config key `optimizer.triton` = True: expected false or auto with trainer.use_gpu=false (the fused "
            "Triton step runs on CUDA") in err
    assert not (tmp_path / "results").exists()


def test_a_local_run_asking_more_cpus_than_the_machine_fails_before_ray_starts(tmp_path):
    """No RAY_ADDRESS: the workers' CPUs are checked against this machine's before Ray starts (not 17 s after)."""
    import os
    import subprocess
    import sys

    from raystream.train.preflight import machine_cpus

    code = ("import sys; from raystream.config import compose; from raystream.train.commands import main; "
            "rc = main(compose(sys.argv[1:])); import ray; print(rc, ray.is_initialized())")
    want = machine_cpus() + 1
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYSTREAM_NO_RESOURCE_CHECK")}
    out = subprocess.run([sys.executable, "-c", code, "trainer.num_workers=1", f"trainer.cpus_per_worker={want}",
                          f"trainer.storage_path={tmp_path / 'results'}",
                          f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.stdout.split()[-2:] == ["2", "False"], out.stdout + out.stderr[-2000:]
    assert (f"`trainer.num_workers` = 1 (x `trainer.cpus_per_worker` = {want}) needs {want} CPUs but this machine "
            f"(local Ray) has {want - 1}") in out.stderr


def test_skipped_videos_are_recorded_in_the_mlflow_run(tmp_path):
    """`data.on_bad_video=skip`: the driver's stream plan lists which videos were left out and why, and the MLflow
    run holds them (a tag with their number, `skipped_videos.json` with each video and reason)."""
    import json
    import warnings

    from raystream.data.demo.videos import ensure_demo_videos
    from raystream.tracking import client as make_client
    from raystream.tracking import names, start_run
    from raystream.train.preflight import stream_plan
    from raystream.train.run import _log_skipped_videos

    good = [str(p) for p in ensure_demo_videos(compose([]).data.demo)]
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video")
    cfg = compose([f"data.videos=[{broken},{','.join(good)}]", "data.on_bad_video=skip", "eval.dataset=null"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        steps, skipped = stream_plan(cfg)
    assert steps > 0 and [v for v, _ in skipped] == [str(broken)] and skipped[0][1]

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = make_client(uri)
    run_id = start_run(client, experiment="skips", uri=uri, run_name="r")
    _log_skipped_videos(client, run_id, skipped)
    run = client.get_run(run_id)
    assert run.data.tags[names.TAG_SKIPPED_VIDEOS] == "1"
    listed = json.loads(open(client.download_artifacts(run_id, names.ARTIFACT_SKIPPED_VIDEOS, str(tmp_path))).read())
    assert listed == [{"video": str(broken), "reason": skipped[0][1]}]
