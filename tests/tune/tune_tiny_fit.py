"""A small stand-in with the signature of `raystream.train.run.fit`, so the tune layer's tests (search space,
resume, failures, ASHA) run real Ray Train runs and real MLflow runs in seconds, without the video pipeline.

It follows the contract of the real one: one TorchTrainer run named `run_name` under `trainer.storage_path`,
`callbacks` passed to Ray Train, an MLflow child run under `mlflow_parent_run_id` with `mlflow_tags`, per-step
metrics `loss` and `grad_cos_prev`, final `eval/*` metrics, and a dict of final metrics incl. `mlflow_run_id`.
The model: a linear regression on a fixed batch trained with the configured lr; lr > 1 diverges and the run
fails with a NaN loss, like a real divergent trial. `trainer.max_steps` steps; `trainer.log_every` is the delay
between steps in ms (so ASHA tests can make trials last).
"""

from __future__ import annotations

import math
import time

import mlflow
import ray.train
import torch
from mlflow import MlflowClient
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from raystream.config import flatten


def _loop(config):
    torch.manual_seed(config["seed"])
    x = torch.randn(64, 8)
    y = x @ torch.arange(8.0) + 0.1 * torch.randn(64)
    w = torch.zeros(8, requires_grad=True)
    opt = torch.optim.SGD([w], lr=config["lr"])
    client = MlflowClient(config["uri"])
    rank0 = ray.train.get_context().get_world_rank() == 0
    prev = None
    for step in range(config["steps"]):
        loss = ((x @ w - y) ** 2).mean()
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"loss is NaN/inf at step {step} (optimizer.lr = {config['lr']})")
        opt.zero_grad()
        loss.backward()
        g = w.grad.detach().clone()
        cos = float("nan") if prev is None else float(torch.nn.functional.cosine_similarity(g, prev, dim=0))
        prev = g
        opt.step()
        if rank0:
            client.log_metric(config["run_id"], "loss", loss.item(), step=step)
            if not math.isnan(cos):
                client.log_metric(config["run_id"], "grad_cos_prev", cos, step=step)
        ray.train.report({"loss": loss.item(), "step": step})
        time.sleep(config["delay_ms"] / 1000)


