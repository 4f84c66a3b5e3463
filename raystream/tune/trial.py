"""One trial of a sweep, run by Tune in the trial's driver actor: the cell's config plus its sampled values,
checked, then one Ray Train run (`raystream.train.run.fit`, or a stand-in with its signature) whose MLflow child run
carries the trial's grid and sampled values. A trial that fails is recorded as a FAILED child run with its reason;
one that trains to the end during a tracking outage returns, with its result, its record (which MLflow lacks
part of).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List

from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback

from raystream.tracking import names
from raystream.tracking.names import (CELL_TAG, ERROR_TAG, GRID_TAG_PREFIX, ROLE_TAG, SAMPLE_TAG_PREFIX, SWEEP_RUN_TAG,
                                      SWEEP_TAG, TRIAL_TAG)
from raystream.tracking.store import client as mlflow_client
from raystream.tracking.store import failing_fast, retry, tracking_uri, wait_for_store
from raystream.train.run import RunOptions, TrackingUnavailable
from raystream.tune import console
from raystream.tune.release import RecordPlacementGroup
from raystream.tune.searcher import CELL_KEY
from raystream.tune.space import apply_values, structured

ERROR_CHARS = 500
RECORD_RESULT_KEY = "unsent_record"  # in a trial's result: its record, which MLflow lacks part of (an outage)


def trial_main(config: Dict[str, Any], cells: List[Dict[str, Any]], info: Dict[str, Any]) -> Dict[str, Any]:
    """One Tune trial: the cell's config plus the sampled values, checked, then one Ray Train run."""
    cell = int(config[CELL_KEY])
    cfg = structured(cells[cell])
    sampled = {k: v for k, v in config.items() if k in info["sample_keys"]}
    apply_values(cfg, sampled, where="sweep.sample")
    trial_id = tune.get_context().get_trial_id()
    # The MLflow run is named for what sets the trial apart; the Ray Train run (checkpoints, resume) by its id.
    tags = {**trial_tags(info, cell, trial_id, sampled),
            names.RUN_NAME_TAG: names.trial_run_name(info["cell_values"][cell], sampled)}
    callbacks = [TuneReportCallback(), RecordPlacementGroup(trial_id)]
    run_name = f"{info['run_name']}-{trial_id}"
    # A tracking server that is away: this trial waits for it before it starts (a short blip is retried; MLflow's
    # own minutes of HTTP retries would hide the outage).
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    try:
        wait_for_store(tracking_uri(cfg), f"trial {trial_id} ({tags[names.RUN_NAME_TAG]})")
        # The cell's start checkpoint was read and checked before Ray started (check_cells): a multi-GB file is
        # not read again by every trial, unless the trial's sampled values change the model.
        checked = info["init_lines"][cell]
        reshapes = any(k.split(".")[0] in ("scenario", "stream") for k in sampled)
        extra = {"options": RunOptions(init_checked=checked)} if checked is not None and not reshapes else {}
        final = info["fit"](cfg, run_name=run_name, callbacks=callbacks, mlflow_parent_run_id=info["parent_run_id"],
                            mlflow_tags=tags, **extra)
    except TrackingUnavailable as exc:  # trained to the end: its run stays RUNNING until the sweep's upload
        final = {**exc.final, RECORD_RESULT_KEY: exc.path}
    except Exception as exc:
        with failing_fast():  # the store may be what failed: no minutes of HTTP retries
            record_failed_trial(tracking_uri(cfg), info["parent_run_id"], run_name, tags, exc)
        raise
    # `step` (0-based, beside `steps_done`) and `lr` (the schedule's value after the last step, not the one the
    # progress lines average) read wrong in a results table: left out of the trial's result.
    return {k: v for k, v in (final or {}).items() if isinstance(v, (int, float, str, bool)) and
            k not in ("step", names.LR)}


def trial_tags(info: Dict[str, Any], cell: int, trial_id: str, sampled: Dict[str, Any]) -> Dict[str, str]:
    """MLflow tags of a trial's child run: sweep, trial, and its grid and sampled values (what the report reads)."""
    tags = {SWEEP_TAG: info["name"], SWEEP_RUN_TAG: info["run_name"], TRIAL_TAG: trial_id, CELL_TAG: str(cell),
            ROLE_TAG: names.ROLE_TRIAL}
    # Group axes like `optimizer` are no param of the child run: the tags carry every grid value.
    tags.update({f"{GRID_TAG_PREFIX}{k}": str(v) for k, v in info["cell_values"][cell].items()})
    tags.update({f"{SAMPLE_TAG_PREFIX}{k}": repr(v) for k, v in sampled.items()})
    return tags


def error_text(exc: BaseException) -> str:
    """The last non-empty line of `Type: message` (Ray wraps the worker's error; its last line is the cause)."""
    return console.last_line(f"{type(exc).__name__}: {exc}", ERROR_CHARS, default=type(exc).__name__)


def record_failed_trial(uri: str, parent_run_id: str, run_name: str, tags: Dict[str, str],
                        exc: BaseException) -> None:
    """Make the trial a FAILED child run carrying its grid and sampled values and why it failed: its own child run
    when fit got as far as creating one, else a new one (a trial can fail before its Train run starts)."""
    text = error_text(exc)
    try:
        client = mlflow_client(uri)
        parent = retry(lambda: client.get_run(parent_run_id), "get parent run")
        runs = retry(lambda: client.search_runs(
            [parent.info.experiment_id],
            filter_string=f"tags.`{TRIAL_TAG}` = '{tags[TRIAL_TAG]}' and tags.`{names.PARENT_RUN_TAG}` = "
                          f"'{parent_run_id}'"), "find trial run")
        if not runs:
            shown = {**tags, names.PARENT_RUN_TAG: parent_run_id}
            shown_name = shown.pop(names.RUN_NAME_TAG, run_name)
            run = retry(lambda: client.create_run(parent.info.experiment_id, run_name=shown_name, tags=shown),
                        "create failed trial run")
            runs = [run]
        for run in runs:
            retry(lambda run=run: client.set_tag(run.info.run_id, ERROR_TAG, text), "tag failed run")
            retry(lambda run=run: client.set_terminated(run.info.run_id, "FAILED"), "end failed run")
    except Exception as tag_exc:  # the trial's own error matters more than this bookkeeping
        print(f"raystream: could not record the failure of trial {tags.get(TRIAL_TAG)} in MLflow: {tag_exc}",
              file=sys.stderr)

