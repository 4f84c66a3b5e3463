"""raystream.tracking: MLflow set-up, the names of what runs record, exactly-once step logging, plots.

    tracking_uri(cfg) -> str         # cfg.mlflow.tracking_uri, else MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db
    start_run(client, experiment=, uri=, run_name=, parent_run_id=, tags=, resume_run_id=) -> run id
    StepLogger(uri, run_id, record).log(metrics, step); .flush(); .close()  # each (metric, step) once, never
                                                           # blocking: appended to the record, mirrored behind
    events.Record(path)              # a run's record, <run dir>/events.jsonl: every write to MLflow, in order
    mirror.mirror_now(path)          # the record into MLflow by (key, step); `raystream tracking upload`
    parent.open_parent / ParentClose # a sweep's parent run: created or resumed, and each session's end
    grad_cosine_plots(series, out_dir)                     # the paper's Figures 1 and 3
    prepare_store(uri, create=True)  # before Ray starts: reachable, writable, a new sqlite store fully created
    report.main(experiment=, parent=, out=)                # `raystream report`: a sweep's table from MLflow
    inputs.input_events(cfg, run, videos, needs)           # the run's videos as MLflow dataset inputs (digest)
    logged_model.model_events(...) / .log(...)             # checkpoints as LoggedModels; a start registered
    registry.resolve("models:/<name>@<alias>")             # a models:/ start, fetched into the node's cache
Metric, tag and artifact names: raystream/tracking/names.py.
"""

from raystream.tracking import names
from raystream.tracking.logger import StepLogger
from raystream.tracking.plots import grad_cosine_plots
from raystream.tracking.store import (TrackingStoreError, artifact_location, client, end_run, experiment_id,
                                      prepare_store, start_run, tracking_uri)

__all__ = ["names", "StepLogger", "grad_cosine_plots", "artifact_location", "client", "end_run", "experiment_id",
           "prepare_store", "start_run", "tracking_uri", "TrackingStoreError"]
