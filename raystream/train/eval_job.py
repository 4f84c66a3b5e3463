"""`raystream eval <run dir | checkpoint dir | s3 URI> <overrides>`: the probes of a checkpoint as a Ray Train job
of its own, on every worker.

On the driver, before Ray starts (`prepare`): the target is resolved (`eval_target.resolve`), the config is the
training run's own recorded one with the command's overrides on top (`run_config`, said in one line), the config
checked, the probe set listed (exit 2 naming what was looked for when it cannot be) and checked against the protocol
(`eval.protocol=dino` is DINO's protocol on an image set: a set of videos is refused), and the checkpoint's model read
and checked against the configured scenario. An `eval.protocol` other than the run's brings that protocol's own probes
unless the command sets `eval.metrics` (`eval_target.run_config`); what runs is said in one line (`what_runs`).
Then a `TorchTrainer` of `trainer.num_workers` workers
(`eval_loop_per_worker`) loads the checkpoint on each worker's device, and every worker runs the evaluation
(`Evaluator`): its part of the probe set encoded (bf16 autocast on GPU), the features gathered, the probes trained
data-parallel. The features go to `<run dir>/eval_features/` (keyed by checkpoint, protocol and probe set): a second
evaluation of the same checkpoint and protocol encodes nothing.

The metrics go into the training run's MLflow run (at the checkpoint's last step, tagged
`raystream.eval.<protocol>` = the checkpoint) when the run directory names one the tracking store holds;
otherwise into a new MLflow run named `eval-<protocol>` in `mlflow.experiment`.
"""

from __future__ import annotations

import io
import sys
import time
from typing import Any, Dict, Optional, Sequence, Union

import ray.train
import ray.train.torch
import torch
from omegaconf import DictConfig, OmegaConf
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from raystream.config import ConfigError, check
from raystream.data import DataError
from raystream.eval.loaders import check_probe_set
from raystream.eval.probe_sets import list_probe_set
from raystream.eval.shard import Shard
from raystream.models import build_scenario
from raystream.models.checkpoint import CheckpointError, _check_fit
from raystream.tracking import names
from raystream.tracking.store import client as client_for
from raystream.tracking.store import end_run, prepare_store, retry, start_run, tracking_uri
from raystream.train import storage as results
from raystream.train.capacity import cluster_capacity
from raystream.train.checkpoint import MODEL_FILE
from raystream.train.eval_target import EvalTarget, features_uri, instead, resolve, run_config
from raystream.train.evaluator import Evaluator, StoredFeatures
from raystream.train.model_uri import fetched
from raystream.train.worker import typed_config
from raystream.train.preflight import check_local_cpus, check_resources
from raystream.train.ray_start import start_ray
from raystream.train.run import collective_config
from raystream.uris import filesystem_at, read_bytes

TAG_EVAL = "raystream.eval."  # + protocol: the checkpoint a `raystream eval` evaluated, on the training run


def check_protocol_fits(cfg) -> None:
    """`eval.protocol=dino` on a published set of videos (SSv2, `path label` lists) is a ConfigError: DINO's
    protocol (resize 256, centre crop 224, the linear probe's crops) is defined on images (an ImageFolder)."""
    if cfg.eval.dataset is None or str(cfg.eval.protocol) != "dino":
        return
    listing = list_probe_set(str(cfg.eval.dataset))
    if listing is not None and listing.kind != "images":
        raise ConfigError(f"config key `eval.protocol` = 'dino' with `eval.dataset` = {cfg.eval.dataset!r}, a set "
                          f"of {listing.kind}: DINO's protocol is defined on images (an ImageFolder root with "
                          "train/<class>/ and val/<class>/); use eval.protocol=vjepa (or default) for videos")


