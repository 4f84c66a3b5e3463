"""The mirror of a run's record (`raystream.tracking.events`) into MLflow: it writes the events the record holds
beyond how far it got, in order, and moves that mark after each write. One mirror serves every case: rank 0's
background writer (`StepLogger`), the driver at a run's end, a sweep's end, a resume, and
`raystream tracking upload FILE`.

Idempotent: a metric value at or below the step MLflow holds for its (run, key) is skipped, and tags, artifacts and
ends are set again, so a replay cut short (or run twice) records each step exactly once; a dataset input or a
LoggedModel MLflow already holds for the run is not written again (`inputs.log`, `logged_model.log`). A store that does not
answer raises out of `run` with the mark at the last event written; the next call goes on from there.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional

from raystream.tracking import events as ev
from raystream.tracking import inputs, logged_model, names
from raystream.tracking.plots import grad_cosine_plots, history
from raystream.tracking.store import client as make_client
from raystream.tracking.store import end_child_runs, failing_fast, retry
from raystream.uris import download, filesystem_at, first_line, is_file

MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limit
CHUNK_EVENTS = 20 * MAX_METRICS_PER_BATCH  # events read from the record at a time
RETRIES = 4  # tries of each write (sqlite "database is locked"); a store that is away fails in about a second
DRAIN_S = 30.0  # at a run's exit (Ctrl-C, SIGTERM, a failure): the longest the driver waits for MLflow


class Mirror:
    """Writes `record` into MLflow (at `tracking_uri`, else the one its `open` events name)."""

    def __init__(self, record: "ev.Record", tracking_uri: Optional[str] = None, attempts: int = RETRIES):
        self.record, self.override, self.attempts = record, tracking_uri, attempts
        self._clients: Dict[str, Any] = {}
        self._uri: Optional[str] = tracking_uri
        self._recorded: Dict[str, Dict[str, int]] = {}  # run -> key -> highest step MLflow holds

    def run(self) -> int:
        """Write the pending events; returns how many metric values were written."""
        start = self.record.mirrored
        if self._uri is None and start > 0:  # where the events written before went: the last `open` before the mark
            opens = [e for e, end in self.record.read() if e["kind"] == "open" and end <= start]
            self._uri = opens[-1]["tracking_uri"] if opens else None
        written = 0
        while True:
            pending = self.record.read(self.record.mirrored, CHUNK_EVENTS)
            if not pending:
                return written
            written += self._chunk(pending)

    def _chunk(self, pending: List[Any]) -> int:
        written, i = 0, 0
        while i < len(pending):
            event, offset = pending[i]
            if event["kind"] == "metrics":  # with the steps after it, of the same run: up to a batch of values
                j, values = i, 0
                while (j < len(pending) and values < MAX_METRICS_PER_BATCH and pending[j][0]["kind"] == "metrics"
                       and pending[j][0]["run"] == event["run"]):
                    values += len(pending[j][0]["values"])
                    j += 1
                written += self._metrics(event["run"], [e for e, _ in pending[i:j]])
                offset = pending[j - 1][1]
                i = j
            else:
                self._apply(event)
                i += 1
            self.record.set_mirrored(offset)
        return written

    # ---- one write each -----------------------------------------------------------------------------------------
    def _client(self):
        if self._uri is None:
            raise ValueError(f"{self.record.where}: no `open` event names the tracking URI; give --tracking-uri")
        if self._uri not in self._clients:
            self._clients[self._uri] = make_client(self._uri)
        return self._clients[self._uri]

    def _retry(self, fn, what: str):
        return retry(fn, what, attempts=self.attempts)

    def _metrics(self, run: str, found: List[Dict[str, Any]]) -> int:
        from mlflow.entities import Metric  # lazy: MLflow loads when mirroring (every CLI command loads this module)

        client = self._client()
        recorded = self._recorded.setdefault(run, {})
        for key in {k for e in found for k in e["values"]} - set(recorded):
            history = self._retry(lambda k=key: client.get_metric_history(run, k), "read metric history")
            recorded[key] = max((m.step for m in history), default=-1)
        todo = [Metric(key=k, value=float(v), timestamp=int(e["timestamp"]), step=int(e["step"]))
                for e in found for k, v in e["values"].items() if int(e["step"]) > recorded[k]]
        for i in range(0, len(todo), MAX_METRICS_PER_BATCH):
            batch = todo[i:i + MAX_METRICS_PER_BATCH]
            try:
                self._retry(lambda: client.log_batch(run, metrics=batch), "log metrics")
            except Exception:
                self._recorded.pop(run, None)  # it may have been committed before the connection dropped: read again
                raise
            for m in batch:
                recorded[m.key] = max(recorded[m.key], m.step)
        return len(todo)

    def _apply(self, event: Dict[str, Any]) -> None:
        kind = event["kind"]
        if kind == "open":
            self._uri = self.override or event["tracking_uri"]
            return
        if kind == "record":
            other = ev.Record(event["path"])
            if other.exists:
                Mirror(other, self.override, self.attempts).run()
                other.sync(force=True)
            return
        client, run = self._client(), event.get("run")
        if kind == "tag":
            self._retry(lambda: client.set_tag(run, event["key"], event["value"]), "tag run")
        elif kind == "json":
            self._retry(lambda: client.log_dict(run, event["content"], event["name"]), "log artifact")
        elif kind == "text":
            self._retry(lambda: client.log_text(run, event["content"], event["name"]), "log artifact")
        elif kind == "files":
            self._files(client, run, event["folder"], event["sources"])
        elif kind == "plots":
            self._plots(client, run, event["title"])
        elif kind == "experiment_tag":
            self._retry(lambda: client.set_experiment_tag(event["experiment"], event["key"], event["value"]),
                        "tag experiment")
        elif kind == "input":
            inputs.log(client, run, event["context"], event["dataset"], self._retry)
        elif kind == "model":
            logged_model.log(client, event, self._retry)
        elif kind == "end_children":
            end_child_runs(client, run, event["cause"], event["trials"], attempts=self.attempts)
        elif kind == "untag":  # a tag of an earlier attempt (its error) that the run no longer carries
            tags = self._retry(lambda: client.get_run(run).data.tags, "read tags")
            if event["key"] in tags:
                self._retry(lambda: client.delete_tag(run, event["key"]), "untag run")
        elif kind == "end":
            self._retry(lambda: client.set_terminated(run, status=event["status"], end_time=event["end_time"]),
                        "end run")
        else:
            raise ValueError(f"{self.record.where}: unknown event kind {kind!r}")

    def _files(self, client, run: str, folder: str, sources: List[str]) -> None:
        """Copy each existing file of `sources` (paths or URIs) to this machine and log it under `folder`."""
        with tempfile.TemporaryDirectory(prefix="raystream-artifact-") as d:
            for source in sources:
                fs, path = filesystem_at(source)
                if not is_file(fs, path):
                    continue
                local = os.path.join(d, path.rsplit("/", 1)[-1])
                download(fs, path, local)
                self._retry(lambda f=local: client.log_artifact(run, f, folder), "log artifact")

    def _plots(self, client, run: str, title: str) -> None:
        """The gradient-cosine plots of `run`, from the metric history MLflow holds (the metrics are mirrored
        before: they come earlier in the record)."""
        with tempfile.TemporaryDirectory(prefix="raystream-plots-") as d:
            for f in grad_cosine_plots(history(client, run), Path(d) / names.ARTIFACT_PLOTS_DIR, title=title):
                self._retry(lambda f=f: client.log_artifact(run, str(f), names.ARTIFACT_PLOTS_DIR), "log plot")


def mirror_now(where: str, tracking_uri: Optional[str] = None, attempts: int = RETRIES) -> int:
    """Mirror the record `where` in full, failing at the first refused connection (no minutes of HTTP retries);
    a bucket's copy is brought up to date. Returns the metric values written."""
    record = ev.Record(where)
    try:
        with failing_fast():
            return Mirror(record, tracking_uri, attempts).run()
    finally:
        record.sync(force=True)


