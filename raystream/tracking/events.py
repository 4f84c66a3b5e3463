"""A run's record: every metric, tag and artifact that a run writes to MLflow from rank 0 (its step metrics), from
its driver (its end) and from a sweep's parent run is first appended to `<run dir>/events.jsonl`, in order;
`raystream.tracking.mirror` replays the record into MLflow, live and as `raystream tracking upload`. W&B's design:
the local file is the record, MLflow its mirror; a tracking outage is no mode of its own, only a mirror behind.

One JSON object a line, each one MLflow write (`run`: the MLflow run id it goes to):
    {"kind": "open", "run", "tracking_uri"}              where the events after it go (written at each opening)
    {"kind": "metrics", "run", "step", "timestamp", "values": {key: value}}   one step's metric values
    {"kind": "tag", "run", "key", "value"}
    {"kind": "untag", "run", "key"}                      the tag is removed (an earlier attempt's error, on success)
    {"kind": "json" | "text", "run", "name", "content"}  an artifact file `name` with this content
    {"kind": "files", "run", "folder", "sources"}        files (paths or URIs) copied under an artifact folder
    {"kind": "plots", "run", "title"}                    the gradient-cosine plots, from the run's metric history
    {"kind": "experiment_tag", "experiment", "key", "value"}
    {"kind": "end_children", "run", "cause", "trials"}   the run's RUNNING child runs, and those of the sweep's
                                                         `trials` (ids), end KILLED with `cause` as their error
    {"kind": "record", "path"}                           another run's record (a sweep's trials): mirrored first
    {"kind": "input", "run", "context", "dataset": {name, digest, source_type, source, schema, profile}}
                                                         a dataset input of the run (tracking/inputs.py)
    {"kind": "model", "run", "name", "step", "checkpoint", "config", "metrics", "register"}
                                                         a checkpoint as a LoggedModel of the run, its metrics linked,
                                                         registered as register {name, alias} (tracking/logged_model.py)
    {"kind": "end", "run", "status", "end_time"}         the run ends so (end_time: epoch ms, or null: now)
Beside it, `events.jsonl.mirrored` holds how far (in bytes) the mirror got.

A record survives its own tear (a kill or a full disk mid-line): a reader stops before a last line without its
newline (`torn` names it: line number, byte offset), skips a whole line in the middle that is not one event, naming
it once with its line number and offset, and a writer that opens a record ending without a newline first cuts that
torn line off (`seal`, said once), so the events it appends are never glued onto half a line.

A run directory in a bucket: the record is appended to a local copy (under the system temp directory) and copied
whole to the bucket by `sync()` (rank 0 at most every SYNC_PERIOD_S and when it closes, the driver at the end).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

from raystream import diskspace
from raystream.uris import download, filesystem_at, is_file, is_uri, write_bytes

FILE_NAME = "events.jsonl"
MIRRORED_SUFFIX = ".mirrored"
UPLOAD_COMMAND = "raystream tracking upload"
SYNC_PERIOD_S = 30.0  # a bucket's copy of the record: at most this often while a run trains


def path_in(run_dir: str) -> str:
    """The record of run directory `run_dir` (a local path or a URI)."""
    return f"{run_dir.rstrip('/')}/{FILE_NAME}"


# ---- the events ---------------------------------------------------------------------------------------------------
def opened(run: str, tracking_uri: str) -> Dict[str, Any]:
    return {"kind": "open", "run": run, "tracking_uri": tracking_uri}


def metrics(run: str, step: int, values: Dict[str, float], timestamp: int) -> Dict[str, Any]:
    return {"kind": "metrics", "run": run, "step": step, "timestamp": timestamp, "values": values}


def tag(run: str, key: str, value: Any) -> Dict[str, Any]:
    return {"kind": "tag", "run": run, "key": key, "value": str(value)}


def untag(run: str, key: str) -> Dict[str, Any]:
    return {"kind": "untag", "run": run, "key": key}


def artifact(run: str, name: str, content: Any) -> Dict[str, Any]:
    """An artifact file `name`: text as it is (a str), anything else as JSON."""
    return {"kind": "text" if isinstance(content, str) else "json", "run": run, "name": name, "content": content}


def files(run: str, folder: str, sources: List[str]) -> Dict[str, Any]:
    return {"kind": "files", "run": run, "folder": folder, "sources": list(sources)}


def plots(run: str, title: str) -> Dict[str, Any]:
    return {"kind": "plots", "run": run, "title": title}


def experiment_tag(experiment: str, key: str, value: str) -> Dict[str, Any]:
    return {"kind": "experiment_tag", "experiment": experiment, "key": key, "value": value}


def end_children(run: str, cause: str, trials: List[str]) -> Dict[str, Any]:
    return {"kind": "end_children", "run": run, "cause": cause, "trials": list(trials)}


def dataset_input(run: str, context: str, dataset: Dict[str, Any]) -> Dict[str, Any]:
    return {"kind": "input", "run": run, "context": context, "dataset": dict(dataset)}


def model(run: str, name: str, step: int, checkpoint: str, config: Dict[str, Any], metrics: List[Dict[str, Any]],
          register: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Checkpoint directory `checkpoint` (path or URI) as LoggedModel `name` of `run` at `step`; `config`: the run's
    resolved config (what rebuilds the model); `metrics`: [{key, value, step, timestamp}] linked to it."""
    return {"kind": "model", "run": run, "name": name, "step": int(step), "checkpoint": checkpoint,
            "config": config, "metrics": list(metrics), "register": register}


