"""One raystream run as a Ray Train job. The driver's path of `raystream train <overrides>` (a Tune trial enters at 2):
 1. `cli` composes the Hydra config (`config`) and calls `main(cfg)` here, which calls `fit(cfg)`;
 2. `train.preflight` checks the config, the videos (`data`) and the start checkpoint (`models`), before Ray;
 3. `train.ray_start` starts or joins Ray, and the cluster's CPUs/GPUs are checked against the run;
 4. `tracking` opens the MLflow run, or resumes the one `<storage>/<run name>` holds (then the workers resume from
    its newest complete checkpoint);
 5. Ray Train's `TorchTrainer` runs `train.loop` on every worker: rank 0 appends each step to `<run dir>/events.jsonl`
    (mirrored into MLflow), checkpoints go to `<run dir>` (`train.checkpoint`);
 6. `fit` appends the run's end (config, plots, the checkpoints as MLflow LoggedModels, status) to the record,
    mirrors it, prunes old checkpoints. The run's videos (training, held-out, probe set) are MLflow dataset inputs,
    recorded before the workers start (train/inputs.py hands tracking/inputs.py their rows).
The driver resolves the run once (train/resolved.py: its config, videos, run directory and storage, then its MLflow
ids) and its steps take that `Run`.
A run ends FINISHED, FAILED (`raystream.error` says why; a divergence is never retried) or KILLED (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import copy
import os
import sys
from contextlib import contextmanager, suppress
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from raystream import diskspace
from raystream.config import flatten
from raystream.models.checkpoint import is_model_uri
from raystream.tracking import events, inputs, names, registry
from raystream.tracking.mirror import catch_up
from raystream.tracking.store import client as mlflow_client_for
from raystream.tracking.store import retry, start_run
from raystream.train import checkpoint as ckpt_files
from raystream.train import signals
from raystream.train.capacity import cluster_capacity
from raystream.train.divergence import raise_if_diverged
from raystream.train.inputs import video_sets
from raystream.train.lock import RunLock
from raystream.train.loop import train_loop_per_worker
from raystream.train.preflight import check_resources
from raystream.train.ray_start import start_ray
from raystream.train.resolved import Run, RunOptions, default_run_name, resolve
from raystream.train.run_end import TrackingUnavailable, close_failed, finish_run, run_end
from raystream.train.torch_backend import torch_config

__all__ = ["fit", "Run", "RunOptions", "Interrupted", "TrackingUnavailable", "default_run_name", "run_end",
           "finish_run", "collective_config", "RUN_INFO_FILE"]

RUN_INFO_FILE = "raystream_run.json"  # in the Ray Train run directory: the MLflow run to resume, the config
MAX_PARAM_LENGTH = 6000  # MLflow's limit on a param value


class Interrupted(KeyboardInterrupt):
    """The run was interrupted (Ctrl-C, or SIGTERM: Ray Train aborts its workers); its MLflow run is KILLED.
    `signal`: the signal's name."""

    def __init__(self, message: str, signal: str = "SIGINT"):
        super().__init__(message)
        self.signal = signal


