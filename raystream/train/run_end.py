"""How a run's MLflow run ends, through its record: the events of a finished run (`run_end`), written with
`finish_run` (a store that does not answer: `TrackingUnavailable`, naming the upload command), and the end of a run
that something stopped (`close_failed`: FAILED or KILLED, drained within `DRAIN_S`; on a full disk, directly).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import OmegaConf

from raystream import diskspace
from raystream.tracking import events, logged_model, names
from raystream.tracking.mirror import DRAIN_S, drain, mirror_now
from raystream.tracking.store import client as mlflow_client_for
from raystream.tracking.store import end_run, failing_fast, retry
from raystream.train import checkpoint as ckpt_files
from raystream.train.divergence import DivergedError
from raystream.uris import filesystem_at, first_line, read_bytes


class TrackingUnavailable(RuntimeError):
    """Training ended but the MLflow tracking store did not take the run's whole record: `path` (beside the
    checkpoints) holds what it did not write, and the message holds the command that writes it. `final`: what
    `fit` would have returned."""

    def __init__(self, message: str, path: str = "", final: Optional[Dict[str, Any]] = None):
        super().__init__(message)
        self.path, self.final = path, dict(final or {})

    def __reduce__(self):
        return type(self), (str(self), self.path, self.final)


def run_end(cfg, run_id: str, model: Optional[str], *, record: Optional[str] = None, kept: Sequence[str] = (),
            register: Optional[Dict[str, str]] = None) -> List[Dict[str, Any]]:
    """The events the driver appends to the run's record once training has finished (`raystream.tracking.events`):
    the `finished` status tag, config.yaml, the gradient-cosine plots from the run's full history, the checkpoint
    `model` (the final one; None: no model) as an MLflow LoggedModel of the run (its weights, not the optimizer
    state) with the evaluation metrics of its step linked, and each `kept` checkpoint an evaluation was made at
    likewise, read from the run's `record`; the final one registered as `register` {name, alias}; no
    `raystream.error` (an earlier attempt's: the record keeps it), FINISHED."""
    end = [events.tag(run_id, names.TAG_STATUS, "finished"), events.untag(run_id, names.TAG_ERROR),
           events.artifact(run_id, names.ARTIFACT_CONFIG, OmegaConf.to_yaml(cfg, resolve=True)),
           events.plots(run_id, f"{cfg.trainer.run_name} ({cfg.optimizer.name}, {cfg.stream.order})")]
    if model and record:
        final = model.rstrip("/")
        others = [k.rstrip("/") for k in kept if k.rstrip("/") != final]
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


def close_failed(record: str, uri: str, run_id: str, exc: BaseException, signame: Optional[str] = None) -> None:
    """End the MLflow run KILLED (interrupted by `signame`, e.g. SIGINT) or FAILED (`signame` None), with the cause
    in `raystream.error`: appended to the run's record, which is drained into MLflow with everything rank 0's
    writer had not written yet, waiting at most `DRAIN_S` s. On a full disk (no room for the end, or for the
    mirror's mark when the run failed for space) the MLflow run is closed directly as well. Nothing here is raised
    over the training error (a full disk or a store that is away is printed)."""
    if signame is not None:
        reason = names.interrupted_cause(signame)
    else:
        reason = str(exc) if isinstance(exc, DivergedError) else f"{type(exc).__name__}: {exc}"
    end = [events.opened(run_id, uri), events.tag(run_id, names.TAG_ERROR, reason[:5000])]
    if isinstance(exc, DivergedError):
        end.append(events.tag(run_id, names.TAG_STATUS, "diverged"))
    status = "KILLED" if signame is not None else "FAILED"
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
