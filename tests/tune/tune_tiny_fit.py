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
from omegaconf import OmegaConf
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


def fit(cfg, *, run_name=None, callbacks=None, mlflow_parent_run_id=None, mlflow_tags=None):
    uri = cfg.mlflow.tracking_uri
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(cfg.mlflow.experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(cfg.mlflow.experiment)
    tags = dict(mlflow_tags or {})
    if mlflow_parent_run_id:
        tags["mlflow.parentRunId"] = mlflow_parent_run_id
    run = client.create_run(exp_id, run_name=tags.pop("mlflow.runName", run_name), tags=tags)  # as start_run
    rid = run.info.run_id
    client.log_batch(rid, params=[mlflow.entities.Param(k, str(v)[:500]) for k, v in flatten(cfg).items()])
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


def fit_failing_before_its_run(cfg, **kwargs):
    """`fit` for optimizer.name=sgd fails before any MLflow run exists (as a bad video does in preflight)."""
    if cfg.optimizer.name == "sgd":
        raise ValueError(f"cannot start: optimizer.name = {cfg.optimizer.name} (test)")
    return fit(cfg, **kwargs)