def drain(where: str, what: str, timeout_s: float = DRAIN_S) -> int:
    """At a run's exit: mirror the record `where` into MLflow, waiting at most `timeout_s` (a store that hangs or
    refuses must not hold the exit), then say on stderr how many events of `what` still wait there and the command
    that writes them. Returns that number (0: MLflow holds the whole record)."""
    failed: List[BaseException] = []

    def write() -> None:
        try:
            mirror_now(where)
        except Exception as exc:  # the store is away: named below
            failed.append(exc)

    writer = threading.Thread(target=write, name="raystream-drain", daemon=True)
    writer.start()
    writer.join(timeout_s)
    left = len(ev.Record(where).pending())
    if left:
        why = first_line(failed[0], 300) if failed else f"not done within {timeout_s:.0f} s"
        print(f"raystream: {left} events of {what} are not in MLflow yet ({why}); they wait in {where}: write them "
              f"with\n  {ev.UPLOAD_COMMAND} {shlex.quote(where)}", file=sys.stderr, flush=True)
    else:
        print(f"raystream: MLflow holds the whole record of {what} ({where})", file=sys.stderr, flush=True)
    return left


def catch_up(where: str, what: str, tracking_uri: Optional[str] = None) -> None:
    """Before a run or a sweep goes on: write what its record `where` holds that an earlier session (`what`) left
    unwritten, a tracking outage at its end, so that this end does not close the run the new session reopens. A
    store that refuses is named; the record keeps it all for the next try."""
    if not ev.Record(where).pending():
        return
    try:
        mirror_now(where, tracking_uri)
    except Exception as exc:
        text = str(exc).strip().splitlines()
        print(f"raystream: WARNING: could not write what {where} holds from {what} into MLflow: "
              f"{type(exc).__name__}: {text[0] if text else ''}; it is kept: run `{ev.UPLOAD_COMMAND} "
              f"{shlex.quote(where)}` to retry", file=sys.stderr, flush=True)


