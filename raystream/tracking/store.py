"""Where MLflow records live, and creating / resuming the MLflow run of one raystream run.

`tracking_uri(cfg)`: `cfg.mlflow.tracking_uri` if set, else `MLFLOW_TRACKING_URI`, else the embedded store MLflow 3
itself defaults to, pinned to the current directory: `sqlite:///<cwd>/mlflow.db`, artifacts under `<cwd>/mlruns`.
Relative sqlite paths are made absolute here, on the driver, because Ray workers run in other directories.
Every call that writes goes through `retry`, since several Tune trials may share one sqlite file.

`prepare_store(uri)` runs on the driver before Ray starts: a server is asked one short request (bounded retries),
a new sqlite file is created and migrated under a temporary name and moved into place only when complete, so
no other process (a Tune trial, `mlflow ui`, a test polling the file) can open it half-migrated; every failure
is a `TrackingStoreError` naming the URI.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, TypeVar
from urllib.parse import unquote, urlparse

import raystream.tracking.names as names

T = TypeVar("T")
SQLITE = "sqlite:///"


def tracking_uri(cfg: Any = None) -> str:
    """The MLflow tracking URI of the run config `cfg` (`cfg.mlflow.tracking_uri`; None: no config), absolute when
    local."""
    explicit = cfg.mlflow.tracking_uri if cfg is not None else None
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


class TrackingStoreError(RuntimeError):
    """The MLflow tracking store cannot be reached, opened or written; the message names the URI."""


class StoreNotAnswering(TrackingStoreError):
    """A tracking server gave no answer (refused, timed out, HTTP 5xx): it may be back later, unlike a refusal."""


SERVER_ATTEMPTS, SERVER_TIMEOUT_S = 3, 5.0  # prepare_store's request to a tracking server: at most ~20 s in all


def prepare_store(uri: str, *, create: bool = True) -> None:
    """Check the store at `uri` answers and can be written, creating a missing sqlite store (`create`) or
    raising TrackingStoreError when it is missing (`create=False`, readers such as `raystream report`)."""
    if uri.startswith(SQLITE) and not uri[len(SQLITE):].startswith(":memory:"):
        _prepare_sqlite(uri, Path(uri[len(SQLITE):]), create)
    elif uri.startswith(("http://", "https://")):
        _ask_server(uri)
    elif uri.startswith("file:"):
        root = Path(unquote(urlparse(uri).path))
        if not root.exists() and not create:
            raise TrackingStoreError(f"MLflow tracking URI {uri}: no such directory")
        _writable_dir(uri, root if root.exists() else root.parent, what="its directory")


def _writable_dir(uri: str, directory: Path, what: str) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrackingStoreError(f"MLflow tracking URI {uri}: cannot create {what} {directory}: {exc}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise TrackingStoreError(f"MLflow tracking URI {uri}: {what} {directory} is not writable")


def _prepare_sqlite(uri: str, db: Path, create: bool) -> None:
    if db.exists():
        # sqlite writes a journal beside the file: the directory must be writable too.
        if not os.access(db, os.R_OK | os.W_OK):
            raise TrackingStoreError(f"MLflow tracking URI {uri}: {db} is not writable")
        _writable_dir(uri, db.parent, what="the directory of")
        return
    if not create:
        raise TrackingStoreError(f"MLflow tracking URI {uri}: no MLflow store at {db}")
    _writable_dir(uri, db.parent, what="the directory of the sqlite file")
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # lazy: MLflow; the CLI loads this module

    tmp = db.parent / f".{db.name}.{os.getpid()}.{random.randrange(1 << 30)}.tmp"
    quiet = [logging.getLogger(name) for name in ("mlflow.store.db.utils", "alembic.runtime.migration")]
    levels = [log.level for log in quiet]
    try:
        for log in quiet:  # "Creating initial MLflow database tables..." is MLflow's business, not the user's
            log.setLevel(logging.WARNING)
        store = SqlAlchemyStore(f"{SQLITE}{tmp}", artifact_location(uri) or str(db.parent / "mlruns"))
        store.engine.dispose()
        try:
            os.link(tmp, db)  # atomic, and never replaces a store another driver moved in first
        except FileExistsError:
            pass
        except OSError:  # no hard links on this filesystem
            if not db.exists():
                os.replace(tmp, db)
    except TrackingStoreError:
        raise
    except Exception as exc:
        raise TrackingStoreError(f"MLflow tracking URI {uri}: cannot create the sqlite store {db}: "
                                 f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    finally:
        for log, level in zip(quiet, levels):
            log.setLevel(level)
        for leftover in (tmp, Path(f"{tmp}-journal")):
            leftover.unlink(missing_ok=True)


def _ask_server(uri: str) -> None:
    """One short request to a tracking server (`experiments/search`, one result), retried a bounded number of times
    (a server being started refuses connections for a moment); the error holds the whole exception and what to
    check."""
    from mlflow.tracking._tracking_service.utils import _get_store  # lazy: MLflow; the CLI loads this module
    from mlflow.utils.rest_utils import http_request  # lazy: as above

    creds = _get_store(uri).get_host_creds()
    last: Optional[BaseException] = None
    tries = 0
    for tries in range(1, SERVER_ATTEMPTS + 1):
        try:
            resp = http_request(creds, "/api/2.0/mlflow/experiments/search", "POST", max_retries=0,
                                timeout=SERVER_TIMEOUT_S, raise_on_status=False, json={"max_results": 1})
            if resp.status_code < 500:
                if resp.status_code in (401, 403):
                    raise TrackingStoreError(f"MLflow tracking URI {uri}: the server refused the request "
                                             f"(HTTP {resp.status_code}): set MLFLOW_TRACKING_TOKEN or "
                                             "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD")
                if resp.status_code >= 400:
                    raise TrackingStoreError(f"MLflow tracking URI {uri}: HTTP {resp.status_code} from "
                                             f"experiments/search (is it an MLflow tracking server?)")
                return
            last = RuntimeError(f"HTTP {resp.status_code}")
        except TrackingStoreError:
            raise
        except Exception as exc:  # connection refused, DNS, timeout
            last = exc
        if tries < SERVER_ATTEMPTS:
            time.sleep(1.0 * tries)
    host = urlparse(uri).netloc or uri
    reason = " ".join(str(last).split()) if last is not None and str(last) else type(last).__name__
    raise StoreNotAnswering(
        f"MLflow tracking URI {uri}: "
        + f"no answer after {tries} tries ({SERVER_TIMEOUT_S:g} s each)"
        + f": {type(last).__name__}: {reason}. Check that an MLflow tracking server runs at {host} (e.g. "
        f"`mlflow server --host <host> --port <port>`) and is reachable from here, and that mlflow.tracking_uri "
        f"or $MLFLOW_TRACKING_URI names it (a local store needs no server: sqlite:///<path>/mlflow.db)")


STORE_WAIT_S = 900.0  # how long a sweep's trial that starts during a tracking outage waits for the server


def wait_for_store(uri: str, what: str, timeout_s: float = STORE_WAIT_S, poll_s: float = 10.0) -> None:
    """Return once the tracking server at `uri` answers: a sweep's trial that starts during an outage waits for it
    (no Train worker holds a CPU or GPU meanwhile) instead of failing, and says so once, naming `what` and the URI.
    Local stores return at once. Raises TrackingStoreError after `timeout_s`, or at once when the server refuses
    (credentials, not an MLflow server)."""
    if not uri.startswith(("http://", "https://")):
        return
    deadline = time.monotonic() + timeout_s
    waited_since: Optional[float] = None
    while True:
        try:
            _ask_server(uri)
        except StoreNotAnswering as exc:
            if time.monotonic() >= deadline:
                raise TrackingStoreError(f"{what}: {exc}; waited {timeout_s:.0f} s for it") from None
            if waited_since is None:
                waited_since = time.monotonic()
                print(f"raystream: WARNING: {what} waits for the MLflow tracking server at {uri}, which does not "
                      f"answer (at most {timeout_s:.0f} s)", file=sys.stderr, flush=True)
            time.sleep(poll_s)
            continue
        if waited_since is not None:
            print(f"raystream: the MLflow tracking server at {uri} answers again after "
                  f"{time.monotonic() - waited_since:.0f} s; {what} starts", file=sys.stderr, flush=True)
        return


@contextmanager
def failing_fast():
    """MLflow HTTP calls in this block fail at the first refused connection (no urllib3 retries, 10 s timeout):
    for calls made while the tracking server may be down (closing a run during an outage)."""
    keys = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    before = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
    from mlflow.tracking import MlflowClient  # lazy: MLflow; the CLI loads this module

    return MlflowClient(tracking_uri=uri)


def experiment_id(mlflow_client, name: str, uri: str) -> str:
    """The id of experiment `name`, created (with `artifact_location(uri)`) when missing; safe when raced. The
    experiment is tagged to open on its runs table in the MLflow UI (`names.EXPERIMENT_KIND_TAG`)."""
    exp = retry(lambda: mlflow_client.get_experiment_by_name(name), "get experiment")
    if exp is not None:
        if names.EXPERIMENT_KIND_TAG not in exp.tags:  # created by an older raystream or by hand: open on the runs
            retry(lambda: mlflow_client.set_experiment_tag(exp.experiment_id, names.EXPERIMENT_KIND_TAG,
                                                           names.EXPERIMENT_KIND), "tag experiment")
        return exp.experiment_id
    try:
        return mlflow_client.create_experiment(name, artifact_location=artifact_location(uri),
                                               tags={names.EXPERIMENT_KIND_TAG: names.EXPERIMENT_KIND})
    except Exception:  # another process created it first
        exp = retry(lambda: mlflow_client.get_experiment_by_name(name), "get experiment")
        if exp is None:
            raise
        return exp.experiment_id


def start_run(mlflow_client, *, experiment: str, uri: str, run_name: str, parent_run_id: Optional[str] = None,
              tags: Optional[Dict[str, str]] = None, resume_run_id: Optional[str] = None) -> str:
    """The MLflow run id for this raystream run: `resume_run_id` (set RUNNING again) when it still exists,
    else a new run, nested under `parent_run_id` (in the parent's experiment) when given, named `run_name` unless
    `tags` name it (`mlflow.runName`; `raystream.run_name` keeps `run_name`)."""
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
    shown = all_tags.pop(names.RUN_NAME_TAG, run_name)  # a sweep's trial is shown by its grid values
    run = retry(lambda: mlflow_client.create_run(exp_id, run_name=shown, tags=all_tags), "create run")
    return run.info.run_id


def end_run(mlflow_client, run_id: str, status: str = "FINISHED") -> None:
    retry(lambda: mlflow_client.set_terminated(run_id, status=status), "end run")


def end_child_runs(mlflow_client, parent_run_id: str, cause: str, trials: Sequence[str] = (),
                   attempts: int = 8) -> None:
    """The child runs of `parent_run_id` still RUNNING, and those of the sweep's `trials` (ids; an interrupted trial's
    run may have ended FAILED with its killed actor's error), end KILLED with `cause` in `raystream.error`."""
    exp_id = retry(lambda: mlflow_client.get_run(parent_run_id), "get parent run", attempts).info.experiment_id
    of_parent = f"tags.`{names.PARENT_RUN_TAG}` = '{parent_run_id}'"
    runs = {r.info.run_id for r in retry(lambda: mlflow_client.search_runs(
        [exp_id], filter_string=f"{of_parent} and attributes.status = 'RUNNING'"), "find running trials", attempts)}
    for trial_id in trials:
        runs.update(r.info.run_id for r in retry(lambda t=trial_id: mlflow_client.search_runs(
            [exp_id], filter_string=f"{of_parent} and tags.`{names.TRIAL_TAG}` = '{t}'"), "find stopped trial",
            attempts))
    for run_id in sorted(runs):
        retry(lambda r=run_id: mlflow_client.set_tag(r, names.ERROR_TAG, cause), "tag interrupted trial run",
              attempts)
        retry(lambda r=run_id: mlflow_client.set_terminated(r, "KILLED"), "end interrupted trial run", attempts)
