"""`raystream report`: the paper-style table and plots of one sweep, read back from MLflow.

Rows are the sweep's grid axes that vary (e.g. optimizer x order x batch size); replicate axes (keys ending in
`seed`) are averaged over, so each cell shows mean +- std over seeds. Where a cell had Optuna-sampled axes, each
seed contributes its best trial by the sweep's metric (the tuned setting, as in the paper's tables) and the
sampled value is shown. Columns are the final `eval/*` metrics, the stream correlation measured at run start
(`correlation/*`), the mean over steps of `grad_cos_prev` (`grad_cos_prev_mean`) and `last_step_loss`, the `loss`
of the last step (the Tune table's `loss` is the mean over the last report window).

Writes `report.md`, `report.csv` and plots (each metric against each numeric grid axis such as
`optimizer.orth_beta` or `stream.batch_size`; histograms of the per-step gradient cosine `grad_cos_prev` per
optimizer, the paper's Figure 3; its curve over steps per row, Figure 1) to `--out` (default
`reports/<sweep run>`), and logs them as artifacts of the sweep's parent run. The `drift/*` columns say how far
each row's weights moved; a sweep over `optimizer.lr` also gets each metric at matched drift
(`matched.md`, `matched.csv`, `<metric>_vs_drift.png`). `--map` reads all the matched-drift sweeps of an experiment
into one table and figure: Orthogonal-AdamW's lead at matched drift against each stream's correlation
(stream_map.py).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import raystream.tracking.names as names
from raystream.study import matched
from raystream.study.plots import plot_grad_cos, plot_grad_cos_curves, plot_vs_axes, slug
from raystream.study.stats import mean
from raystream.study.table import OPTIMIZER_PARAM, Row, Table, Trial, is_number
from raystream.tracking.names import (CORRELATION_PREFIX, ERROR_TAG, GRAD_COS_MEAN, GRID_TAG_PREFIX, ROLE_TAG,
                                      SAMPLE_TAG_PREFIX, TRIALS_ARTIFACT, is_seed_key)
from raystream.tracking.store import TrackingStoreError, prepare_store
from raystream.tracking.store import client as store_client
from raystream.tracking.store import tracking_uri as default_uri

PROGRESS_BAR_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


def _client(tracking_uri: Optional[str]):
    """A client of an existing store (a report creates none: no empty mlflow.db left behind)."""
    uri = tracking_uri or default_uri(None)
    prepare_store(uri, create=False)
    return store_client(uri), uri


def experiment_named(client, experiment: str):
    """The MLflow experiment `experiment`; LookupError naming the experiments the store has when there is none."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        there = sorted(e.name for e in client.search_experiments())
        raise LookupError(f"no MLflow experiment named {experiment!r}; the store has "
                          + (", ".join(repr(n) for n in there) if there else "none"))
    return exp


def find_parent(client, experiment: Optional[str] = None, parent: Optional[str] = None):
    """The sweep's parent run: `parent` by id, else the latest sweep parent run of MLflow experiment `experiment`.
    LookupError naming the experiments the store has when there is no `experiment`, and its single runs when it
    holds no sweep."""
    if parent:
        return client.get_run(parent)
    exp = experiment_named(client, experiment)
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`{ROLE_TAG}` = '{names.ROLE_SWEEP}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        singles = len(single_runs(client, exp.experiment_id))
        raise LookupError(f"MLflow experiment {experiment!r} has no sweep parent run (tag {ROLE_TAG}="
                          f"{names.ROLE_SWEEP}) but {singles} single run(s): `raystream report` tables a sweep's "
                          f"trials; {singles_hint(client.tracking_uri)}")
    return runs[0]


def latest_sweeps(client, experiment: str) -> list:
    """The latest sweep parent run of each sweep file (tag raystream.sweep) in `experiment`, by sweep name.
    LookupError naming the experiments there are when there is no such experiment or it holds no sweep."""
    exp = experiment_named(client, experiment)
    runs = client.search_runs([exp.experiment_id],
                              filter_string=f"tags.`{names.ROLE_TAG}` = '{names.ROLE_SWEEP}'",
                              order_by=["attributes.start_time DESC"], max_results=10000)
    latest = {}
    for run in runs:
        latest.setdefault(run.data.tags.get(names.SWEEP_TAG, run.info.run_name), run)
    if not latest:
        raise LookupError(f"MLflow experiment {experiment!r} holds no sweep")
    return [latest[k] for k in sorted(latest)]


def singles_hint(uri: str) -> str:
    return f"compare single runs (`raystream train`) in the MLflow UI: mlflow ui --backend-store-uri {uri}"


def single_runs(client, experiment_id: str) -> list:
    """The runs of an experiment in no sweep: neither a sweep's parent nor a trial under one (`raystream train`,
    `raystream eval`'s own runs)."""
    runs = client.search_runs([experiment_id], max_results=10000)
    return [r for r in runs if names.PARENT_RUN_TAG not in r.data.tags
            and r.data.tags.get(ROLE_TAG) not in (names.ROLE_SWEEP, names.ROLE_TRIAL)]


