"""Names of what a raystream run records in MLflow, in one place so the trainer, Tune and the report agree.

Per-step metrics (MLflow `step` = the global batch index t, 0-based, whatever the number of workers):
    loss, lr, grad_cos_prev (cos of consecutive raw gradients), grad_cos_ema (cos(g_t, c_{t-1}), orthogonal
    optimizers), update_norm_ratio (||u|| / ||g||), grad_norm (before clipping), clips_per_s, in_stream/<m>
    (the scenario's measure on the incoming batch before the update, e.g. in_stream/mse), wd (the decayed
    group's weight decay; only when it is scheduled, optimizer.weight_decay_end set).
Evaluation metrics (step = the last step trained before the evaluation):
    eval/<m> from scenario.evaluate (eval/knn_top1, eval/linear_top1, eval/psnr_out_of_stream, ...),
    eval/<m>_in_stream (in_stream/<m> averaged over every step of the run), eval/loss_in_stream (same for loss).
Drift (same steps as eval/*, and at the end): drift/params (||θ_t - θ_0|| / ||θ_0|| over
    the trained parameters, θ_0 the run's start), drift/<module> for a module the evaluations read besides them
    (DoRA: drift/teacher_backbone).
Tags: raystream.run_name, raystream.run_dir (the Ray Train run directory: checkpoints), raystream.status,
    raystream.error (why a run failed), raystream.warning.
Artifacts: config.yaml (resolved config), plots/grad_cosine.png, plots/grad_cosine_hist.png.
MLflow objects (tracking/inputs.py, tracking/logged_model.py): dataset inputs (context training / heldout / probe),
    LoggedModels of the final and the kept evaluation checkpoints (tag raystream.step), registered starts
    (raystream-table1-start, alias s<seed>).
Sweeps (written by the sweep's driver and its trials, read by `raystream report`):
    parent run tags raystream.role=sweep, raystream.sweep, raystream.sweep_run, raystream.grid (JSON of the axes
    that ran), raystream.sample, raystream.command, raystream.trials_<finished|failed|unfinished>,
    raystream.active_seconds; artifact sweep/trials.json (every trial's grid values, status, error);
    child run tags raystream.role=trial, raystream.trial_id, raystream.cell, raystream.grid.<key>,
    raystream.sample.<key>, raystream.error (why a failed trial failed).
"""

from __future__ import annotations

from typing import Dict, Mapping

LOSS = "loss"
LR = "lr"
WD = "wd"
GRAD_COS_PREV = "grad_cos_prev"
GRAD_COS_EMA = "grad_cos_ema"
UPDATE_NORM_RATIO = "update_norm_ratio"
GRAD_NORM = "grad_norm"
CLIPS_PER_S = "clips_per_s"

# One name per quantity: `loss` in the Tune table and the `raystream train` summary is the mean over the last
# report window (what ray.train.report carries); the report's column is the last step's logged `loss`.
LAST_STEP_LOSS = "last_step_loss"

IN_STREAM_PREFIX = "in_stream/"
EVAL_PREFIX = "eval/"
# Names a metric had in runs logged before it was renamed: the report reads them under the current name, so a
# sweep of older runs and newer ones shares one column. (The default protocol's attentive probe was `eval/attn_top1`
# until 2026-11-27, the V-JEPA protocol's `eval/attentive_top1`: one quantity, one name.)
RENAMED_METRICS = {"eval/attn_top1": "eval/attentive_top1"}
DRIFT_PREFIX = "drift/"
DRIFT_PARAMS = DRIFT_PREFIX + "params"
TIME_PREFIX = "time/"  # time/<phase>_s: a worker's seconds in start, correlation, steps, checkpoint, evaluation

# The stream correlation at run start (the paper's Figure 1 as a pre-flight figure):
# mean cosine of consecutive batches' gradients, the pass's mean gradient removed (and raw), logged at step 0.
CORRELATION_PREFIX = "correlation/"
CORRELATION_SEQUENTIAL = CORRELATION_PREFIX + "sequential"
CORRELATION_SHUFFLED = CORRELATION_PREFIX + "shuffled"
CORRELATION_SEQUENTIAL_RAW = CORRELATION_PREFIX + "sequential_raw"
CORRELATION_SHUFFLED_RAW = CORRELATION_PREFIX + "shuffled_raw"
GRAD_COS_MEAN = "grad_cos_prev_mean"  # report column: mean over the run's steps of grad_cos_prev

