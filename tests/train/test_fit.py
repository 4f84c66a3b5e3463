"""Ray Train end to end on a real local Ray cluster (2 CPUs), tiny VideoMAE on the demo stream, real MLflow (sqlite).

Three runs (6 steps of a global batch of 4, checkpoints every 2 steps), kept few because each Ray Train run costs
a controller and a worker group:
    single  1 worker  x 4 clips; the worker raises once before step 2 (fail_at_step) and Ray Train
            restarts it from the step-2 checkpoint (so step 2 is logged by the restarted attempt only)
    ddp     2 workers x 2 clips, uninterrupted, knn probe every 3 steps: the reference the others must equal
    killed  `raystream train` in a subprocess (1 worker) with a slow Ray Train controller, interrupted (SIGINT) while
            paused before step 4 (RAYSTREAM_PAUSE_AT_STEP), its second checkpoint complete on storage and not yet
            registered by the controller; then the same run name again in-process: resumes at that checkpoint, and
            ends equal to `single`
"""

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from cli_driver import train_process, wait_for
from raystream.config import ConfigError
from raystream.tracking import client as make_client
from raystream.train import checkpoint
from raystream.train.faults import Faults
from raystream.train.run import RunOptions, fit

pytestmark = pytest.mark.slow

STEPS = 6


def params_of(result) -> dict:
    return torch.load(Path(result["checkpoint_path"]) / "model.pt", weights_only=True)


def initial_params(cfg) -> dict:
    from raystream.models import build_scenario

    return {k: v.detach().clone() for k, v in
            build_scenario(cfg.scenario, cfg.stream, seed=int(cfg.trainer.seed)).model.state_dict().items()}


def assert_same_params(a: dict, b: dict, atol: float, start: dict = None, of_movement: float = None) -> None:
    """max |a - b| <= atol and, given the initial parameters, <= `of_movement` x how far training moved them."""
    assert a.keys() == b.keys()
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    print(f"max |param difference| = {worst:.3g}")
    assert worst <= atol, f"parameters differ by up to {worst:g} (> {atol:g})"
    if start is not None:
        moved = max((a[k].float() - start[k].float()).abs().max().item() for k in a)
        print(f"max |param movement| = {moved:.3g}")
        assert worst <= of_movement * moved, f"difference {worst:g} > {of_movement} x movement {moved:g}"


def steps_logged(workdir, run_id: str, key: str = "loss") -> list:
    client = make_client(workdir["mlflow"])
    return sorted(m.step for m in client.get_metric_history(run_id, key))


@pytest.fixture(scope="module")
def single(ray_cluster, tiny):
    return fit(tiny("trainer.num_workers=1"), run_name="single",
               options=RunOptions(step_hooks=Faults(fail_at_step=2, fail_rank=0)))


@pytest.fixture(scope="module")
def ddp(ray_cluster, tiny):
    # system metrics every 0.5 s, and steps of at least 0.5 s (step_delay_s), so that the node's monitor
    # samples several times however fast the machine is (a CI run once saw a single sample)
    cfg = tiny("trainer.num_workers=2", "eval.metrics=[knn]", "eval.every=3", "eval.max_probe_samples=40",
               "mlflow.system_metrics_interval_s=0.5")
    return fit(cfg, run_name="ddp", mlflow_tags={"purpose": "test"},
               options=RunOptions(step_hooks=Faults(step_delay_s=0.5)))


def test_one_worker_with_a_restart_matches_two_uninterrupted_workers(single, ddp, tiny, workdir):
    assert single["steps_done"] == ddp["steps_done"] == STEPS
    # 1 x 4 clips vs 2 x 2 clips (DDP): the same global gradient, so the same parameters up to float rounding
    # (Adam's normalisation makes that ~1e-5 here); and the 1-worker run was killed before step 2 and restarted
    # from its checkpoint at step 2 on top of that. A restore that lost the optimizer state or the stream position moves
    # the parameters by a sizeable fraction of how far 6 steps move them at all.
    assert_same_params(params_of(single), params_of(ddp), atol=1e-4, start=initial_params(tiny()), of_movement=0.02)
    client = make_client(workdir["mlflow"])
    losses = [[m.value for m in sorted(client.get_metric_history(r["mlflow_run_id"], "loss"), key=lambda m: m.step)]
              for r in (single, ddp)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)  # step by step, including those after the restart
    assert single["eval/loss_in_stream"] == pytest.approx(ddp["eval/loss_in_stream"], rel=1e-4)