def which_sweep(client, parent_run, uri: str) -> str:
    """The line `raystream report --experiment` prints first: the sweep it reports (the experiment's latest), how
    many others there are and how to report one, and the single runs the report leaves out."""
    exp_id = parent_run.info.experiment_id
    sweeps = client.search_runs([exp_id], filter_string=f"tags.`{ROLE_TAG}` = '{names.ROLE_SWEEP}'",
                                max_results=10000)
    experiment = client.get_experiment(exp_id).name
    line = (f"report of sweep {parent_run.info.run_name} (MLflow run {parent_run.info.run_id}), the latest of "
            f"{len(sweeps)} sweep(s) in experiment {experiment!r}")
    if len(sweeps) > 1:
        line += "; another one: raystream report --parent RUN_ID"
    singles = single_runs(client, exp_id)
    if singles:
        line += (f". {len(singles)} single run(s) of the experiment are in no sweep and not in this report: "
                 + singles_hint(uri))
    return line


def load_trials(client, parent_run) -> List[Trial]:
    """The child runs of a sweep, one per Tune trial (the latest run of a trial that was resumed). Metrics are read
    under their current names: a run logged before a rename (`eval/attn_top1`) shares the column of its new name
    (`eval/attentive_top1`; names.RENAMED_METRICS)."""
    runs = client.search_runs([parent_run.info.experiment_id],
                              filter_string=f"tags.`{names.PARENT_RUN_TAG}` = '{parent_run.info.run_id}'",
                              max_results=10000)
    by_trial: Dict[str, Trial] = {}
    for r in runs:
        tags = r.data.tags
        trial = Trial(
            run_id=r.info.run_id, trial_id=tags.get(names.TRIAL_TAG, r.info.run_id), status=r.info.status,
            grid={k[len(GRID_TAG_PREFIX):]: v for k, v in tags.items() if k.startswith(GRID_TAG_PREFIX)},
            sample={k[len(SAMPLE_TAG_PREFIX):]: float(v) for k, v in tags.items()
                    if k.startswith(SAMPLE_TAG_PREFIX) and is_number(v)},
            metrics=names.current_names(r.data.metrics), optimizer=r.data.params.get(OPTIMIZER_PARAM, "?"),
            start_time=r.info.start_time or 0)
        old = by_trial.get(trial.trial_id)
        rank = (trial.status == "FINISHED", trial.start_time)
        if old is None or rank > (old.status == "FINISHED", old.start_time):
            by_trial[trial.trial_id] = trial
    return list(by_trial.values())


def build_table(client, parent_run) -> Table:
    """Group a sweep's trials into the paper-style table (see the module docstring)."""
    tags, params = parent_run.data.tags, parent_run.data.params
    grid = json.loads(tags.get(names.GRID_TAG, "{}"))
    sample_axes = list(json.loads(tags.get(names.SAMPLE_TAG, "{}")))
    metric, mode = params.get("sweep.metric", "loss"), params.get("sweep.mode", "min")
    metric = names.current_name(metric)  # a sweep logged before its metric was renamed
    trials = load_trials(client, parent_run)
    seed_axes = [k for k in grid if is_seed_key(k)]
    row_axes = [k for k in grid if not is_seed_key(k) and len(grid[k]) > 1] or \
               [k for k in grid if not is_seed_key(k)][:1]
    order = {k: [str(v) for v in grid[k]] for k in grid}

    def sort_key(key: Tuple[str, ...]):
        return tuple(order[a].index(v) if v in order[a] else len(order[a]) for a, v in zip(row_axes, key))

    finished = [t for t in trials if t.status == "FINISHED"]
    rows: Dict[Tuple[str, ...], Row] = {}
    best: Dict[Tuple, Trial] = {}
    for t in finished:
        key = tuple(t.grid.get(a, "?") for a in row_axes)
        rows.setdefault(key, Row(key=key, trials=[]))
        replicate = (key, tuple(t.grid.get(a, "?") for a in seed_axes))
        cur = best.get(replicate)
        if cur is None or _better(t.metrics.get(metric, math.nan), cur.metrics.get(metric, math.nan), mode):
            best[replicate] = t
    for (key, _), t in best.items():
        rows[key].trials.append(t)
    failures = []
    for trial_id, cell, why in failed_trials(client, parent_run, trials):
        key = tuple(str(cell.get(a, "?")) for a in row_axes)
        rows.setdefault(key, Row(key=key, trials=[])).failed += 1
        failures.append((trial_id, why))
    for t in finished:  # the paper's Figure 1 figure as a column: the run's mean consecutive-gradient cosine
        cos = [m.value for m in client.get_metric_history(t.run_id, names.GRAD_COS_PREV) if math.isfinite(m.value)]
        if cos:
            t.metrics[GRAD_COS_MEAN] = mean(cos)
    metric_names = sorted({m for t in finished for m in t.metrics
                           if m.startswith((names.EVAL_PREFIX, CORRELATION_PREFIX, names.DRIFT_PREFIX))
                           or m == GRAD_COS_MEAN})
    if any(names.LOSS in t.metrics for t in finished):
        metric_names.append(names.LOSS)
    return Table(sweep=tags.get(names.SWEEP_RUN_TAG, parent_run.info.run_name), parent_run_id=parent_run.info.run_id,
                 row_axes=row_axes, seed_axes=seed_axes, sample_axes=sample_axes, metrics=metric_names,
                 rows=[rows[k] for k in sorted(rows, key=sort_key)], metric=metric, mode=mode, failures=failures)


