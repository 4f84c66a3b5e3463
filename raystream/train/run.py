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
    recorded before the workers start (tracking/inputs.py).
A run ends FINISHED, FAILED (`raystream.error` says why; a divergence is never retried) or KILLED (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import sys
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from raystream import diskspace
from raystream.config import check, flatten
from raystream.models.checkpoint import is_model_uri
from raystream.tracking import events, inputs, logged_model, names
from raystream.tracking.mirror import DRAIN_S, catch_up, drain, mirror_now
from raystream.tracking.store import client as mlflow_client_for
from raystream.tracking.store import end_run, failing_fast, retry, start_run, tracking_uri
from raystream.train import checkpoint as ckpt_files
from raystream.train import signals
from raystream.train import storage as results
from raystream.train.capacity import cluster_capacity
from raystream.train.divergence import DivergedError, raise_if_diverged
from raystream.train.loop import train_loop_per_worker
from raystream.train.preflight import (check_backbone_init, check_local_cpus, check_resources, check_triton_device,
                                       scenario_needs, stream_plan)
from raystream.train.ray_start import start_ray
from raystream.train.torch_backend import torch_config
from raystream.train.lock import RunLock
from raystream.uris import filesystem_at, first_line, read_bytes

RUN_INFO_FILE = "raystream_run.json"  # in the Ray Train run directory: the MLflow run to resume, the config
MAX_PARAM_LENGTH = 6000  # MLflow's limit on a param value


class Interrupted(KeyboardInterrupt):
    """The run was interrupted (Ctrl-C, or SIGTERM: Ray Train aborts its workers); its MLflow run is KILLED.
    `signal`: the signal's name."""

    def __init__(self, message: str, signal: str = "SIGINT"):
        super().__init__(message)
        self.signal = signal


class TrackingUnavailable(RuntimeError):
    """Training ended but the MLflow tracking store did not take the run's whole record: `path` (beside the
    checkpoints) holds what it did not write, and the message holds the command that writes it. `final`: what
    `fit` would have returned."""

    def __init__(self, message: str, path: str = "", final: Optional[Dict[str, Any]] = None):
        super().__init__(message)
        self.path, self.final = path, dict(final or {})

    def __reduce__(self):
        return type(self), (str(self), self.path, self.final)


def default_run_name(cfg) -> str:
    return (f"{cfg.scenario.name}-{cfg.optimizer.name}-{cfg.stream.order}-"
            f"{time.strftime('%Y%m%d-%H%M%S')}")


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


def run_end(cfg, run_id: str, checkpoint_uri: Optional[str], log_model: bool, *, record: Optional[str] = None,
            kept: Sequence[str] = (), register: Optional[Dict[str, str]] = None) -> List[Dict[str, Any]]:
    """The events the driver appends to the run's record once training has finished (`raystream.tracking.events`):
    the `finished` status tag, config.yaml, the gradient-cosine plots from the run's full history, the final
    checkpoint as an MLflow LoggedModel of the run (`log_model` or `register`; its weights, not the optimizer state)
    with the evaluation metrics of its step linked, and each `kept` checkpoint an evaluation was made at (`log_model`)
    likewise, read from the run's `record`; registered as `register` {name, alias}; no `raystream.error` (an earlier
    attempt's: the record keeps it), FINISHED."""
    end = [events.tag(run_id, names.TAG_STATUS, "finished"), events.untag(run_id, names.TAG_ERROR),
           events.artifact(run_id, names.ARTIFACT_CONFIG, OmegaConf.to_yaml(cfg, resolve=True)),
           events.plots(run_id, f"{cfg.trainer.run_name} ({cfg.optimizer.name}, {cfg.stream.order})")]
    if (log_model or register) and checkpoint_uri and record:
        final = checkpoint_uri.rstrip("/")
        others = [k.rstrip("/") for k in kept if k.rstrip("/") != final] if log_model else []
        end.extend(logged_model.model_events(
            run_id, str(cfg.trainer.run_name), OmegaConf.to_container(cfg, resolve=True), record,
            [(c, _last_step(c), c == final) for c in [*others, final]], register))
    return [*end, events.end(run_id, "FINISHED")]


def _last_step(checkpoint_uri: str) -> int:
    """The last step a checkpoint directory's weights were trained on (its meta.json's next_step - 1)."""
    fs, path = filesystem_at(checkpoint_uri)
    return int(json.loads(read_bytes(fs, f"{path}/{ckpt_files.META_FILE}").decode())["next_step"]) - 1


def finish_run(uri: str, run_id: str, where: str, end: List[Dict[str, Any]]) -> None:
    """Append `end` (`run_end`) to the run's record `where` and mirror the record into MLflow: what rank 0's
    writer did not write (a tracking outage), then the end. When the store does not answer, all of it waits in the
    record and TrackingUnavailable names it and the command that writes it."""
    record = events.Record(where)
    record.append([events.opened(run_id, uri), *end])
    record.close()
    try:
        mirror_now(where, attempts=8)  # 8: sqlite shared by a sweep's trials
    except Exception as exc:
        raise TrackingUnavailable(
            f"training finished, but the MLflow tracking store at {uri} does not answer ({first_line(exc, 300)}): "
            f"{len(events.Record(where).pending())} events of the run's record (its metric values and its end: "
            f"status, config, plots, model) wait in {where}, and MLflow run {run_id} stays RUNNING. When the store "
            f"answers, write them and close the run with:\n  {events.UPLOAD_COMMAND} {shlex.quote(where)}",
            where) from None


def collective_config(cfg: DictConfig):
    """The TorchConfig of a job (`torch_config`: raystream's loopback set-up on a tested Ray) with
    `trainer.collective_timeout_s` as torch.distributed's time-out."""
    config = torch_config()
    config.timeout_s = int(cfg.trainer.collective_timeout_s)
    return config


def fit(cfg: DictConfig, *, run_name: Optional[str] = None, callbacks: Optional[Sequence[Any]] = None,
        mlflow_parent_run_id: Optional[str] = None, mlflow_tags: Optional[Dict[str, str]] = None,
        init_checked: Optional[str] = None, step_hooks: Optional[Any] = None,
        register: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Train one run to the end (or resume it) and return its final metrics.

    `run_name` (else `trainer.run_name`, else generated) names the Ray Train run directory
    `<trainer.storage_path>/<run_name>` and the MLflow run. `callbacks`: Ray Train `UserCallback`s (Tune passes
    `ray.tune.integration.ray_train.TuneReportCallback()`), called on every `ray.train.report`.
    `init_checked`: the line `check_backbone_init` gave for this config earlier (a sweep checks each distinct
    model's start checkpoint once, before Ray starts); None reads and checks it here.
    `step_hooks`: faults a test injects from outside the step (`raystream.train.faults.Faults`), or None.
    `register`: {name, alias}: the final checkpoint becomes a version of that registered MLflow model, with the alias
    (`raystream pretrain-start`), whatever `trainer.log_checkpoint_artifact` says (null: models for a run, not for
    a sweep's trial, `mlflow_parent_run_id` set).
    Returned keys: `loss` (mean over the last report window), `eval/*` (final evaluation and in-stream averages),
    `step`, `steps_done`, `start_step` (step the last attempt started at: > 0 after a restart or resume),
    `mlflow_run_id`, `run_name`, `run_dir`, `checkpoint_path`.
    Raises ConfigError / DataError before any worker starts (`RunLocked`: another process runs it); Ray's
    TrainingFailedError past `trainer.max_failures`; DivergedError / DiskFull (no retry); `Interrupted` on Ctrl-C
    or SIGTERM. The same run name and storage path resume from the newest complete checkpoint on storage (a lost
    MLflow run is said, the new one tagged `raystream.warning`); whatever stops an open run sets `raystream.error`.
    """
    cfg = copy.deepcopy(cfg)
    name = run_name or cfg.trainer.run_name or default_run_name(cfg)
    cfg.trainer.run_name = name
    check(cfg)
    storage = results.resolve(cfg.trainer.storage_path)  # local directory or s3:// / gs:// URI
    run_dir = storage.child(name)
    # The inputs first, before Ray starts: a bad one writes nothing (no run directory, no lock). A checkpoint that
    # does not fit the model (checked once per model in a sweep), too few local CPUs, unusable videos.
    init_line = init_checked if init_checked is not None else check_backbone_init(cfg)
    check_local_cpus(cfg.trainer)
    check_triton_device(cfg)
    videos: List[Any] = []  # the stream's probed videos: the run's training dataset input
    plan = stream_plan(cfg, videos)
    # One writer per run: a second `raystream train` of it refuses here (RunLocked, exit 2), before Ray starts; a
    # sweep's trial (a parent run) runs under its sweep's lock.
    lock = RunLock(run_dir, name).acquire() if mlflow_parent_run_id is None else None
    try:
        return _fit(cfg, name, storage, run_dir, callbacks, mlflow_parent_run_id, mlflow_tags, init_line, plan,
                    step_hooks, videos, register)
    finally:
        if lock is not None:
            lock.release()
            if run_dir.local:  # a run stopped before it wrote anything (the cluster too small) leaves no directory
                with suppress(OSError):
                    os.rmdir(run_dir.uri)


def _fit(cfg: DictConfig, name: str, storage, run_dir, callbacks, mlflow_parent_run_id, mlflow_tags,
         init_line, plan, step_hooks=None, videos: Sequence[Any] = (),
         register: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """`fit`'s work, under the run's lock, once its inputs are checked (`plan`: stream_plan's steps and skipped
    videos; `videos`: the stream's probed videos): Ray, the MLflow run, the workers, the end."""
    record = events.path_in(run_dir.uri)  # the run's record: what it writes to MLflow, mirrored from there
    catch_up(record, "an earlier attempt of this run")  # first: what a killed attempt left (kill -9) into MLflow
    start_ray()  # RAY_ADDRESS when set, else a local cluster on the loopback interface
    check_resources(cfg.trainer, cluster_capacity())  # what the cluster can grow to (autoscaler)
    info = run_dir.read_json(RUN_INFO_FILE) or {}
    resume = ckpt_files.latest(run_dir.filesystem, run_dir.path)  # (path, meta) of the newest complete one, or None
    uri = tracking_uri(cfg)
    run_id = _open_mlflow_run(cfg, name, run_dir, info, uri, mlflow_parent_run_id, mlflow_tags, init_line)
    with _closed_on_failure(record, uri, run_id, name) as received:  # KILLED / FAILED, whatever stops it
        _record_start(cfg, name, run_dir, info, uri, run_id, resume, skipped_videos=plan[1])
        _record_inputs(cfg, record, uri, run_id, videos)
        trainer = _trainer(_pinned_init(cfg, uri), name, storage, run_dir, callbacks,
                           run={"run_name": name, "total_steps": plan[0], "tracking_uri": uri, "mlflow_run_id": run_id,
                                "resume_from": Checkpoint(resume[0], filesystem=run_dir.filesystem)
                                if resume is not None else None,
                                "record": record,
                                "hooks": step_hooks.for_run(run_dir.uri if run_dir.local else None, name)
                                if step_hooks is not None else None,
                                # the stream's Figure 1 figure, once per run, by the workers before step 0
                                "measure_correlation": int(cfg.trainer.correlation_steps) > 0 and not info})
        result = trainer.fit()
        signals.raise_if_signalled(received)  # SIGTERM: Ray Train aborted the run gracefully
        log_model = cfg.trainer.log_checkpoint_artifact  # null: a single run logs its models, a sweep's trial not
        log_model = mlflow_parent_run_id is None if log_model is None else bool(log_model)
        return _finish(cfg, name, storage, run_dir, uri, run_id, record, result, register, log_model)


def _open_mlflow_run(cfg: DictConfig, name: str, run_dir, info: Dict[str, Any], uri: str,
                     mlflow_parent_run_id: Optional[str], mlflow_tags: Optional[Dict[str, str]],
                     init_line: Optional[str]) -> str:
    """The run's MLflow run id: the one its earlier attempt opened (`info`), else a new one, tagged with the run
    directory and the start checkpoint's line."""
    tags = {**(mlflow_tags or {}), names.TAG_RUN_DIR: run_dir.uri}
    if init_line:
        tags[names.TAG_INIT] = init_line
    return start_run(mlflow_client_for(uri), experiment=cfg.mlflow.experiment, uri=uri, run_name=name,
                     parent_run_id=mlflow_parent_run_id, tags=tags, resume_run_id=info.get("mlflow_run_id"))


def _record_start(cfg: DictConfig, name: str, run_dir, info: Dict[str, Any], uri: str, run_id: str, resume,
                  skipped_videos: List[Tuple[str, str]]) -> None:
    """What the run says before its workers start: that a resumed run's earlier MLflow history is gone (if so), its
    run file (written at once: a run, or a sweep's trial, stopped before its first step reopens this MLflow run when
    resumed; `raystream eval` reads its config), its params, the videos `data.on_bad_video=skip` left out."""
    client = mlflow_client_for(uri)
    if resume is not None and info.get("mlflow_run_id") and run_id != info["mlflow_run_id"]:
        _warn_history_lost(client, run_id, name, info, uri, int(resume[1]["next_step"]))
    run_dir.write_json(RUN_INFO_FILE, {"mlflow_run_id": run_id, "tracking_uri": uri, "run_name": name,
                                       "config": OmegaConf.to_container(cfg, resolve=True)})
    _log_params(client, run_id, flatten(cfg))
    if skipped_videos:
        _log_skipped_videos(client, run_id, skipped_videos)


def _record_inputs(cfg: DictConfig, record: str, uri: str, run_id: str, videos: Sequence[Any]) -> None:
    """The run's videos as MLflow dataset inputs (tracking/inputs.py), appended to its record and written at once
    while the store answers (else rank 0's writer or the end writes them)."""
    out = events.Record(record)
    out.append([events.opened(run_id, uri),
                *inputs.input_events(cfg, run_id, videos, scenario_needs(str(cfg.scenario.name)))])
    out.close()
    catch_up(record, "this run's start")


def _pinned_init(cfg: DictConfig, uri: str) -> DictConfig:
    """The config the workers get: a `models:/<name>@<alias>` (or version) start pinned to the model id it names
    now, so an alias moved while the run trains does not change the start of a restarted worker."""
    if not is_model_uri(cfg.scenario.backbone.init):
        return cfg
    from raystream.tracking import registry  # lazy: only for a models:/ start

    pinned = copy.deepcopy(cfg)
    pinned.scenario.backbone.init = registry.pinned(str(cfg.scenario.backbone.init), uri)
    return pinned


def _trainer(cfg: DictConfig, name: str, storage, run_dir, callbacks, run: Dict[str, Any]) -> TorchTrainer:
    """Ray Train's TorchTrainer of the run: `trainer.*` as its scaling, failure and checkpoint configs; `run`: what
    the driver decided for the workers (train_loop_per_worker's `config["run"]`)."""
    tcfg = cfg.trainer
    resources = {"CPU": float(tcfg.cpus_per_worker), **({"GPU": 1} if tcfg.use_gpu else {})}
    return TorchTrainer(
        train_loop_per_worker, torch_config=collective_config(cfg),  # one node: on 127.0.0.1 (a tested Ray)
        train_loop_config={"cfg": OmegaConf.to_container(cfg, resolve=True), "run": run},
        scaling_config=ScalingConfig(num_workers=int(tcfg.num_workers), use_gpu=bool(tcfg.use_gpu),
                                     resources_per_worker=resources),
        run_config=RunConfig(
            name=name, storage_path=storage.uri,
            failure_config=FailureConfig(max_failures=int(tcfg.max_failures)),
            checkpoint_config=CheckpointConfig(num_to_keep=int(tcfg.keep_checkpoints)),
            callbacks=list(callbacks or []),
            logging_config=LoggingConfig(log_level=str(tcfg.ray_log_level)),
        ),
    )


def _finish(cfg: DictConfig, name: str, storage, run_dir, uri: str, run_id: str, record: str,
            result, register: Optional[Dict[str, str]] = None, log_model: bool = True) -> Dict[str, Any]:
    """The run's final metrics from Ray Train's `result` (a divergence or a full disk the workers returned is
    raised here, once, without a retry), its MLflow run ended through the record, the checkpoints beyond those
    kept pruned."""
    raise_if_diverged(result.return_value)
    diskspace.raise_if_full(result.return_value)
    kept = {Path(c.path).name for c, _ in result.best_checkpoints or []}
    if result.checkpoint is not None:
        kept.add(Path(result.checkpoint.path).name)
    final = dict(result.return_value or result.metrics or {})
    final.update(mlflow_run_id=run_id, run_name=name, run_dir=storage.uri_of(str(result.path)),
                 checkpoint_path=storage.uri_of(result.checkpoint.path) if result.checkpoint is not None else None)
    end = run_end(cfg, run_id, final["checkpoint_path"], log_model, record=record,
                  kept=[storage.uri_of(c.path) for c, _ in result.best_checkpoints or []], register=register)
    try:
        finish_run(uri, run_id, record, end)
    except TrackingUnavailable as exc:
        exc.final = final
        raise
    finally:
        ckpt_files.prune(run_dir.filesystem, run_dir.path, kept)
    return final


@contextmanager
def _closed_on_failure(record: str, uri: str, run_id: str, name: str) -> Iterator[Dict[str, str]]:
    """Whatever stops the run while its MLflow run is open ends that run: FAILED (a worker error after the retries,
    divergence, a storage error) or KILLED (Ctrl-C, SIGTERM: `Interrupted`), with the cause in `raystream.error`,
    through its record, which is then drained into MLflow (at most `DRAIN_S`; what is left and the upload command
    are printed).
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
            _close_failed(record, uri, run_id, exc, interrupted, signame)
            if interrupted:
                raise Interrupted(f"run {name} interrupted by {signame}", signame) from None
            raise


def _log_skipped_videos(client, run_id: str, skipped: List[Tuple[str, str]]) -> None:
    """The videos `data.on_bad_video=skip` left out: their number as a tag, the list (video, reason) as an artifact."""
    retry(lambda: client.set_tag(run_id, names.TAG_SKIPPED_VIDEOS, str(len(skipped))), "tag run")
    retry(lambda: client.log_dict(run_id, [{"video": v, "reason": r} for v, r in skipped],
                                  names.ARTIFACT_SKIPPED_VIDEOS), "log skipped videos")


def _close_failed(record: str, uri: str, run_id: str, exc: BaseException, interrupted: bool,
                  signame: str = "SIGINT") -> None:
    """End the MLflow run KILLED (interrupted by `signame`) or FAILED, with the cause in `raystream.error`: appended
    to the run's record, which is drained into MLflow with everything rank 0's writer had not written yet, waiting
    at most `DRAIN_S` s. On a full disk (no room for the end, or for the mirror's mark when the run failed for
    space) the MLflow run is closed directly as well. Nothing here is raised over the training error (a full disk
    or a store that is away is printed)."""
    if interrupted:
        reason = names.interrupted_cause(signame)
    else:
        reason = str(exc) if isinstance(exc, DivergedError) else f"{type(exc).__name__}: {exc}"
    end = [events.opened(run_id, uri), events.tag(run_id, names.TAG_ERROR, reason[:5000])]
    if isinstance(exc, DivergedError):
        end.append(events.tag(run_id, names.TAG_STATUS, "diverged"))
    status = "KILLED" if interrupted else "FAILED"
    try:
        out = events.Record(record)
        out.append([*end, events.end(run_id, status, int(time.time() * 1000))])
        out.close()
    except Exception as write_exc:  # a full disk: the run is closed straight in MLflow instead
        print(f"raystream: could not append the run's end to {record} ({first_line(write_exc, 300)}): closing "
              f"MLflow run {run_id} {status} directly", file=sys.stderr, flush=True)
        _end_directly(uri, run_id, end[1:], status)
        drain(record, f"run {run_id}", DRAIN_S)
        return
    if drain(record, f"run {run_id}", DRAIN_S) and diskspace.is_full(exc):
        # the end fitted in the record, but the mirror stops where it has no room for its mark (what it wrote)
        print(f"raystream: the disk of {record} is full: closing MLflow run {run_id} {status} directly",
              file=sys.stderr, flush=True)
        _end_directly(uri, run_id, end[1:], status)


def _end_directly(uri: str, run_id: str, tags: List[Dict[str, Any]], status: str) -> None:
    """Set `tags` (tag events) on MLflow run `run_id` and end it `status`, not through its record (which has no
    room), failing fast; a store that does not answer is printed, not raised (the training error is kept)."""
    try:
        with failing_fast():
            client = mlflow_client_for(uri)
            for e in tags:
                retry(lambda e=e: client.set_tag(run_id, e["key"], e["value"]), "tag run")
            end_run(client, run_id, status=status)
    except Exception as mlflow_exc:  # keep the training error, not MLflow's
        print(f"raystream: could not close MLflow run {run_id}: {first_line(mlflow_exc, 300)}", file=sys.stderr)


def _warn_history_lost(client, run_id: str, name: str, info: Dict[str, Any], uri: str, step: int) -> None:
    """The run resumes at `step` but the MLflow run that holds its earlier steps is gone: say so, and tag the new
    MLflow run with it."""
    text = (f"run {name} resumes from its checkpoint at step {step}, but its MLflow run {info['mlflow_run_id']} "
            f"(recorded at {info.get('tracking_uri', '?')}) is not in {uri}: the new MLflow run {run_id} holds steps "
            f"{step} on only. To record the whole run, start it again under a new trainer.run_name.")
    print(f"raystream: WARNING: {text}", file=sys.stderr, flush=True)
    retry(lambda: client.set_tag(run_id, names.TAG_WARNING, text), "tag run")
