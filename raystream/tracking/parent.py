"""The MLflow parent run of a sweep: created (or resumed) with what the sweep is, its view in the MLflow UI, and each
session's end (`ParentClose`). It knows runs, tags and artifacts, not the sweep's plan: `raystream.tune.sweep`
says what the parent carries (`ParentRecord`) and which trials ended how.

Resume: the sweep keeps the parent's run id beside its Tune experiment; starting it again sets that run RUNNING
and goes on with it (a store that lost it gets a new one). The parent's duration in MLflow is the time the sweep
ran: its end time is its start time plus the seconds of every session (tag `raystream.active_seconds`).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import mlflow
from mlflow.entities import Param

from raystream.tracking import events, names, ui
from raystream.tracking.mirror import mirror_now
from raystream.tracking.names import ERROR_TAG, TRIALS_ARTIFACT
from raystream.tracking.store import client as mlflow_client
from raystream.tracking.store import experiment_id, retry
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


class ParentClose:
    """The end of a sweep session on its MLflow parent run: every trial's status and error (tags and the
    `sweep/trials.json` artifact), the UI view, the trials an interrupt stopped (KILLED), and the run's status
    and end time. Its end time is its start time plus the seconds every session of the sweep ran (kept in the
    sweep's meta file), so MLflow's duration leaves out the pauses between interrupt and resume.

    Appended to the sweep's record (`<sweep dir>/events.jsonl`, `raystream.tracking.events`), after the records
    of the trials that MLflow did not take in full, and mirrored at once. When the store does not answer it all
    waits in the record, and `raystream tracking upload <record>` (or the sweep's resume) writes it later: a
    tracking outage at the end of a sweep costs a command, not the sweep's record."""

    def __init__(self, uri: str, parent_info, run_name: str, path, meta: Dict[str, Any], session_start: float):
        """`parent_info`: the parent run's `RunInfo`, read when the sweep started (the store may fail later);
        `path`: the sweep's directory (`raystream.train.storage.Storage`)."""
        self.uri, self.run_name = uri, run_name
        self.parent, self.experiment_id, self.start_ms = parent_info.run_id, parent_info.experiment_id, \
            parent_info.start_time
        self.path, self.meta, self.session_start = path, meta, session_start
        self.saved: Optional[str] = None  # the sweep's record, when the store did not take all of it

    def record(self, status: str, signame: str = "SIGINT", trials: Optional[Sequence[Any]] = None,
               view: Optional[Sequence[str]] = None, failure: Optional[str] = None) -> List[Dict[str, Any]]:
        """The events of this session's end. `trials`: the sweep's trials (each with `trial_id`, `cell`, `config`,
        `status` finished | failed | unfinished, `error`, and `unsent`: its record when MLflow lacks part of it);
        `failure`: why the sweep itself failed (`raystream.error` of a FAILED parent)."""
        active = float(self.meta.get("active_s", 0.0)) + (time.time() - self.session_start)
        self.meta["active_s"] = active
        run = self.parent
        tags = {names.ACTIVE_SECONDS_TAG: f"{active:.1f}"}
        after: List[Dict[str, Any]] = []
        if trials is not None:
            for state in ("finished", "failed", "unfinished"):
                tags[names.trials_count_tag(state)] = str(sum(t.status == state for t in trials))
            after.append(events.artifact(run, TRIALS_ARTIFACT, [
                {"trial_id": t.trial_id, "cell": t.cell, "config": t.config, "status": t.status, "error": t.error}
                for t in trials]))
        if view is not None:
            after.append(events.experiment_tag(self.experiment_id, *ui.view_tag(self.run_name, view)))
        if failure:
            tags[ERROR_TAG] = failure
        if status == "KILLED":
            tags[ERROR_TAG] = names.interrupted_cause(signame)
            after.append(events.end_children(run, tags[ERROR_TAG], [t.trial_id for t in trials or ()
                                                                    if t.status == "unfinished"]))
        return [events.opened(run, self.uri), *(events.record(t.unsent) for t in trials or () if t.unsent),
                *(events.tag(run, k, v) for k, v in tags.items()), *after,
                events.end(run, status, int(self.start_ms + active * 1000))]

    def end(self, status: str, signame: str = "SIGINT", trials: Optional[Sequence[Any]] = None,
            view: Optional[Sequence[str]] = None, failure: Optional[str] = None) -> Optional[str]:
        """Write the end of this session with `status`; None when written, else why the store refused it (what it
        did not take then waits in the sweep's record, `self.saved`)."""
        where = events.path_in(self.path.uri)
        record = events.Record(where)
        record.append(self.record(status, signame, trials, view, failure))
        record.close()
        self.path.write_json(META_FILE, self.meta)
        try:
            mirror_now(where)
            return None
        except Exception as exc:
            self.saved = where
            return first_line(exc, 300)