def test_fault_injection_restarts_from_checkpoint_and_logs_each_step_once(single, ddp, workdir):
    assert (Path(workdir["storage"]) / "single" / ".fault_injected_step2").is_file()
    assert single["start_step"] == 2  # the restarted attempt began at the checkpoint written after 2 steps
    for key in ("loss", "lr", "wd", "grad_norm"):
        assert steps_logged(workdir, single["mlflow_run_id"], key) == list(range(STEPS)), key
    # step 2, the first after the restore, has its cosine with step 1's gradient (kept in the checkpoint), and the
    # same one as the uninterrupted run
    assert steps_logged(workdir, single["mlflow_run_id"], "grad_cos_prev") == list(range(1, STEPS))
    client = make_client(workdir["mlflow"])
    cosines = [[m.value for m in sorted(client.get_metric_history(r["mlflow_run_id"], "grad_cos_prev"),
                                        key=lambda m: m.step)] for r in (single, ddp)]
    assert cosines[0] == pytest.approx(cosines[1], abs=1e-3)
    run = make_client(workdir["mlflow"]).get_run(single["mlflow_run_id"])
    assert run.info.status == "FINISHED"


def test_drift_after_a_restart_is_measured_from_the_run_start(single, ddp, tiny, workdir):
    """drift/params (raystream/train/drift.py) at the end of the restarted run equals the hand computation from the
    seeded start to its final weights, and the uninterrupted run's; the ddp run logs it beside each evaluation."""
    from raystream.models import build_scenario

    cfg = tiny()
    trained = [n for n, p in build_scenario(cfg.scenario, cfg.stream, seed=int(cfg.trainer.seed)).model
               .named_parameters() if p.requires_grad]
    start, end = initial_params(cfg), params_of(single)
    moved = sum(float((end[k].double() - start[k].double()).square().sum()) for k in trained) ** 0.5
    hand = moved / sum(float(start[k].double().square().sum()) for k in trained) ** 0.5
    assert single["drift/params"] == pytest.approx(hand, rel=1e-6)
    assert single["drift/params"] == pytest.approx(ddp["drift/params"], rel=1e-3)
    assert steps_logged(workdir, ddp["mlflow_run_id"], "drift/params") == \
        steps_logged(workdir, ddp["mlflow_run_id"], "eval/knn_top1") == [2, 5]