def _child_run(cfg, run_name, mlflow_parent_run_id, mlflow_tags):
    """(client, run id): the trial's MLflow child run, created as `start_run` creates it, with the config's params."""
    client = MlflowClient(cfg.mlflow.tracking_uri)
    exp = client.get_experiment_by_name(cfg.mlflow.experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(cfg.mlflow.experiment)
    tags = dict(mlflow_tags or {})
    if mlflow_parent_run_id:
        tags["mlflow.parentRunId"] = mlflow_parent_run_id
    run = client.create_run(exp_id, run_name=tags.pop("mlflow.runName", run_name), tags=tags)  # as start_run
    rid = run.info.run_id
    client.log_batch(rid, params=[mlflow.entities.Param(k, str(v)[:500]) for k, v in flatten(cfg).items()])
    return client, rid


def fit(cfg, *, run_name=None, callbacks=None, mlflow_parent_run_id=None, mlflow_tags=None):
    uri = cfg.mlflow.tracking_uri
    client, rid = _child_run(cfg, run_name, mlflow_parent_run_id, mlflow_tags)
    steps = cfg.trainer.max_steps or 4
    trainer = TorchTrainer(
        _loop,
        train_loop_config={"lr": float(cfg.optimizer.lr), "steps": steps, "seed": int(cfg.trainer.seed),
                           "uri": uri, "run_id": rid, "delay_ms": int(cfg.trainer.log_every)},
        scaling_config=ScalingConfig(num_workers=cfg.trainer.num_workers),
        run_config=RunConfig(name=run_name, storage_path=cfg.trainer.storage_path, callbacks=callbacks or []),
    )
    try:
        result = trainer.fit()
    except Exception as exc:
        client.set_tag(rid, "raystream.error", str(exc)[:500])
        client.set_terminated(rid, "FAILED")
        raise
    del result  # Train V2 keeps metrics only with checkpoints; the last logged loss is in MLflow
    final = {"loss": client.get_run(rid).data.metrics["loss"],
             # A made-up eval metric that depends on the grid values, so report tables have something to show.
             "eval/knn_top1": 0.5 + (0.1 if cfg.optimizer.name == "orthogonal_adamw" else 0.0)
             + 0.01 * cfg.trainer.seed}
    for k, v in final.items():
        client.log_metric(rid, k, v)
    client.set_terminated(rid, "FINISHED")
    return {**final, "mlflow_run_id": rid}


def finish_at_once(cfg, *, run_name=None, callbacks=None, mlflow_parent_run_id=None, mlflow_tags=None):
    """A trial that finishes at once: its FINISHED child run, with a final `loss`, and no Ray Train run (for tests
    of what a trial's end does to the sweep; `fit` above is the real Train run)."""
    client, rid = _child_run(cfg, run_name, mlflow_parent_run_id, mlflow_tags)
    client.log_metric(rid, "loss", 1.0)
    client.set_terminated(rid, "FINISHED")
    return {"loss": 1.0, "mlflow_run_id": rid}


CANNOT_START = "orthogonal_sgd"  # the grid value whose trial fit_or_fail_before_its_run fails before its run


def fit_or_fail_before_its_run(cfg, *, run_name=None, callbacks=None, mlflow_parent_run_id=None, mlflow_tags=None):
    """`fit`, except that the cell optimizer.name=`CANNOT_START` fails before any MLflow run or Ray Train run
    exists (as a bad video does in preflight): one sweep has trials that train and one that fails that way."""
    if cfg.optimizer.name == CANNOT_START:
        raise ValueError(f"cannot start: optimizer.name = {cfg.optimizer.name} (test)")
    return fit(cfg, run_name=run_name, callbacks=callbacks, mlflow_parent_run_id=mlflow_parent_run_id,
               mlflow_tags=mlflow_tags)


DRIVER_PID = "driver.pid"  # in trainer.storage_path: the sweep's driver, which fit_then_sigterm_the_driver stops


def fit_then_sigterm_the_driver(cfg, *, run_name=None, callbacks=None, mlflow_parent_run_id=None, mlflow_tags=None):
    """A trial that finishes at once (its FINISHED child run, no Ray Train run) and, as it returns, sends SIGTERM to
    the sweep's driver (a job scheduler's stop arriving just as a trial ends, before Tune makes the next one)."""
    import os
    import signal
    from pathlib import Path

    out = finish_at_once(cfg, run_name=run_name, mlflow_parent_run_id=mlflow_parent_run_id, mlflow_tags=mlflow_tags)
    os.kill(int((Path(cfg.trainer.storage_path) / DRIVER_PID).read_text()), signal.SIGTERM)
    return out


OUTAGE_READY, OUTAGE_GO = "outage-ready", "outage-go"  # files in trainer.storage_path: the test's two signals


def fit_through_outage(cfg, *, run_name=None, callbacks=None, mlflow_parent_run_id=None, mlflow_tags=None):
    """`fit` whose tracking server dies mid-run and stays down, as the real one meets it: its metric values go
    through `StepLogger` into the run directory's record, and it ends with `TrackingUnavailable` carrying its
    final metrics. It writes `OUTAGE_READY` after step 0 and waits for the test's `OUTAGE_GO` (the server is down)."""
    from pathlib import Path

    from raystream.tracking import StepLogger, events, start_run
    from raystream.train.run import TrackingUnavailable, finish_run

    uri, storage = cfg.mlflow.tracking_uri, Path(cfg.trainer.storage_path)
    run_id = start_run(MlflowClient(uri), experiment=cfg.mlflow.experiment, uri=uri, run_name=run_name,
                       parent_run_id=mlflow_parent_run_id, tags=mlflow_tags)
    path = events.path_in(str(storage / run_name))
    logger = StepLogger(uri, run_id, path)
    logger.log({"loss": 1.0}, 0)
    assert logger.close(timeout_s=30) == 0, "step 0 is written while the server runs"
    (storage / OUTAGE_READY).write_text(run_id)
    deadline = time.monotonic() + 60
    while not (storage / OUTAGE_GO).exists():
        assert time.monotonic() < deadline, "the test did not stop the tracking server"
        time.sleep(0.1)
    logger = StepLogger(uri, run_id, path)
    steps = cfg.trainer.max_steps or 4
    for step in range(1, steps):
        logger.log({"loss": 1.0 / (step + 1)}, step)
    logger.close(timeout_s=1)  # the server is down: the values wait in the record
    try:
        finish_run(uri, run_id, path, [events.end(run_id, "FINISHED")])
    except TrackingUnavailable as exc:
        exc.final = {"loss": 1.0 / steps, "eval/knn_top1": 0.5, "mlflow_run_id": run_id}
        raise
    raise AssertionError("the tracking server answered; this fit is for an outage")