def record(path: str) -> Dict[str, Any]:
    return {"kind": "record", "path": path}


def end(run: str, status: str, end_time: Optional[int] = None) -> Dict[str, Any]:
    return {"kind": "end", "run": run, "status": status, "end_time": end_time}


# ---- the file -----------------------------------------------------------------------------------------------------
class Record:
    """The append-only record at `where` (a local path, or a URI whose local copy this process appends to)."""

    def __init__(self, where: str):
        self.where = where
        self.remote = is_uri(where)
        self.local = _local_copy(where) if self.remote else os.path.abspath(where)
        self._out = None
        self._synced = 0.0
        if self.remote:
            self._pull()

    @property
    def exists(self) -> bool:
        return os.path.isfile(self.local)

    def append(self, events: Iterable[Dict[str, Any]]) -> None:
        """Append `events` (buffered: `flush` makes them readable to the mirror); a torn last line is cut off
        first (`seal`)."""
        if self._out is None:
            os.makedirs(os.path.dirname(self.local), exist_ok=True)
            self.seal()
            self._out = open(self.local, "a", encoding="utf-8")
        text = "".join(json.dumps(event, sort_keys=True) + "\n" for event in events)
        try:
            self._out.write(text)
        except OSError as exc:
            raise self._full(exc, len(text.encode())) from None

    def flush(self) -> None:
        if self._out is not None:
            try:
                self._out.flush()
            except OSError as exc:
                raise self._full(exc, None) from None

    def _full(self, exc: OSError, needed: Optional[int]) -> OSError:
        """A write of the record that failed for space, named (`raystream.diskspace`); other errors as they are."""
        if not diskspace.is_full(exc):
            return exc
        return diskspace.named(exc, self.local, needed)

    def close(self) -> None:
        if self._out is not None:
            out, self._out = self._out, None
            try:
                out.close()
            except OSError as exc:
                raise self._full(exc, None) from None
        self.sync(force=True)

    def read(self, start: int = 0, limit: Optional[int] = None) -> List[Tuple[Dict[str, Any], int]]:
        """(event, the byte offset just after it) of each complete line from byte `start` on (the first `limit`).
        A last line without its newline is left out (being written, or torn: `torn` names it); a whole line that
        is not one event (a tear that an older writer appended to) is skipped, named once on stderr."""
        if not self.exists:
            return []
        found, offset = [], start
        with open(self.local, "rb") as f:
            f.seek(start)
            for line in f:
                if not line.endswith(b"\n") or (limit is not None and len(found) >= limit):
                    break  # being written, or enough
                offset += len(line)
                if line.strip():
                    event = _event(line)
                    if event is None:
                        self._name_broken(offset - len(line), len(line))
                    else:
                        found.append((event, offset))
        return found

    def torn(self) -> Optional[Tuple[int, int, int]]:
        """(line number, byte offset, bytes) of a last line without its newline (a kill or a full disk cut it,
        or it is being written), or None when the record ends with a whole line."""
        if not self.exists:
            return None
        size = os.path.getsize(self.local)
        if size == 0:
            return None
        with open(self.local, "rb") as f:
            data = f.read()
        if data.endswith(b"\n"):
            return None
        start = data.rfind(b"\n") + 1
        return data.count(b"\n", 0, start) + 1, start, size - start

    def seal(self) -> None:
        """Before appending: cut off a torn last line, so that the next event starts a line of its own (what the
        torn line held is lost; the events before it are whole). Said once, naming the line."""
        tear = self.torn()
        if tear is None:
            return
        line, offset, size = tear
        os.truncate(self.local, offset)
        print(f"raystream: {self.where}: line {line} (byte {offset}, {size} bytes) was cut short (a kill or a full "
              f"disk): removed before appending", file=sys.stderr, flush=True)

    def _name_broken(self, offset: int, size: int) -> None:
        if (self.local, offset) in _NAMED:
            return
        _NAMED.add((self.local, offset))
        with open(self.local, "rb") as f:
            line = f.read(offset).count(b"\n") + 1
        print(f"raystream: WARNING: {self.where}: line {line} (byte {offset}, {size} bytes) is not one whole event "
              f"(a torn line that more was written after): skipped", file=sys.stderr, flush=True)

    @property
    def mirrored(self) -> int:
        """Bytes of the record the mirror has written to MLflow."""
        try:
            with open(self.local + MIRRORED_SUFFIX, encoding="utf-8") as f:
                return int(f.read().strip() or 0)
        except FileNotFoundError:
            return 0

    def set_mirrored(self, offset: int) -> None:
        tmp = f"{self.local}{MIRRORED_SUFFIX}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(str(offset))
            os.replace(tmp, self.local + MIRRORED_SUFFIX)
        except OSError as exc:  # a full disk: no temp file left behind (the mark stays where it was)
            if os.path.exists(tmp):
                os.remove(tmp)
            raise self._full(exc, len(str(offset))) from None

    def pending(self) -> List[Dict[str, Any]]:
        """The events the mirror has not written yet."""
        return [e for e, _ in self.read(self.mirrored)]

    def last_steps(self, run: str) -> Dict[str, int]:
        """The highest step of each metric of run `run` in the record."""
        last: Dict[str, int] = {}
        for e, _ in self.read():
            if e["kind"] == "metrics" and e["run"] == run:
                for key in e["values"]:
                    last[key] = max(last.get(key, -1), int(e["step"]))
        return last

    def sync(self, force: bool = False) -> None:
        """A record in a bucket: copy the local record (and how far it is mirrored) there; at most every
        SYNC_PERIOD_S unless `force`."""
        if not self.remote or not self.exists or (not force and time.monotonic() - self._synced < SYNC_PERIOD_S):
            return
        self.flush()
        fs, path = filesystem_at(self.where)
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        for local, remote in ((self.local, path), (self.local + MIRRORED_SUFFIX, path + MIRRORED_SUFFIX)):
            if os.path.isfile(local):
                with open(local, "rb") as f:
                    write_bytes(fs, remote, f.read())
        self._synced = time.monotonic()

    def _pull(self) -> None:
        """Start from the bucket's copy when it is longer than this machine's (written on another node); none in
        the bucket: start afresh (a copy here is of a run directory since removed)."""
        import pyarrow.fs as pafs  # lazy: only for a record in a bucket; every CLI command loads this module

        fs, path = filesystem_at(self.where)
        info = fs.get_file_info(path)
        if info.type != pafs.FileType.File:
            for stale in (self.local, self.local + MIRRORED_SUFFIX):
                if os.path.isfile(stale):
                    os.remove(stale)
            return
        if self.exists and os.path.getsize(self.local) >= info.size:
            return
        os.makedirs(os.path.dirname(self.local), exist_ok=True)
        for remote, local in ((path, self.local), (path + MIRRORED_SUFFIX, self.local + MIRRORED_SUFFIX)):
            if is_file(fs, remote):
                download(fs, remote, local)


_NAMED: set = set()  # (record, offset) of the broken lines named in this process


def _event(line: bytes) -> Optional[Dict[str, Any]]:
    """The event a whole line holds, or None when it is not one (torn, or two halves glued together)."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and "kind" in event else None


def _local_copy(uri: str) -> str:
    key = hashlib.sha1(uri.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "raystream-records", key, FILE_NAME)