def test_mlflow_run_holds_params_metrics_and_artifacts(ddp, workdir):
    client = make_client(workdir["mlflow"])
    run = client.get_run(ddp["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "ddp"
    assert run.data.tags["purpose"] == "test" and run.data.tags["raystream.run_dir"].endswith("/ddp")
    params = run.data.params
    assert params["trainer.num_workers"] == "2" and params["optimizer.name"] == "orthogonal_adamw"
    assert params["stream.batch_size"] == "4" and params["trainer.run_name"] == "ddp"
    for key in ("loss", "lr", "grad_norm", "clips_per_s", "update_norm_ratio"):
        assert steps_logged(workdir, run.info.run_id, key) == list(range(STEPS)), key
    for key in ("grad_cos_prev", "grad_cos_ema"):  # undefined at step 0
        assert steps_logged(workdir, run.info.run_id, key) == list(range(1, STEPS)), key
    assert steps_logged(workdir, run.info.run_id, "eval/knn_top1") == [2, 5]  # every 3 steps, and at the end
    assert 0.0 <= ddp["eval/knn_top1"] <= 1.0
    assert run.data.metrics["eval/loss_in_stream"] == pytest.approx(ddp["eval/loss_in_stream"])
    lrs = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "lr"), key=lambda m: m.step)]
    assert lrs[0] == pytest.approx(5e-4) and lrs[1] == pytest.approx(1e-3) and lrs[-1] < lrs[2]  # warm-up, cosine
    wds = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "wd"), key=lambda m: m.step)]
    assert wds[0] == pytest.approx(0.05) and wds[-1] == pytest.approx(0.5) and wds == sorted(wds)  # 0.05 -> 0.5
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"config.yaml", "plots"}  # the checkpoint is a LoggedModel of the run (below)
    assert {a.path for a in client.list_artifacts(run.info.run_id, "plots")} == {
        "plots/grad_cosine.png", "plots/grad_cosine_hist.png"}
    models = {m.name: client.get_logged_model(m.model_id) for m in client.search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'")}
    final = models.pop("ddp")
    assert str(final.status) == "READY" and final.tags["raystream.step"] == str(STEPS - 1)
    assert ("eval/knn_top1", STEPS - 1) in {(m.key, m.step) for m in final.metrics}
    for name, kept in models.items():  # a kept checkpoint an evaluation was made at (step 2)
        assert name == f"ddp-step{kept.tags['raystream.step']}" and any(m.key == "eval/knn_top1" for m in kept.metrics)
    assert [(o.model_id, o.step) for o in run.outputs.model_outputs if o.model_id == final.model_id] == [
        (final.model_id, STEPS - 1)]
    assert {"MLmodel", "data", "raystream"} <= {a.path for a in client.list_logged_model_artifacts(final.model_id)}
    config_yaml = Path(client.download_artifacts(run.info.run_id, "config.yaml", str(workdir["dir"]))).read_text()
    assert "run_name: ddp" in config_yaml and "batch_size: 4" in config_yaml


def test_a_run_starts_from_a_logged_model_and_registers_its_own(ddp, tiny, workdir):
    """`scenario.backbone.init=models:/<model_id>` (the ddp run's final LoggedModel) loads in the workers from the
    tracking server (the node cache), and `fit(register=...)` (pretrain-start's path) makes the run's final model a
    registered version with an alias, which a third config names as `models:/<name>@<alias>` (issue 62)."""
    from raystream.train.preflight import check_backbone_init

    client = make_client(workdir["mlflow"])
    (final,) = [m for m in client.search_logged_models(
        [client.get_run(ddp["mlflow_run_id"]).info.experiment_id],
        filter_string=f"source_run_id = '{ddp['mlflow_run_id']}'") if m.name == "ddp"]
    cfg = tiny("trainer.num_workers=1", "trainer.max_steps=2", f"scenario.backbone.init=models:/{final.model_id}")
    got = fit(cfg, run_name="from_model", options=RunOptions(register={"name": "raystream-test-start", "alias": "s3"}))
    assert final.model_id in client.get_run(got["mlflow_run_id"]).data.tags["raystream.init"]
    version = client.get_model_version_by_alias("raystream-test-start", "s3")
    assert version.run_id == got["mlflow_run_id"]
    again = tiny("scenario.backbone.init=models:/raystream-test-start@s3")
    assert "into the model" in check_backbone_init(again, say=False)


def test_the_node_logs_its_cpu_memory_and_network_once_per_sample(ddp, workdir):
    """MLflow system metrics (raystream/train/node_metrics.py), on in the ddp run: one process per node samples."""
    client = make_client(workdir["mlflow"])
    run_id = ddp["mlflow_run_id"]
    keys = {k for k in client.get_run(run_id).data.metrics if k.startswith("system/")}
    for key in ("system/cpu_utilization_percentage", "system/system_memory_usage_megabytes",
                "system/system_memory_usage_percentage", "system/network_receive_megabytes",
                "system/network_transmit_megabytes"):
        assert key in keys, f"{key} not logged; system metrics: {sorted(keys)}"
    assert not any(k.startswith("system/node_") for k in keys), sorted(keys)  # one node: MLflow's plain names
    steps = sorted(m.step for m in client.get_metric_history(run_id, "system/cpu_utilization_percentage"))
    # Two monitors (one per worker) would each log steps 0, 1, ...: one per node logs each step once.
    assert len(steps) >= 2 and steps == list(range(len(steps))), steps
    memory = client.get_metric_history(run_id, "system/system_memory_usage_megabytes")
    assert all(m.value > 0 for m in memory), [m.value for m in memory]


def _local(run_dir: Path):
    import pyarrow.fs

    return pyarrow.fs.LocalFileSystem(), str(run_dir)


def test_checkpoints_keep_last_k_and_hold_the_stream_state(ddp):
    run_dir = Path(ddp["run_dir"])
    assert sorted(p.name for p in run_dir.glob("checkpoint_0*")) == ["checkpoint_00000004", "checkpoint_00000006"]
    ckpt = Path(ddp["checkpoint_path"])
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["next_step"] == STEPS and meta["stream"]["step"] == STEPS and meta["finished"]
    assert meta["mlflow_run_id"] == ddp["mlflow_run_id"] and meta["world_size"] == 2
    state = torch.load(ckpt / "train_state.pt", weights_only=True)
    assert any("orth_ema" in s for s in state["optimizer"]["state"].values()), "no orthogonal EMA in the checkpoint"
    assert "rng" in state and "scheduler" not in state  # the lr is a function of the step: nothing to keep
    assert len(state["diagnostics"]["prev_grads"]) == len(state["optimizer"]["state"])  # grad_cos_prev's g_{t-1}
    assert checkpoint.latest(*_local(run_dir))[0] == str(ckpt)


def test_interrupted_run_resumes_from_newest_complete_checkpoint(ray_cluster, tiny, tiny_overrides, single,
                                                                 workdir):
    """Ctrl-C: exit 130 with the resume command, MLflow run KILLED. The re-run resumes at the newest complete
    checkpoint on storage although Ray Train's record names an older one (issue 12 item 8: 'resuming at step 10'
    with checkpoints 20 and 30 on disk), and keeps `trainer.keep_checkpoints` of them."""
    overrides = tiny_overrides("trainer.num_workers=1", "trainer.run_name=killed")
    # The controller polls the workers every 8 s, so it registers checkpoints long after they are on storage. The
    # run pauses before step 4, its second checkpoint just written, and is interrupted there (the pause never ends).
    paused = workdir["dir"] / "killed.paused"
    env = {**os.environ, "RAY_ADDRESS": ray_cluster, "RAYSTREAM_PAUSE_AT_STEP": "4",
           "RAYSTREAM_PAUSE_FILE": str(paused), "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "8"}
    env.pop("RAYSTREAM_FAIL_AT_STEP", None)
    run_dir = Path(workdir["storage"]) / "killed"
    err = workdir["dir"] / "killed.stderr"
    with train_process(overrides, env, workdir["dir"], err) as driver:
        wait_for(driver, err, paused.exists, 150, "no pause before step 4")
        assert checkpoint.latest(*_local(run_dir))[1]["next_step"] == 4, "the second checkpoint is not complete"
        driver.send_signal(signal.SIGINT)
        assert driver.wait(timeout=90) == 130, err.read_text()
    # Ray's record (checkpoint_manager_snapshot.json) names checkpoint 2 at best here: its controller had not polled
    # since checkpoint 4 reached storage.
    message = err.read_text()
    assert "interrupted" in message and "trainer.run_name=killed" in message and "raystream train " in message
    first_id = json.loads((run_dir / "raystream_run.json").read_text())["mlflow_run_id"]
    assert make_client(workdir["mlflow"]).get_run(first_id).info.status == "KILLED"

    resumed = fit(tiny("trainer.num_workers=1"), run_name="killed")
    assert resumed["start_step"] == 4
    assert resumed["mlflow_run_id"] == first_id  # the same MLflow run continues
    assert steps_logged(workdir, first_id) == list(range(STEPS))
    assert steps_logged(workdir, first_id, "grad_cos_prev") == list(range(1, STEPS))
    assert_same_params(params_of(resumed), params_of(single), atol=1e-6)
    kept = sorted(p.name for p in run_dir.glob("checkpoint_0*"))
    assert len(kept) <= 2 and kept[-1] == "checkpoint_00000006", kept


def test_resume_into_a_missing_mlflow_run_says_so(ray_cluster, tiny, single, workdir, capfd):
    """The run's MLflow store is gone (mlflow.db deleted): the resume warns, and tags the new MLflow run."""
    other = f"sqlite:///{workdir['dir'] / 'fresh-mlflow.db'}"
    result = fit(tiny("trainer.num_workers=1", f"mlflow.tracking_uri={other}"), run_name="single")
    assert result["mlflow_run_id"] != single["mlflow_run_id"] and result["start_step"] == STEPS
    warning = capfd.readouterr().err
    assert "WARNING" in warning and single["mlflow_run_id"] in warning and f"step {STEPS}" in warning
    tags = make_client(other).get_run(result["mlflow_run_id"]).data.tags
    assert single["mlflow_run_id"] in tags["raystream.warning"]
    # a finished run re-run: its final checkpoint stays the result, and only keep_checkpoints remain
    assert Path(result["checkpoint_path"]).name == "checkpoint_00000006"
    assert len(list(Path(result["run_dir"]).glob("checkpoint_0*"))) <= 2


def test_preflight_fails_before_any_worker_starts(ray_cluster, tiny, workdir):
    with pytest.raises(ConfigError, match="trainer.num_workers` = 4"):
        fit(tiny("trainer.num_workers=4"), run_name="too-many")
    with pytest.raises(ConfigError, match="trainer.use_gpu"):
        fit(tiny("trainer.use_gpu=true"), run_name="no-gpu")
    cfg = tiny("trainer.num_workers=2")
    cfg.trainer.num_workers = 3  # as a Tune search space might set it
    with pytest.raises(ConfigError, match="not divisible"):
        fit(cfg, run_name="indivisible")
    for name in ("too-many", "no-gpu", "indivisible"):
        assert not (Path(workdir["storage"]) / name).exists()


def test_a_torn_registered_checkpoint_is_written_again_and_pruned_once(ray_cluster, tiny, tiny_overrides, workdir,
                                                                       capfd):
    """Issue 34 item 7, as a user meets it: a run stopped after its checkpoint 6 was written and registered by Ray
    Train, that checkpoint's train_state.pt then cut to half. The re-run warns, resumes from checkpoint 4 and writes
    checkpoint 6 again; Ray Train's record keeps one entry for it, so the prunes at 8, 10 and 12
    (`keep_checkpoints` 2) delete each directory once, and the run ends (it failed with `FileNotFoundError: Path not
    found .../checkpoint_00000006` when Ray listed the directory twice)."""
    extra = ("trainer.num_workers=1", "trainer.max_steps=12")
    paused = workdir["dir"] / "torn.paused"
    env = {**os.environ, "RAY_ADDRESS": ray_cluster, "RAYSTREAM_PAUSE_AT_STEP": "7",
           "RAYSTREAM_PAUSE_FILE": str(paused)}
    env.pop("RAYSTREAM_FAIL_AT_STEP", None)
    run_dir = Path(workdir["storage"]) / "torn"
    snapshot = run_dir / "checkpoint_manager_snapshot.json"
    err = workdir["dir"] / "torn.stderr"
    with train_process(tiny_overrides(*extra, "trainer.run_name=torn"), env, workdir["dir"], err) as driver:
        wait_for(driver, err, lambda: paused.exists() and snapshot.exists()
                 and "checkpoint_00000006" in snapshot.read_text(), 150, "checkpoint 6 registered, paused at 7")
        driver.send_signal(signal.SIGINT)
        assert driver.wait(timeout=90) == 130, err.read_text()
    state = run_dir / "checkpoint_00000006" / checkpoint.STATE_FILE
    state.write_bytes(state.read_bytes()[:state.stat().st_size // 2])
    capfd.readouterr()

    resumed = fit(tiny(*extra), run_name="torn")
    warned = capfd.readouterr().err
    assert "skipping torn checkpoint" in warned and "checkpoint_00000006" in warned, warned
    assert resumed["start_step"] == 4 and resumed["steps_done"] == 12
    kept = sorted(p.name for p in run_dir.glob("checkpoint_0*"))
    assert kept == ["checkpoint_00000010", "checkpoint_00000012"], kept
    assert checkpoint.latest(*_local(run_dir))[1]["next_step"] == 12