TAG_RUN_NAME = "raystream.run_name"
TAG_RUN_DIR = "raystream.run_dir"
TAG_INIT = "raystream.init"  # what scenario.backbone.init loaded, in one line (absent for random weights)
TAG_STATUS = "raystream.status"
TAG_ERROR = "raystream.error"  # why a run failed (e.g. "loss is nan at step 17: the run diverged ...")
TAG_WARNING = "raystream.warning"  # e.g. a resume whose earlier steps are in an MLflow run that is gone
PARENT_RUN_TAG = "mlflow.parentRunId"  # MLflow's own tag: the run is shown nested under this one
GIT_COMMIT_TAG = "mlflow.source.git.commit"  # MLflow's own tags
NOTE_TAG = "mlflow.note.content"  # a run's description in the MLflow UI (markdown)
RUN_NAME_TAG = "mlflow.runName"  # MLflow's own: given in a run's tags, it names the MLflow run (store.start_run)
# Experiment tag prefix of a view of the runs table the MLflow UI opens from `#/experiments/<id>/runs?
# viewStateShareKey=<key>` (its search filter, columns and grouping; one per sweep).
SHARED_VIEW_TAG_PREFIX = "mlflow.sharedViewState."
# Experiment tag the MLflow 3 UI reads to pick an experiment's first page: this kind opens on the runs table
# (with no kind, an experiment without runs yet is shown as a GenAI overview).
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"

# Sweeps: the parent run and one child run per trial.
ROLE_TAG = "raystream.role"  # ROLE_SWEEP on the parent, ROLE_TRIAL on each child
ROLE_SWEEP, ROLE_TRIAL = "sweep", "trial"
SWEEP_TAG = "raystream.sweep"  # the sweep file's name
SWEEP_RUN_TAG = "raystream.sweep_run"  # the sweep's run name (<name>-<hash>)
GRID_TAG = "raystream.grid"  # parent: JSON {axis: [values that ran]}
SAMPLE_TAG = "raystream.sample"  # parent: JSON {axis: sample spec}
COMMAND_TAG = "raystream.command"
ACTIVE_SECONDS_TAG = "raystream.active_seconds"  # parent: seconds the sweep ran, pauses between resumes excluded
TRIAL_TAG = "raystream.trial_id"
CELL_TAG = "raystream.cell"
GRID_TAG_PREFIX = "raystream.grid."  # child: raystream.grid.<key> = its grid value
SAMPLE_TAG_PREFIX = "raystream.sample."  # child: raystream.sample.<key> = its sampled value
ERROR_TAG = "raystream.error"  # why a trial failed, on its child run
# The `raystream.error` of a run (or sweep) a signal interrupted (ended KILLED), by the signal's name.
INTERRUPTED_CAUSES = {"SIGINT": "interrupted (SIGINT: Ctrl-C)",
                      "SIGTERM": "interrupted (SIGTERM: a job scheduler, `timeout` or `ray job stop`)"}
TRIALS_ARTIFACT = "sweep/trials.json"  # on the parent run: every trial's grid values, status and error


# A trial's MLflow run name is its grid values, short enough for the runs table (it cuts names at about 20
# characters): these words are shortened, and a numeric axis gets the prefix of its last key part.
SHORT_WORDS = (("orthogonal_", "orth_"), ("batch_along_", ""), ("slower_", "slow_"))
SHORT_KEYS = {"seed": "s", "orth_beta": "b", "beta": "b", "batch_size": "bs", "lr": "lr", "weight_decay": "wd"}


def path_tail(text: str) -> str:
    """A path or URI's last part (`~/.cache/raystream/starts/table1_start` -> `table1_start`); other text as it is:
    what tells trials apart when a grid axis takes paths (`scenario.backbone.init`)."""
    return (text.rstrip("/").rsplit("/", 1)[-1] or text) if "/" in text else text