def main(file: str, tracking_uri: Optional[str] = None) -> int:
    """`raystream tracking upload FILE [--tracking-uri URI]` (FILE: a record, or a run directory holding one):
    exit 0 when every whole event is written (said "in full" only when the record also ends with its `end`; a torn
    last line or a missing end is named), 1 when the store still fails, 2 when there is no record."""
    where = file if file.rstrip("/").endswith(ev.FILE_NAME) else ev.path_in(file)
    record = ev.Record(where)
    if not record.exists:
        print(f"raystream tracking upload: no record at {where}", file=sys.stderr)
        return 2
    pending = len(record.pending())
    try:
        written = mirror_now(where, tracking_uri)
    except Exception as exc:  # the store still does not answer: the record stays, with the mark where it got
        text = str(exc).strip().splitlines()
        print(f"raystream tracking upload: MLflow at {tracking_uri or '(the URI in the record)'} failed: "
              f"{type(exc).__name__}: {text[0] if text else ''}; {len(record.pending())} events of {where} are "
              f"still to write: run the command again", file=sys.stderr)
        return 1
    whole = record.read()
    tear = record.torn()
    ended = bool(whole) and whole[-1][0]["kind"] == "end"
    done = f"raystream tracking upload: {pending} events of {where} written ({written} metric values)"
    if tear is None and ended:
        print(f"{done}; the record is mirrored in full")
        return 0
    told = [done]
    if tear is not None:
        told.append(f"its last line {tear[0]} (byte {tear[1]}, {tear[2]} bytes) was cut short (a kill or a full "
                    f"disk) and is skipped")
    if not ended:
        runs = sorted({e["run"] for e, _ in whole if e.get("run")})
        told.append(f"the record holds no end of MLflow run {', '.join(runs) or '?'}, which stays as it was "
                    f"(RUNNING): the run was stopped before its end; resuming it (the same command with its "
                    f"trainer.run_name) ends it")
    print("; ".join(told), file=sys.stderr)
    return 0
