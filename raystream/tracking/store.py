"""Where MLflow records live, and creating / resuming the MLflow run of one raystream run.

`tracking_uri(cfg)`: `cfg.mlflow.tracking_uri` if set, else `MLFLOW_TRACKING_URI`, else the embedded store MLflow 3
itself defaults to, pinned to the current directory: `sqlite:///<cwd>/mlflow.db`, artifacts under `<cwd>/mlruns`.
Relative sqlite paths are made absolute here, on the driver, because Ray workers run in other directories.
Every call that writes goes through `retry`, since several Tune trials may share one sqlite file.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, TypeVar

from raystream.tracking import names

T = TypeVar("T")
SQLITE = "sqlite:///"


def tracking_uri(cfg: Any = None) -> str:
    """The MLflow tracking URI for `cfg` (a run config, its `mlflow` node, or None), absolute when local."""
    node = getattr(cfg, "mlflow", cfg)
    explicit = getattr(node, "tracking_uri", None) if node is not None else None
    uri = explicit or os.environ.get("MLFLOW_TRACKING_URI") or f"{SQLITE}{Path.cwd() / 'mlflow.db'}"
    if uri.startswith(SQLITE):
        path = uri[len(SQLITE):]
        if path and not path.startswith("/") and not path.startswith(":memory:"):
            uri = f"{SQLITE}{(Path.cwd() / path).resolve()}"
    elif "://" not in uri:  # a bare directory: MLflow's file store
        uri = Path(uri).expanduser().resolve().as_uri()
    return uri


def artifact_location(uri: str) -> Optional[str]:
    """Artifact root for new experiments: `mlruns/` beside an sqlite file, else the store's own default."""
    if uri.startswith(SQLITE):
        path = uri[len(SQLITE):]
        if path.startswith("/"):
            return (Path(path).parent / "mlruns").as_uri()
    return None


def retry(fn: Callable[[], T], what: str, attempts: int = 8) -> T:
    """`fn()`, retried with jittered backoff on errors such as sqlite's "database is locked"."""
    for i in range(attempts):
        try:
            return fn()
        except Exception as exc:  # MlflowException, sqlalchemy OperationalError, connection errors
            text = str(exc).lower()
            transient = any(s in text for s in ("locked", "busy", "timeout", "timed out", "connection",
                                                "temporarily", "503", "429"))
            if not transient or i == attempts - 1:
                raise
            time.sleep(min(5.0, 0.1 * 2 ** i) * (0.5 + random.random()))
    raise AssertionError(f"unreachable: {what}")


def client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def experiment_id(mlflow_client, name: str, uri: str) -> str:
    """The id of experiment `name`, created (with `artifact_location(uri)`) when missing; safe when raced."""
    exp = retry(lambda: mlflow_client.get_experiment_by_name(name), "get experiment")
    if exp is not None:
        return exp.experiment_id
    try:
        return mlflow_client.create_experiment(name, artifact_location=artifact_location(uri))
    except Exception:  # another process created it first
        exp = retry(lambda: mlflow_client.get_experiment_by_name(name), "get experiment")
        if exp is None:
            raise
        return exp.experiment_id


def start_run(mlflow_client, *, experiment: str, uri: str, run_name: str, parent_run_id: Optional[str] = None,
              tags: Optional[Dict[str, str]] = None, resume_run_id: Optional[str] = None) -> str:
    """The MLflow run id for this raystream run: `resume_run_id` (set RUNNING again) when it still exists,
    else a new run, nested under `parent_run_id` (in the parent's experiment) when given."""
    if resume_run_id:
        try:
            run = retry(lambda: mlflow_client.get_run(resume_run_id), "get run")
        except Exception:
            run = None
        if run is not None and run.info.lifecycle_stage == "active":
            retry(lambda: mlflow_client.update_run(resume_run_id, status="RUNNING"), "resume run")
            return resume_run_id
    if parent_run_id:
        exp_id = retry(lambda: mlflow_client.get_run(parent_run_id), "get parent run").info.experiment_id
    else:
        exp_id = experiment_id(mlflow_client, experiment, uri)
    all_tags = {names.TAG_RUN_NAME: run_name, **(tags or {})}
    if parent_run_id:
        all_tags[names.PARENT_RUN_TAG] = parent_run_id
    run = retry(lambda: mlflow_client.create_run(exp_id, run_name=run_name, tags=all_tags), "create run")
    return run.info.run_id


def end_run(mlflow_client, run_id: str, status: str = "FINISHED") -> None:
    retry(lambda: mlflow_client.set_terminated(run_id, status=status), "end run")