def check_model_fits(cfg, target: EvalTarget) -> None:
    """The checkpoint's model.pt has the keys and shapes of the configured scenario's model (built on the meta
    device); ConfigError naming both otherwise."""
    try:
        state = read_model_state(target.checkpoint)
    except Exception as exc:  # a torn or foreign model.pt: pickle, zip or torch errors, whichever the bytes give
        fs, path = filesystem_at(target.checkpoint)
        scheme = target.checkpoint.partition("://")[0] if "://" in target.checkpoint else None
        raise ConfigError(f"{target.checkpoint}/{MODEL_FILE} cannot be read ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}); "
                          f"{instead(fs, path.rsplit('/', 1)[0], path, scheme)}") from None
    with torch.device("meta"):
        model = build_scenario(fetched(cfg.scenario), cfg.stream, int(cfg.trainer.seed)).model
    try:
        _check_fit(model, state, target.checkpoint, f"scenario {cfg.scenario.name}'s model")
    except CheckpointError as exc:
        raise ConfigError(f"{exc}. `raystream eval` takes the training run's recorded config: override "
                          "scenario.* only to match the checkpoint") from None


def read_model_state(checkpoint: str) -> Dict[str, Any]:
    """model.pt of a checkpoint directory (local path or URI), on the CPU."""
    fs, path = filesystem_at(checkpoint)
    return torch.load(io.BytesIO(read_bytes(fs, f"{path}/{MODEL_FILE}")), map_location="cpu", weights_only=True)


def what_runs(cfg) -> str:
    """The evaluations the job runs, in words: the probes of `eval.metrics` for a scenario whose features are
    probed, the held-out pixel error for one that predicts pixels (the scenario's `needs`)."""
    with torch.device("meta"):
        needs = build_scenario(fetched(cfg.scenario), cfg.stream, int(cfg.trainer.seed)).needs
    done = []
    if "probe" in needs:
        metrics = [str(m) for m in cfg.eval.metrics]
        done.append(f"probes {', '.join(metrics)}" if metrics else "no probe (eval.metrics=[])")
    if "heldout" in needs:
        done.append(f"held-out pixel error ({cfg.eval.heldout_batches} batches)")
    return " and ".join(done) or "nothing"


def prepare(cfg: DictConfig, target: Union[str, EvalTarget]) -> EvalTarget:
    """Every check of `raystream eval` that needs no Ray (module docstring); the resolved target."""
    target = resolve(target) if isinstance(target, str) else target
    check(cfg)
    if cfg.eval.dataset is not None:
        check_probe_set(str(cfg.eval.dataset))
    check_protocol_fits(cfg)
    check_model_fits(cfg, target)
    return target


