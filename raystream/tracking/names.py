"""Names of what a raystream run records in MLflow, in one place so the trainer, Tune and the report agree.

Per-step metrics (MLflow `step` = the global batch index t, 0-based, whatever the number of workers):
    loss, lr, grad_cos_prev (cos of consecutive raw gradients), grad_cos_ema (cos(g_t, c_{t-1}), orthogonal
    optimizers), update_norm_ratio (||u|| / ||g||), grad_norm (before clipping), clips_per_s, in_stream/<m>
    (the scenario's measure on the incoming batch before the update, e.g. in_stream/mse), wd (the decayed
    group's weight decay; only when it is scheduled, optimizer.weight_decay_end set).
Evaluation metrics (step = the last step trained before the evaluation):
    eval/<m> from scenario.evaluate (eval/knn_top1, eval/linear_top1, eval/psnr_out_of_stream, ...),
    eval/<m>_in_stream (in_stream/<m> averaged over every step of the run), eval/loss_in_stream (same for loss).
Tags: raystream.run_name, raystream.run_dir (the Ray Train run directory: checkpoints), raystream.status,
    raystream.error (why a run failed), raystream.warning.
Artifacts: config.yaml (resolved config), plots/grad_cosine.png, plots/grad_cosine_hist.png, checkpoint/model.pt,
    checkpoint/meta.json.
"""

from __future__ import annotations

LOSS = "loss"
LR = "lr"
WD = "wd"
GRAD_COS_PREV = "grad_cos_prev"
GRAD_COS_EMA = "grad_cos_ema"
UPDATE_NORM_RATIO = "update_norm_ratio"
GRAD_NORM = "grad_norm"
CLIPS_PER_S = "clips_per_s"
STEP_METRICS = (LOSS, LR, WD, GRAD_COS_PREV, GRAD_COS_EMA, UPDATE_NORM_RATIO, GRAD_NORM, CLIPS_PER_S)

IN_STREAM_PREFIX = "in_stream/"
EVAL_PREFIX = "eval/"

TAG_RUN_NAME = "raystream.run_name"
TAG_RUN_DIR = "raystream.run_dir"
TAG_STATUS = "raystream.status"
TAG_ERROR = "raystream.error"  # why a run failed (e.g. "loss is nan at step 17: the run diverged ...")
TAG_WARNING = "raystream.warning"  # e.g. a resume whose earlier steps are in an MLflow run that is gone
PARENT_RUN_TAG = "mlflow.parentRunId"  # MLflow's own tag: the run is shown nested under this one

ARTIFACT_CONFIG = "config.yaml"
ARTIFACT_PLOTS_DIR = "plots"
ARTIFACT_CHECKPOINT_DIR = "checkpoint"


def eval_name(metric: str) -> str:
    """`knn_top1` -> `eval/knn_top1` (names already prefixed are returned as they are)."""
    return metric if metric.startswith(EVAL_PREFIX) else EVAL_PREFIX + metric


def in_stream_average_name(key: str) -> str:
    """`in_stream/mse` (or `loss`) -> `eval/mse_in_stream` (`eval/loss_in_stream`): its average over the stream."""
    return f"{EVAL_PREFIX}{key.removeprefix(IN_STREAM_PREFIX)}_in_stream"
