"""The MLflow parent run of a sweep: created (or resumed) with what the sweep is, its view in the MLflow UI, and each
session's end (`ParentClose`). It knows runs, tags and artifacts, not the sweep's plan: `raystream.tune.sweep`
says what the parent carries (`ParentRecord`) and which trials ended how.

Resume: the sweep keeps the parent's run id beside its Tune experiment; starting it again sets that run RUNNING
and goes on with it (a store that lost it gets a new one). The parent's duration in MLflow is the time the sweep
ran: its end time is its start time plus the seconds of every session (tag `raystream.active_seconds`).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from raystream.tracking import names, ui, unsent
from raystream.tracking.names import ERROR_TAG, TRIALS_ARTIFACT
from raystream.tracking.store import client as mlflow_client
from raystream.tracking.store import experiment_id, failing_fast, retry
from raystream.uris import first_line

META_FILE = "raystream_sweep.json"  # beside the Tune experiment: the parent run id, fingerprint, seconds run


@dataclass
class ParentRecord:
    """What a new parent run carries: its name, tags (the sweep, its grid, the command, the description), params,
    the columns of its UI view, and artifacts: `files` (artifact folder -> local file), `texts` and `dicts`
    (artifact file name -> content)."""
    run_name: str
    tags: Dict[str, str]
    params: Dict[str, Any]
    view: List[str]
    files: Dict[str, str] = field(default_factory=dict)
    texts: Dict[str, str] = field(default_factory=dict)
    dicts: Dict[str, Any] = field(default_factory=dict)


def open_parent(uri: str, experiment: str, record: ParentRecord, resume_id: Optional[str] = None) -> str:
    """The sweep's parent run id: `resume_id` set RUNNING again when the store holds it, else a new run carrying
    `record` (and the sweep's view written to its experiment)."""
    import mlflow
    from mlflow.entities import Param

    client = mlflow_client(uri)
    if resume_id:
        try:
            retry(lambda: client.update_run(resume_id, status="RUNNING"), "resume parent run")
            return resume_id
        except mlflow.exceptions.MlflowException:
            pass  # the store was wiped: start a new parent run
    exp_id = experiment_id(client, experiment, uri)
    run = retry(lambda: client.create_run(exp_id, run_name=record.run_name, tags=record.tags), "create parent run")
    rid = run.info.run_id
    ui.write_view(client, exp_id, record.run_name, record.view)
    retry(lambda: client.log_batch(rid, params=[Param(k, str(v)) for k, v in record.params.items()]), "log params")
    for folder, local in record.files.items():
        client.log_artifact(rid, local, artifact_path=folder)
    for name, text in record.texts.items():
        client.log_text(rid, text, name)
    for name, content in record.dicts.items():
        client.log_dict(rid, content, name)
    return rid


def git_commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if out.returncode != 0:
        return "unknown"
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")



def upload_last_session(path, uri: str) -> None:
    """Write what the sweep's last session left unsent (its end during a tracking outage) before it goes on: a
    later end would replace that file. The store answers now (`prepare_store`); when it refuses, say so."""
    left = unsent.path_in(path.uri, unsent.SWEEP_FILE_NAME)
    if not unsent.exists(left):
        return
    try:
        with failing_fast():
            unsent.upload(left, uri)
    except Exception as exc:
        print(f"raystream: WARNING: could not write {left} (the end of this sweep's last session, left by a tracking "
              f"outage) into MLflow at {uri}: {type(exc).__name__}: {exc}; it is kept: run `{unsent.UPLOAD_COMMAND} "
              f"{shlex.quote(left)}` to retry", file=sys.stderr, flush=True)


class ParentClose:
    """The end of a sweep session on its MLflow parent run: every trial's status and error (tags and the
    `sweep/trials.json` artifact), the UI view, the trials an interrupt stopped (KILLED), and the run's status
    and end time. Its end time is its start time plus the seconds every session of the sweep ran (kept in the
    sweep's meta file), so MLflow's duration leaves out the pauses between interrupt and resume.

    Written at once when the store answers; else saved, with the trials' own unsent files, to the sweep's
    `unsent_tracking.jsonl` (`raystream tracking upload` writes it all later): a tracking outage at the end of a
    sweep costs a command, not the sweep's record."""

    def __init__(self, client, uri: str, parent_info, run_name: str, path, meta: Dict[str, Any],
                 session_start: float):
        """`parent_info`: the parent run's `RunInfo`, read when the sweep started (the store may fail later)."""
        self.client, self.uri, self.run_name = client, uri, run_name
        self.parent, self.experiment_id, self.start_ms = parent_info.run_id, parent_info.experiment_id, \
            parent_info.start_time
        self.path, self.meta, self.session_start = path, meta, session_start
        self.saved: Optional[str] = None  # the unsent file, when the store did not answer

    def record(self, status: str, signame: str = "SIGINT", trials: Optional[Sequence[Any]] = None,
               view: Optional[Sequence[str]] = None, failure: Optional[str] = None) -> Dict[str, Any]:
        """What to write, as an unsent file's header (`raystream.tracking.unsent`). `trials`: the sweep's trials
        (each with `trial_id`, `cell`, `config`, `status` finished | failed | unfinished, `error`, `unsent`);
        `failure`: why the sweep itself failed (`raystream.error` of a FAILED parent)."""
        active = float(self.meta.get("active_s", 0.0)) + (time.time() - self.session_start)
        self.meta["active_s"] = active
        tags = {names.ACTIVE_SECONDS_TAG: f"{active:.1f}"}
        header: Dict[str, Any] = {"mlflow_run_id": self.parent, "tracking_uri": self.uri, "end_status": status,
                                  "end_time": int(self.start_ms + active * 1000), "tags": tags}
        if trials is not None:
            for state in ("finished", "failed", "unfinished"):
                tags[names.trials_count_tag(state)] = str(sum(t.status == state for t in trials))
            header["artifacts"] = {TRIALS_ARTIFACT: [{"trial_id": t.trial_id, "cell": t.cell, "config": t.config,
                                                      "status": t.status, "error": t.error} for t in trials]}
            header["also"] = [t.unsent for t in trials if t.unsent]
        if view is not None:
            key, state = ui.view_tag(self.run_name, view)
            header["experiment_tags"] = {self.experiment_id: {key: state}}
        if failure:
            tags[ERROR_TAG] = failure
        if status == "KILLED":
            cause = names.interrupted_cause(signame)
            tags[ERROR_TAG] = cause
            header["end_children"] = {"cause": cause, "trials": [t.trial_id for t in trials or ()
                                                                 if t.status == "unfinished"]}
        return header

    def end(self, status: str, signame: str = "SIGINT", trials: Optional[Sequence[Any]] = None,
            view: Optional[Sequence[str]] = None, failure: Optional[str] = None) -> Optional[str]:
        """Write the end of this session with `status`; None when written, else why the store refused it (what it
        did not take is then in `self.saved`)."""
        header = self.record(status, signame, trials, view, failure)
        self.path.write_json(META_FILE, self.meta)
        try:
            with failing_fast():
                unsent.apply(self.client, header, [])
            return None
        except Exception as exc:
            self.saved = unsent.path_in(self.path.uri, unsent.SWEEP_FILE_NAME)
            unsent.write(self.saved, header, [])
            return first_line(exc, 300)