def fit(cfg: DictConfig, *, run_name: Optional[str] = None, callbacks: Optional[Sequence[Any]] = None,
        mlflow_parent_run_id: Optional[str] = None, mlflow_tags: Optional[Dict[str, str]] = None,
        options: Optional[RunOptions] = None) -> Dict[str, Any]:
    """Train one run to the end (or resume it) and return its final metrics.

    `run_name` (else `trainer.run_name`, else generated) names the Ray Train run directory
    `<trainer.storage_path>/<run_name>` and the MLflow run. `callbacks`: Ray Train `UserCallback`s (Tune passes
    `ray.tune.integration.ray_train.TuneReportCallback()`), called on every `ray.train.report`.
    `mlflow_parent_run_id`, `mlflow_tags`: a sweep's trial's parent run and tags. `options` (`RunOptions`): the
    start checkpoint's line checked earlier, a test's step hooks, a registered model for the final checkpoint
    (whatever `trainer.log_checkpoint_artifact` says; null: models for a run, not for a sweep's trial).
    Returned keys: `loss` (mean over the last report window), `eval/*` (final evaluation and in-stream averages),
    `step`, `steps_done`, `start_step` (step the last attempt started at: > 0 after a restart or resume),
    `mlflow_run_id`, `run_name`, `run_dir`, `checkpoint_path`.
    Raises ConfigError / DataError before any worker starts (`RunLocked`: another process runs it); Ray's
    TrainingFailedError past `trainer.max_failures`; DivergedError / DiskFull (no retry); `Interrupted` on Ctrl-C
    or SIGTERM. The same run name and storage path resume from the newest complete checkpoint on storage (a lost
    MLflow run is said, the new one tagged `raystream.warning`); whatever stops an open run sets `raystream.error`.
    """
    # The inputs first, before Ray starts: a bad one writes nothing (no run directory, no lock).
    run = resolve(cfg, options or RunOptions(), run_name=run_name, parent_run_id=mlflow_parent_run_id,
                  tags=mlflow_tags)
    run.callbacks = list(callbacks or [])
    # One writer per run: a second `raystream train` of it refuses here (RunLocked, exit 2), before Ray starts; a
    # sweep's trial (a parent run) runs under its sweep's lock.
    lock = RunLock(run.run_dir, run.name).acquire() if not run.is_trial else None
    try:
        return _fit(run)
    finally:
        if lock is not None:
            lock.release()
            if run.run_dir.local:  # a run stopped before it wrote anything (the cluster too small) leaves no directory
                with suppress(OSError):
                    os.rmdir(run.run_dir.uri)


def _fit(run: Run) -> Dict[str, Any]:
    """`fit`'s work, under the run's lock, once its inputs are checked: Ray, the MLflow run, the workers, the end."""
    catch_up(run.record, "an earlier attempt of this run")  # first: what a killed attempt left (kill -9) into MLflow
    start_ray()  # RAY_ADDRESS when set, else a local cluster on the loopback interface
    check_resources(run.cfg.trainer, cluster_capacity())  # what the cluster can grow to (autoscaler)
    info = run.run_dir.read_json(RUN_INFO_FILE) or {}
    resume = ckpt_files.latest(run.run_dir.filesystem, run.run_dir.path)  # (path, meta) of the newest, or None
    run.opened(_open_mlflow_run(run, info), info)
    with _closed_on_failure(run.record, run.tracking_uri, run.run_id, run.name) as received:  # KILLED / FAILED
        _record_start(run, resume)
        _record_inputs(run)
        result = _trainer(run, _worker_plan(run, resume)).fit()
        signals.raise_if_signalled(received)  # SIGTERM: Ray Train aborted the run gracefully
        return _finish(run, result)


def _open_mlflow_run(run: Run, info: Dict[str, Any]) -> str:
    """The run's MLflow run id: the one its earlier attempt opened (`info`), else a new one, tagged with the run
    directory and the start checkpoint's line."""
    tags = {**run.tags, names.TAG_RUN_DIR: run.run_dir.uri}
    if run.init_line:
        tags[names.TAG_INIT] = run.init_line
    return start_run(mlflow_client_for(run.tracking_uri), experiment=run.cfg.mlflow.experiment,
                     uri=run.tracking_uri, run_name=run.name, parent_run_id=run.parent_run_id, tags=tags,
                     resume_run_id=info.get("mlflow_run_id"))


def _record_start(run: Run, resume: Optional[Tuple[str, Dict[str, Any]]]) -> None:
    """What the run says before its workers start: that a resumed run's earlier MLflow history is gone (if so), its
    run file (written at once: a run, or a sweep's trial, stopped before its first step reopens this MLflow run when
    resumed; `raystream eval` reads its config), its params, the videos `data.on_bad_video=skip` left out."""
    client = mlflow_client_for(run.tracking_uri)
    if resume is not None and run.info.get("mlflow_run_id") and run.run_id != run.info["mlflow_run_id"]:
        _warn_history_lost(client, run, int(resume[1]["next_step"]))
    run.run_dir.write_json(RUN_INFO_FILE, {"mlflow_run_id": run.run_id, "tracking_uri": run.tracking_uri,
                                           "run_name": run.name,
                                           "config": OmegaConf.to_container(run.cfg, resolve=True)})
    _log_params(client, run.run_id, flatten(run.cfg))
    if run.skipped:
        _log_skipped_videos(client, run.run_id, run.skipped)


