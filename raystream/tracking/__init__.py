"""raystream.tracking: MLflow recording. It records the plain events and values the layers above hand it and imports
none of data, eval, models, train, tune or study (the contracts in pyproject.toml's [tool.importlinter]).

    config.py          TrackingConfig: the `mlflow` section of the run config (plain data)
    names.py           the names of what runs record: metrics, tags, params, artifacts, and their renames
    store.py           where records live: tracking_uri, prepare_store, client, start_run / end_run, retries
    events.py          a run's record, <run dir>/events.jsonl: every write to MLflow, in order
    mirror.py          the record into MLflow by (key, step), live and as `raystream tracking upload`
    logger.py          StepLogger: each (metric, step) once, never blocking, appended to the record
    plots.py           a run's gradient-cosine figures (the paper's Figures 1 and 3) from its metric history
    system_metrics.py  a node's system metrics in its MLflow run (NodeMonitor)
    parent.py          a sweep's parent run: created or resumed, and each session's end
    ui.py              the MLflow UI page comparing a sweep's trials, and the lines that open it
    inputs.py          a run's videos as MLflow dataset inputs (digest)
    logged_model.py    checkpoints as LoggedModels; a start registered as a model version
    registry.py        a models:/<name>@<alias> start, fetched into the node's cache
The analysis of finished runs (`raystream report`) is raystream.study's.
"""

from raystream.tracking import names
from raystream.tracking.logger import StepLogger
from raystream.tracking.plots import grad_cosine_plots
from raystream.tracking.store import (TrackingStoreError, artifact_location, client, end_run, experiment_id,
                                      prepare_store, start_run, tracking_uri)

__all__ = ["names", "StepLogger", "grad_cosine_plots", "artifact_location", "client", "end_run", "experiment_id",
           "prepare_store", "start_run", "tracking_uri", "TrackingStoreError"]
