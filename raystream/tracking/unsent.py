"""What a run could not write to MLflow (the tracking store did not answer), saved beside its checkpoints, and
uploading it once the store answers again: `raystream tracking upload <file>`.

The file is JSON lines: a header, then one `{"key", "value", "step", "timestamp"}` per metric value, in the order the
run logged them. A training run's file is `unsent_metrics.jsonl` in its run directory (a local path or a bucket URI);
a sweep's is `unsent_tracking.jsonl` in the sweep's directory, holding what the sweep writes to its parent run as it
ends. The header names the run (`mlflow_run_id`, `tracking_uri`) and may hold what else is to be written, in this
order:
- `also`: other unsent files (the trials' of a sweep), uploaded first;
- the metric values (lines after the header);
- `tags` (name -> value), `artifacts` (artifact file name -> JSON content), `texts` (artifact file name -> text),
  `files` (artifact folder -> file paths or URIs to copy there, e.g. the final checkpoint's model; missing ones are
  skipped), `plots_title` (the gradient-cosine plots, drawn from the run's metric history once it is written),
  `experiment_tags` (experiment id -> name -> value);
- `end_children` (`{"cause", "trials"}`): the parent's child runs still RUNNING, and those of `trials`, end KILLED
  with `cause` in `raystream.error` (a sweep interrupted during the outage);
- `end_status` (and `end_time`, epoch ms): the run is closed so (set by the driver when the run ended during the
  outage).
Uploading is idempotent: values at or below the step MLflow already holds for their metric are skipped, and the rest
is set again, so an upload cut short can be run again.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, Iterable, List, Optional, Tuple

from raystream.uris import filesystem_at

FILE_NAME = "unsent_metrics.jsonl"
SWEEP_FILE_NAME = "unsent_tracking.jsonl"
UPLOAD_COMMAND = "raystream tracking upload"
MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limit
RETRIES = 4  # tries of each write (sqlite "database is locked"); a store that is away fails in about a second


def path_in(run_dir: str, name: str = FILE_NAME) -> str:
    """The unsent file `name` of directory `run_dir` (a local path or a URI)."""
    return f"{run_dir.rstrip('/')}/{name}"


def write(where: str, header: Dict[str, Any], metrics: Iterable[Any]) -> None:
    """Write the file `where` (replacing it; atomically on a local disk) with `header` and the `Metric`s."""
    lines = [json.dumps(header, sort_keys=True)]
    lines += [json.dumps({"key": m.key, "value": m.value, "step": m.step, "timestamp": m.timestamp}) for m in metrics]
    data = ("\n".join(lines) + "\n").encode()
    fs, path = filesystem_at(where)
    parent = path.rsplit("/", 1)[0]
    fs.create_dir(parent, recursive=True)
    if "://" not in where:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return
    with fs.open_output_stream(path) as f:
        f.write(data)


def read(where: str) -> Optional[Tuple[Dict[str, Any], List[Any]]]:
    """(header, `Metric`s) of the file `where`, or None when there is none."""
    import pyarrow.fs as pafs
    from mlflow.entities import Metric

    fs, path = filesystem_at(where)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        lines = [line for line in f.read().decode().splitlines() if line.strip()]
    if not lines:
        return None
    header = json.loads(lines[0])
    metrics = [Metric(key=d["key"], value=float(d["value"]), timestamp=int(d["timestamp"]), step=int(d["step"]))
               for d in map(json.loads, lines[1:])]
    return header, metrics


def exists(where: str) -> bool:
    import pyarrow.fs as pafs

    fs, path = filesystem_at(where)
    return fs.get_file_info(path).type == pafs.FileType.File


def remove(where: str) -> None:
    import pyarrow.fs as pafs

    fs, path = filesystem_at(where)
    if fs.get_file_info(path).type == pafs.FileType.File:
        fs.delete_file(path)


def recorded_steps(client, run_id: str, keys: Optional[Iterable[str]] = None) -> Dict[str, int]:
    """The highest step MLflow holds for each metric of run `run_id` (only `keys` when given)."""
    if keys is None:
        keys = list(client.get_run(run_id).data.metrics)
    last: Dict[str, int] = {}
    for key in keys:
        history = client.get_metric_history(run_id, key)
        if history:
            last[key] = max(m.step for m in history)
    return last


def new_values(metrics: Iterable[Any], recorded: Dict[str, int]) -> List[Any]:
    """The values of `metrics` (in order) above the step `recorded` holds for their metric."""
    return [m for m in metrics if m.step > recorded.get(m.key, -1)]


def send(client, run_id: str, metrics: List[Any]) -> int:
    """Write `metrics` not yet recorded (in order, in batches MLflow accepts); how many were written."""
    todo = new_values(metrics, recorded_steps(client, run_id, {m.key for m in metrics}))
    for i in range(0, len(todo), MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=todo[i:i + MAX_METRICS_PER_BATCH])
    return len(todo)


def apply(client, header: Dict[str, Any], metrics: List[Any], tracking_uri: Optional[str] = None,
          attempts: int = RETRIES) -> int:
    """Write into MLflow what `header` and `metrics` hold (the module's docstring says what, in which order);
    `tracking_uri` overrides the one the `also` files name; each write is tried `attempts` times (`store.retry`).
    Returns the metric values written."""
    from mlflow.entities import RunTag

    from raystream.tracking.store import end_child_runs, retry

    run_id = header["mlflow_run_id"]
    written = sum(upload(other, tracking_uri)[0] for other in header.get("also") or [] if exists(other))
    written += send(client, run_id, metrics)
    tags = [RunTag(k, str(v)) for k, v in (header.get("tags") or {}).items()]
    if tags:
        retry(lambda: client.log_batch(run_id, tags=tags), "tag run", attempts=attempts)
    for name, content in (header.get("artifacts") or {}).items():
        retry(lambda n=name, c=content: client.log_dict(run_id, c, n), "log artifact", attempts=attempts)
    for name, text in (header.get("texts") or {}).items():
        retry(lambda n=name, t=text: client.log_text(run_id, t, n), "log artifact", attempts=attempts)
    for folder, sources in (header.get("files") or {}).items():
        _log_files(client, run_id, folder, sources, attempts)
    if header.get("plots_title") is not None:
        _log_plots(client, run_id, header["plots_title"], attempts)
    for exp_id, exp_tags in (header.get("experiment_tags") or {}).items():
        for k, v in exp_tags.items():
            retry(lambda e=exp_id, k=k, v=v: client.set_experiment_tag(e, k, v), "tag experiment", attempts=attempts)
    if header.get("end_children"):
        end_child_runs(client, run_id, **header["end_children"], attempts=attempts)
    if header.get("end_status"):
        retry(lambda: client.set_terminated(run_id, status=header["end_status"], end_time=header.get("end_time")),
              "end run", attempts=attempts)
    return written


def _log_files(client, run_id: str, folder: str, sources: List[str], attempts: int) -> None:
    """Copy each existing file of `sources` (paths or URIs) to this machine and log it under artifact `folder`."""
    import pyarrow.fs as pafs

    from raystream.tracking.store import retry

    with tempfile.TemporaryDirectory(prefix="raystream-artifact-") as d:
        for source in sources:
            fs, path = filesystem_at(source)
            if fs.get_file_info(path).type != pafs.FileType.File:
                continue
            local = os.path.join(d, path.rsplit("/", 1)[-1])
            pafs.copy_files(path, local, source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
            retry(lambda f=local: client.log_artifact(run_id, f, folder), "log artifact", attempts=attempts)


def _log_plots(client, run_id: str, title: str, attempts: int) -> None:
    """The gradient-cosine plots of run `run_id`, from the metric history MLflow holds."""
    from pathlib import Path

    from raystream.tracking import names
    from raystream.tracking.plots import grad_cosine_plots, history
    from raystream.tracking.store import retry

    with tempfile.TemporaryDirectory(prefix="raystream-plots-") as d:
        for f in grad_cosine_plots(history(client, run_id), Path(d) / names.ARTIFACT_PLOTS_DIR, title=title):
            retry(lambda f=f: client.log_artifact(run_id, str(f), names.ARTIFACT_PLOTS_DIR), "log plot",
                  attempts=attempts)


def upload(where: str, tracking_uri: Optional[str] = None) -> Tuple[int, Dict[str, Any]]:
    """Upload the file `where` into its MLflow run (at `tracking_uri`, else the one it names), closing the run when
    it says so, and remove the file. Returns (metric values written, header). Raises FileNotFoundError."""
    from raystream.tracking.store import client as make_client

    found = read(where)
    if found is None:
        raise FileNotFoundError(f"no unsent file at {where}")
    header, metrics = found
    written = apply(make_client(tracking_uri or header["tracking_uri"]), header, metrics, tracking_uri)
    remove(where)
    return written, header


def main(file: str, tracking_uri: Optional[str] = None) -> int:
    """`raystream tracking upload FILE [--tracking-uri URI]`: exit 0 when uploaded, 1 when the store still fails."""
    import sys

    from raystream.tracking.store import failing_fast

    try:
        with failing_fast():  # a store still away: one refused connection per write, not minutes of retries
            written, header = upload(file, tracking_uri)
    except FileNotFoundError as exc:
        print(f"raystream tracking upload: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the store still does not answer: the file stays
        text = str(exc).strip().splitlines()
        print(f"raystream tracking upload: MLflow at {tracking_uri or '(the URI in the file)'} failed: "
              f"{type(exc).__name__}: {text[0] if text else ''}; {file} is kept, run the command again",
              file=sys.stderr)
        return 1
    closed = f", run closed as {header['end_status']}" if header.get("end_status") else ""
    also = f" (and the {len(header['also'])} files it names)" if header.get("also") else ""
    print(f"raystream tracking upload: {written} metric values written to MLflow run {header['mlflow_run_id']} at "
          f"{tracking_uri or header['tracking_uri']}{closed}; removed {file}{also}")
    return 0