def short_value(key: str, value) -> str:
    """One grid or sampled value as it appears in a trial's run name: `optimizer.orth_beta`=0.99 -> `b0.99`,
    `trainer.seed`=0 -> `s0`, `stream.order`=batch_along_time -> `time`, `optimizer.lr`=3.21e-4 -> `lr0.000321`,
    a path -> its last part (`~/.cache/raystream/starts/table1_start` -> `table1_start`)."""
    part = key.rsplit(".", 1)[-1]
    if isinstance(value, bool):
        return f"{part}_{'on' if value else 'off'}"
    if isinstance(value, (int, float)):
        return f"{SHORT_KEYS.get(part, ''.join(w[:1] for w in part.split('_')))}{value:.3g}"
    text = path_tail(str(value))
    for long, short in SHORT_WORDS:
        text = text.replace(long, short)
    return text


def trial_run_name(values, sampled=None) -> str:
    """The MLflow run name of a sweep trial: what sets it apart from its siblings, most distinguishing first: the
    grid values in the sweep file's axis order with replicate axes (seeds) last, then the sampled values
    (`orth_adamw-time-s0`, `adamw-shuffled-s1-lr0.000321`). "base" for a sweep with no axes."""
    keys = [k for k in values if not is_seed_key(k)] + [k for k in values if is_seed_key(k)]
    parts = [short_value(k, values[k]) for k in keys]
    parts += [short_value(k, v) for k, v in (sampled or {}).items()]
    return "-".join(parts) or "base"


def interrupted_cause(signame: str) -> str:
    """The `raystream.error` text of a run interrupted by `signame`."""
    return INTERRUPTED_CAUSES.get(signame, f"interrupted ({signame})")


def trials_count_tag(status: str) -> str:
    """`raystream.trials_finished` (failed, unfinished): how many trials of a sweep ended so."""
    return f"raystream.trials_{status}"


def is_seed_key(key: str) -> bool:
    """Grid axes whose values are replicates (averaged over in the report), e.g. `trainer.seed`."""
    return key == "seed" or key.endswith(".seed")

ARTIFACT_CONFIG = "config.yaml"
ARTIFACT_PLOTS_DIR = "plots"
ARTIFACT_SKIPPED_VIDEOS = "skipped_videos.json"  # data.on_bad_video=skip: [{"video", "reason"}] of the videos left out
TAG_SKIPPED_VIDEOS = "raystream.skipped_videos"  # how many (the artifact lists which and why)


def current_name(metric: str) -> str:
    """A metric's name now: `eval/attn_top1` (logged before 2026-11-27) -> `eval/attentive_top1`; others as they are."""
    return RENAMED_METRICS.get(metric, metric)


def current_names(metrics: Mapping[str, float]) -> Dict[str, float]:
    """A run's metrics under their current names (`current_name`); a value logged under the new name wins."""
    out = {current_name(k): v for k, v in metrics.items() if k in RENAMED_METRICS}
    out.update((k, v) for k, v in metrics.items() if k not in RENAMED_METRICS)
    return out


def report_column(metric: str) -> str:
    """The report's column name of a run metric (`loss` -> `last_step_loss`; eval/* as they are)."""
    return LAST_STEP_LOSS if metric == LOSS else metric


def eval_name(metric: str) -> str:
    """`knn_top1` -> `eval/knn_top1` (names already prefixed are returned as they are)."""
    return metric if metric.startswith(EVAL_PREFIX) else EVAL_PREFIX + metric


def in_stream_average_name(key: str) -> str:
    """`in_stream/mse` (or `loss`) -> `eval/mse_in_stream` (`eval/loss_in_stream`): its average over the stream."""
    return f"{EVAL_PREFIX}{key.removeprefix(IN_STREAM_PREFIX)}_in_stream"


def drift_name(group: str) -> str:
    """`params` -> `drift/params`, `teacher_backbone` -> `drift/teacher_backbone`."""
    return DRIFT_PREFIX + group