def eval_loop_per_worker(config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Ray Train entry point of `raystream eval`: this worker's part of the evaluation. Returns (rank 0) the
    metrics, `extracted` (samples encoded for the stored features; 0 when reused) and `seconds`."""
    cfg = typed_config(config["cfg"])
    job = config["job"]
    torch.set_num_threads(max(1, int(cfg.trainer.cpus_per_worker)))
    rank = ray.train.get_context().get_world_rank()
    device = ray.train.torch.get_device()
    scenario = build_scenario(fetched(cfg.scenario), cfg.stream, seed=int(cfg.trainer.seed))
    scenario.model.load_state_dict(read_model_state(job["checkpoint"]))
    scenario.model.to(device)
    cache = StoredFeatures(job["features"], rank)
    start = time.perf_counter()
    evaluator = Evaluator(cfg, scenario, Shard.current(), cache, hooks=job["hooks"])
    try:
        metrics = evaluator(scenario.model)
    finally:
        evaluator.close()
    if rank != 0:
        return None
    return {**metrics, "extracted": cache.extracted, "seconds": time.perf_counter() - start}


def run(cfg: DictConfig, target: EvalTarget, step_hooks: Optional[Any] = None) -> Dict[str, Any]:
    """The evaluation job of `target` (checked by `prepare`): its metrics, `extracted`, `seconds`, `mlflow_run_id`.
    `step_hooks`: faults a test injects (raystream/train/faults.py's `Faults`: `eval_delay_s`), or None."""
    tcfg = cfg.trainer
    check_local_cpus(tcfg)
    start_ray()
    check_resources(tcfg, cluster_capacity())
    protocol = str(cfg.eval.protocol)
    resources = {"CPU": float(tcfg.cpus_per_worker), **({"GPU": 1} if tcfg.use_gpu else {})}
    trainer = TorchTrainer(
        eval_loop_per_worker, torch_config=collective_config(cfg),
        train_loop_config={"cfg": OmegaConf.to_container(cfg, resolve=True),
                           "job": {"checkpoint": target.checkpoint, "features": features_uri(target, cfg),
                                   "hooks": step_hooks}},
        scaling_config=ScalingConfig(num_workers=int(tcfg.num_workers), use_gpu=bool(tcfg.use_gpu),
                                     resources_per_worker=resources),
        run_config=RunConfig(name=f"eval-{target.run_name}-{target.name}-{protocol}-{time.strftime('%Y%m%d-%H%M%S')}",
                             storage_path=results.uri(tcfg.storage_path)),
    )
    out = dict(trainer.fit().return_value or {})
    metrics = {k: float(v) for k, v in out.items() if k.startswith(names.EVAL_PREFIX)}
    out["mlflow_run_id"] = record(cfg, target, metrics)
    return out


def record(cfg, target: EvalTarget, metrics: Dict[str, float]) -> str:
    """Log `metrics` into the training run's MLflow run when the tracking store holds it, else into a new run
    `eval-<protocol>`; the run id."""
    from mlflow.entities import Metric  # lazy: the driver only; each Ray worker imports this module (MLflow: ~1 s)

    protocol = str(cfg.eval.protocol)
    uri = target.tracking_uri or tracking_uri(cfg)
    client = client_for(uri)
    run_id = None
    if target.mlflow_run_id:
        try:
            run = client.get_run(target.mlflow_run_id)
            run_id = run.info.run_id if run.info.lifecycle_stage == "active" else None
        except Exception:
            run_id = None
        if run_id is None:
            print(f"raystream eval: the training run's MLflow run {target.mlflow_run_id} is not in {uri}: the "
                  f"results go to a new run eval-{protocol}", file=sys.stderr, flush=True)
    created = run_id is None
    if created:
        uri = tracking_uri(cfg)
        client = client_for(uri)
        run_id = start_run(client, experiment=cfg.mlflow.experiment, uri=uri, run_name=f"eval-{protocol}",
                           tags={names.TAG_RUN_DIR: target.run_dir})
    now = int(time.time() * 1000)
    batch = [Metric(k, v, now, max(target.step, 0)) for k, v in sorted(metrics.items())]
    retry(lambda: client.log_batch(run_id, metrics=batch), "log evaluation")
    retry(lambda: client.set_tag(run_id, TAG_EVAL + protocol, target.checkpoint), "tag run")
    if created:
        end_run(client, run_id)
    return run_id


def main(cfg: DictConfig, target_text: str, overrides: Optional[Sequence[str]] = None,
         step_hooks: Optional[Any] = None) -> int:
    """`raystream eval`: exit 0, 1 (the job failed) or 2 (bad target, config, probe set or tracking store: nothing
    ran; the store is created only once the rest is checked). `overrides` (the command's): the config is the
    training run's recorded one with them on top; None: `cfg` as it is. `step_hooks`: as `run`'s."""
    try:
        target = resolve(target_text)
        if overrides is not None:
            cfg, line = run_config(target, overrides)
            print(line, file=sys.stderr, flush=True)
        target = prepare(cfg, target)
    except (ConfigError, DataError) as exc:
        print(f"raystream eval: {exc}", file=sys.stderr)
        return 2
    prepare_store(tracking_uri(cfg))  # TrackingStoreError: exit 2 (raystream/cli.py)
    print(f"raystream eval: {target.checkpoint} (step {target.step}), eval.protocol={cfg.eval.protocol}: "
          f"{what_runs(cfg)}, {cfg.trainer.num_workers} worker(s)", flush=True)
    try:
        out = run(cfg, target, step_hooks)
    except Exception as exc:  # ray.train.TrainingFailedError and what it wraps
        print(f"raystream eval: the evaluation failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    shown = {k: v for k, v in out.items() if k.startswith(names.EVAL_PREFIX)}
    print(", ".join(f"{k} {v:.4g}" for k, v in sorted(shown.items())))
    print(f"  features    {out.get('extracted', 0)} samples encoded ({out.get('seconds', 0.0):.1f} s of evaluation)")
    print(f"  MLflow      run {out['mlflow_run_id']}")
    return 0