def failed_trials(client, parent_run, trials: List[Trial]) -> List[Tuple[str, Dict[str, Any], str]]:
    """(trial id, grid values, reason) of each failed trial: from the sweep's `sweep/trials.json` (Tune's view;
    a trial that failed before its Train run started has no child run), else from child runs not FINISHED."""
    bar = os.environ.get(PROGRESS_BAR_ENV)
    os.environ[PROGRESS_BAR_ENV] = "false"  # one small file: no progress bar in the printed report
    try:
        path = client.download_artifacts(parent_run.info.run_id, TRIALS_ARTIFACT)
        recorded = json.loads(Path(path).read_text())
    except Exception:  # no such artifact yet (sweep still running or interrupted)
        recorded = None
    finally:
        if bar is None:
            del os.environ[PROGRESS_BAR_ENV]
        else:
            os.environ[PROGRESS_BAR_ENV] = bar
    if recorded is not None:
        return [(r["trial_id"], r.get("cell") or {}, r.get("error") or "failed") for r in recorded
                if r.get("status") != "finished"]
    out = []
    for t in trials:
        if t.status != "FINISHED":
            why = client.get_run(t.run_id).data.tags.get(ERROR_TAG) or t.status
            out.append((t.trial_id, t.grid, why))
    return out


def _better(a: float, b: float, mode: str) -> bool:
    if math.isnan(b):
        return not math.isnan(a)
    if math.isnan(a):
        return False
    return a < b if mode == "min" else a > b


def write_report(client, parent_run, out: Optional[str] = None) -> Tuple[Table, List[Path]]:
    """Build the table, write report.md / report.csv / plots under `out`, and log them on the parent run."""
    table = build_table(client, parent_run)
    out_dir = Path(out) if out else Path("reports") / slug(table.sweep)
    out_dir.mkdir(parents=True, exist_ok=True)
    md, csv_path = out_dir / "report.md", out_dir / "report.csv"
    md.write_text(table.to_markdown())
    table.write_csv(csv_path)
    files = [md, csv_path, *plot_vs_axes(table, out_dir)]
    for plot in (plot_grad_cos(client, load_trials(client, parent_run), out_dir),
                 plot_grad_cos_curves(client, table, out_dir)):
        if plot:
            files.append(plot)
    files += matched.write(table, out_dir)  # a sweep over optimizer.lr: each metric at matched drift
    for f in files:
        client.log_artifact(parent_run.info.run_id, str(f), artifact_path="report")
    return table, files


def open_store(experiment: Optional[str], tracking_uri: Optional[str]):
    """(client, uri) of the tracking store a report reads; None after saying why it cannot be read."""
    try:
        return _client(tracking_uri)
    except TrackingStoreError as exc:
        missing = f"no MLflow experiment {experiment!r} here: " if experiment else ""
        print(f"raystream report: {missing}{exc} (set MLFLOW_TRACKING_URI to the store the runs wrote)",
              file=sys.stderr)
        return None


def main(experiment: Optional[str] = None, parent: Optional[str] = None, out: Optional[str] = None,
         tracking_uri: Optional[str] = None) -> int:
    """`raystream report (--experiment NAME | --parent RUN_ID) [--out DIR]`: print the table, write the files.
    (`--map --experiment NAME`, the map of an experiment's matched-drift sweeps, is stream_map.py's.)"""
    store = open_store(experiment, tracking_uri)
    if store is None:
        return 2
    client, uri = store
    try:
        parent_run = find_parent(client, experiment=experiment, parent=parent)
    except LookupError as exc:
        print(f"raystream report: {exc} (tracking URI {uri})", file=sys.stderr)
        return 2
    except Exception as exc:  # mlflow raises MlflowException for an unknown run id
        print(f"raystream report: no run {parent!r} in {uri}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    if experiment:
        print(which_sweep(client, parent_run, uri))
    table, files = write_report(client, parent_run, out)
    print(table.to_markdown())
    text = matched.markdown(table)  # '' unless the sweep varies optimizer.lr
    if text:
        print(text)
    print(f"wrote {', '.join(str(f) for f in files)} (also artifacts of MLflow run {parent_run.info.run_id})")
    return 0