def _record_inputs(run: Run) -> None:
    """The run's videos as MLflow dataset inputs (train/inputs.py's rows, tracking/inputs.py's events), appended
    to its record and written at once while the store answers (else rank 0's writer or the end writes them)."""
    out = events.Record(run.record)
    out.append([events.opened(run.run_id, run.tracking_uri), *inputs.input_events(run.run_id, video_sets(run.videos))])
    out.close()
    catch_up(run.record, "this run's start")


def _worker_plan(run: Run, resume: Optional[Tuple[str, Dict[str, Any]]]) -> Dict[str, Any]:
    """What the driver decided for the workers (train_loop_per_worker's `config["run"]`)."""
    hooks = run.options.step_hooks
    return {"run_name": run.name, "total_steps": run.total_steps, "tracking_uri": run.tracking_uri,
            "mlflow_run_id": run.run_id, "record": run.record,
            "resume_from": Checkpoint(resume[0], filesystem=run.run_dir.filesystem) if resume is not None else None,
            "hooks": hooks.for_run(run.run_dir.uri if run.run_dir.local else None, run.name)
            if hooks is not None else None,
            # the stream's Figure 1 figure, once per run, by the workers before step 0
            "measure_correlation": int(run.cfg.trainer.correlation_steps) > 0 and not run.info}


def _pinned_init(cfg: DictConfig, uri: str) -> DictConfig:
    """The config the workers get: a `models:/<name>@<alias>` (or version) start pinned to the model id it names
    now, so an alias moved while the run trains does not change the start of a restarted worker."""
    if not is_model_uri(cfg.scenario.backbone.init):
        return cfg
    pinned = copy.deepcopy(cfg)
    pinned.scenario.backbone.init = registry.pinned(str(cfg.scenario.backbone.init), uri)
    return pinned


def collective_config(cfg: DictConfig):
    """The TorchConfig of a job (`torch_config`: raystream's loopback set-up on a tested Ray) with
    `trainer.collective_timeout_s` as torch.distributed's time-out."""
    config = torch_config()
    config.timeout_s = int(cfg.trainer.collective_timeout_s)
    return config


def _trainer(run: Run, plan: Dict[str, Any]) -> TorchTrainer:
    """Ray Train's TorchTrainer of the run: `trainer.*` as its scaling, failure and checkpoint configs; `plan`: what
    the driver decided for the workers (`_worker_plan`)."""
    cfg = _pinned_init(run.cfg, run.tracking_uri)
    tcfg = cfg.trainer
    resources = {"CPU": float(tcfg.cpus_per_worker), **({"GPU": 1} if tcfg.use_gpu else {})}
    return TorchTrainer(
        train_loop_per_worker, torch_config=collective_config(cfg),  # one node: on 127.0.0.1 (a tested Ray)
        train_loop_config={"cfg": OmegaConf.to_container(cfg, resolve=True), "run": plan},
        scaling_config=ScalingConfig(num_workers=int(tcfg.num_workers), use_gpu=bool(tcfg.use_gpu),
                                     resources_per_worker=resources),
        run_config=RunConfig(
            name=run.name, storage_path=run.storage.uri,
            failure_config=FailureConfig(max_failures=int(tcfg.max_failures)),
            checkpoint_config=CheckpointConfig(num_to_keep=int(tcfg.keep_checkpoints)),
            callbacks=list(run.callbacks),
            logging_config=LoggingConfig(log_level=str(tcfg.ray_log_level)),
        ),
    )


