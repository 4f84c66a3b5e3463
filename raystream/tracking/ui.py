"""The MLflow UI page that compares a sweep's trials, and the lines that open it.

MLflow 3's UI folds child runs under their parent and, for an experiment without runs yet, opens on a GenAI
overview. A shared view of the runs table avoids both: the UI opens `#/experiments/<id>/runs?viewStateShareKey=<key>`
with the view saved in the experiment tag `mlflow.sharedViewState.<key>` (what its "Share" button writes: a search
filter, the sort, the columns and the grouping). Each sweep writes one, keyed by its run name: its runs only,
grouped by `raystream.role` (the parent in one group, every trial listed in the other, each metric averaged on
the group's row), the grid values and the metrics as columns.

`open_lines` are the last lines a sweep prints: for a local store (sqlite file, directory) the `mlflow ui` command
with the store's absolute URI (it works from any directory) and the link it will serve; for a tracking server,
the link on that server.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple
from urllib.parse import quote

from raystream.tracking import names
from raystream.tracking.store import retry

UI_HOST, UI_PORT = "127.0.0.1", 5000  # where `mlflow ui` serves by default
# One server process (MLflow starts 4): enough for one user, and it starts in seconds on a small machine.
VIEW_ROLE_GROUP = {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": names.ROLE_TAG}]}


def column(kind: str, key: str) -> str:
    """A runs-table column as the UI names it: `params`, `metrics` or `tags`, then the key in backticks."""
    return f"{kind}.`{key}`"


def view_state(run_name: str, columns: Sequence[str]) -> Dict[str, Any]:
    """The shared view of sweep `run_name`'s runs (parent and trials), oldest first, grouped by role."""
    return {"searchFilter": f"tags.`{names.SWEEP_RUN_TAG}` = '{run_name}'",
            "orderByKey": "attributes.start_time", "orderByAsc": True,
            "selectedColumns": list(columns), "groupBy": VIEW_ROLE_GROUP}


def view_tag(run_name: str, columns: Sequence[str]) -> Tuple[str, str]:
    """The experiment tag (name, value) that saves sweep `run_name`'s view."""
    return names.SHARED_VIEW_TAG_PREFIX + run_name, json.dumps(view_state(run_name, columns))


def write_view(client, experiment_id: str, run_name: str, columns: Sequence[str]) -> None:
    """Save the comparison view of sweep `run_name` on its experiment (written again when the columns change). A
    store that refuses it costs the view, not the sweep: the link then opens the experiment's runs (MLflow says
    the share key does not exist)."""
    key, state = view_tag(run_name, columns)
    try:
        retry(lambda: client.set_experiment_tag(experiment_id, key, state), "tag experiment")
    except Exception as exc:
        print(f"raystream: could not save the MLflow UI view of {run_name}: {type(exc).__name__}: {exc}",
              file=sys.stderr)


def is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def view_url(uri: str, experiment_id: str, run_name: str) -> str:
    """The link to sweep `run_name`'s comparison: on the tracking server `uri`, else on a local `mlflow ui`."""
    base = uri.rstrip("/") if is_server(uri) else f"http://{UI_HOST}:{UI_PORT}"
    # workflowType: MLflow 3.17's UI takes its workflow (GenAI or training) from the link, not mlflow.experimentKind
    return (f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
            f"&viewStateShareKey={quote(run_name)}")


def mlflow_command() -> str:
    """`mlflow` beside this Python (a venv's, usable without activating it), else `mlflow` from PATH."""
    beside = Path(sys.executable).parent / "mlflow"
    return str(beside) if beside.exists() else "mlflow"


def open_lines(uri: str, experiment_id: str, run_name: str, trials: int) -> List[str]:
    """What the sweep prints last: how to open the comparison of its `trials` runs; the link is the last line."""
    url = view_url(uri, experiment_id, run_name)
    if is_server(uri):
        return [f"Compare the {trials} trials in the MLflow UI:", f"  {url}"]
    return [f"Compare the {trials} trials in the MLflow UI: start it, then open the link:",
            f"  {shlex.quote(mlflow_command())} ui --backend-store-uri {shlex.quote(uri)} --host {UI_HOST} "
            f"--port {UI_PORT} --workers 1",
            f"  {url}"]