def _finish(run: Run, result) -> Dict[str, Any]:
    """The run's final metrics from Ray Train's `result` (a divergence or a full disk the workers returned is
    raised here, once, without a retry), its MLflow run ended through the record, the checkpoints beyond those
    kept pruned."""
    raise_if_diverged(result.return_value)
    diskspace.raise_if_full(result.return_value)
    best = [c for c, _ in result.best_checkpoints or []]
    kept = {os.path.basename(c.path.rstrip("/")) for c in best}
    if result.checkpoint is not None:
        kept.add(os.path.basename(result.checkpoint.path.rstrip("/")))
    final = dict(result.return_value or result.metrics or {})
    final.update(mlflow_run_id=run.run_id, run_name=run.name, run_dir=run.storage.uri_of(str(result.path)),
                 checkpoint_path=run.storage.uri_of(result.checkpoint.path) if result.checkpoint is not None
                 else None)
    register = run.options.register
    model = final["checkpoint_path"] if run.log_model or register else None
    end = run_end(run.cfg, run.run_id, model, record=run.record, register=register,
                  kept=[run.storage.uri_of(c.path) for c in best] if run.log_model else ())
    try:
        finish_run(run.tracking_uri, run.run_id, run.record, end)
    except TrackingUnavailable as exc:
        exc.final = final
        raise
    finally:
        ckpt_files.prune(run.run_dir.filesystem, run.run_dir.path, kept)
    return final


@contextmanager
def _closed_on_failure(record: str, uri: str, run_id: str, name: str) -> Iterator[Dict[str, str]]:
    """Whatever stops the run while its MLflow run is open ends that run: FAILED (a worker error after the retries,
    divergence, a storage error) or KILLED (Ctrl-C, SIGTERM: `Interrupted`), with the cause in `raystream.error`,
    through its record, which is then drained into MLflow (run_end.close_failed).
    SIGTERM (a job scheduler, `timeout`, `ray job stop`) is handled as Ctrl-C; the yielded dict names the signal.
    TrackingUnavailable passes through: the store is away, and the upload it names closes the run."""
    received: Dict[str, str] = {}
    with signals.sigterm_as_sigint(received):
        try:
            yield received
        except TrackingUnavailable:
            raise
        except BaseException as exc:
            # Ray Train's SIGINT handler aborts the controller and exits the driver's wait with SystemExit.
            interrupted = isinstance(exc, (KeyboardInterrupt, SystemExit))
            signame = received.get("signal", "SIGINT")
            close_failed(record, uri, run_id, exc, signame if interrupted else None)
            if interrupted:
                raise Interrupted(f"run {name} interrupted by {signame}", signame) from None
            raise


def _log_params(client, run_id: str, params: Dict[str, Any]) -> None:
    """Log the params the run lacks; a changed value (e.g. a new trainer.max_steps on resume) is reported, not
    logged, since MLflow params are immutable."""
    from mlflow.entities import Param  # lazy: the driver only; eval workers import this module (MLflow: ~1 s)

    have = retry(lambda: client.get_run(run_id), "get run").data.params
    new: List[Param] = []
    for key, value in params.items():
        text = str(value)[:MAX_PARAM_LENGTH]
        if key not in have:
            new.append(Param(key, text))
        elif have[key] != text:
            print(f"raystream: MLflow param {key} stays {have[key]!r} (this resume uses {text!r})", file=sys.stderr)
    for i in range(0, len(new), 100):
        chunk = new[i:i + 100]
        retry(lambda: client.log_batch(run_id, params=chunk), "log params")


def _log_skipped_videos(client, run_id: str, skipped: List[Tuple[str, str]]) -> None:
    """The videos `data.on_bad_video=skip` left out: their number as a tag, the list (video, reason) as an artifact."""
    retry(lambda: client.set_tag(run_id, names.TAG_SKIPPED_VIDEOS, str(len(skipped))), "tag run")
    retry(lambda: client.log_dict(run_id, [{"video": v, "reason": r} for v, r in skipped],
                                  names.ARTIFACT_SKIPPED_VIDEOS), "log skipped videos")


def _warn_history_lost(client, run: Run, step: int) -> None:
    """The run resumes at `step` but the MLflow run that holds its earlier steps is gone: say so, and tag the new
    MLflow run with it."""
    text = (f"run {run.name} resumes from its checkpoint at step {step}, but its MLflow run "
            f"{run.info['mlflow_run_id']} (recorded at {run.info.get('tracking_uri', '?')}) is not in "
            f"{run.tracking_uri}: the new MLflow run {run.run_id} holds steps {step} on only. To record the whole "
            "run, start it again under a new trainer.run_name.")
    print(f"raystream: WARNING: {text}", file=sys.stderr, flush=True)
    retry(lambda: client.set_tag(run.run_id, names.TAG_WARNING, text), "tag run")
