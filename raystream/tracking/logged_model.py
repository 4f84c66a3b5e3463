"""A run's checkpoints as MLflow LoggedModels, and a start as a registered model version.

The final checkpoint of a run (and each kept checkpoint an evaluation was made at) becomes a LoggedModel of the
run: MLflow 3's model object, listed on the run's page and the experiment's Models tab, with the step it was
taken at (`raystream.step`, and the run's model output at that step) and the run's evaluation metrics at that step
linked to it (`eval/*`, `drift/*`: MLflow metrics carrying its `model_id`). Its files are an MLflow PyTorch model
(`MLmodel`, `data/model.pth`: `models/saved.py`'s form, which `mlflow.pytorch.load_model("models:/<model_id>")`
builds into the scenario's `nn.Module` and raystream reads as a state dict without unpickling code) beside the
checkpoint's `meta.json` and the run's `config.yaml` under `raystream/`. With `register` set (`raystream
pretrain-start`), the model becomes a version of a registered model with an alias (`raystream-table1-start`,
alias `s<seed>`), which `scenario.backbone.init=models:/raystream-table1-start@s0` starts a run from.

Through the run's record (`events.model`, appended by the driver at the run's end; `run_end`): `log` writes one
model event, idempotently. A LoggedModel of the run with this name and step that MLflow already holds READY is not
written again; one left PENDING by a replay cut short is completed (its files uploaded again, the metrics it lacks
added); a registered version of the model is not made twice, and the alias is set again. The model's files are
made by the train layer (train/model_files.py, installed with `write_models_with`) from the checkpoint's files: no
process builds the model to log it. MLflow's errors are told apart by their error code (`error_code`), not by
their message text.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable, Dict, Iterable, List, Optional

from raystream.tracking import events

STEP_TAG = "raystream.step"  # on the LoggedModel: the last step its weights were trained on
CHECKPOINT_TAG = "raystream.checkpoint"  # on the LoggedModel: the checkpoint directory it was made from
MODEL_TYPE = "raystream"
START_MODEL = "raystream-table1-start"  # the registered model of `raystream pretrain-start`'s starts
LINKED_PREFIXES = ("eval/", "drift/")  # the run's metrics linked to its models
# MLflow's error codes (`MlflowException.error_code`, the protocol's ErrorCode names) for "no such object" and
# "already there": the store's answer, not its message text, tells them apart
NOT_FOUND = ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND")
ALREADY_EXISTS = ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS")


def error_code(exc: BaseException) -> str:
    """The MLflow error code of `exc` (an MlflowException's `error_code`, e.g. RESOURCE_DOES_NOT_EXIST), or ''."""
    return str(getattr(exc, "error_code", "") or "")


ModelWriter = Callable[[Dict[str, Any], str], None]  # (model event, directory to make)
_WRITERS: List[ModelWriter] = []


def write_models_with(writer: ModelWriter) -> None:
    """How the files of a `model` event are made: the MLflow PyTorch model directory of its checkpoint, which needs
    the models package (tracking imports none): the train layer's `train.model_files.write_model`, installed when
    raystream.train is imported."""
    _WRITERS[:] = [writer]


def _writer() -> ModelWriter:
    if not _WRITERS:
        raise RuntimeError("no writer of LoggedModel files is installed: import raystream.train first "
                           "(raystream/train/model_files.py installs it)")
    return _WRITERS[0]


def start_alias(seed: int) -> str:
    """The alias of a start's version: `s<seed>`."""
    return f"s{int(seed)}"


def linked_metrics(record: str, run_id: str, step: int, exact: bool) -> List[Dict[str, Any]]:
    """The run's evaluation metrics (`LINKED_PREFIXES`) in its record at `step` (`exact`), or each one's latest at
    or before it, with the step and time they were logged at."""
    found: Dict[str, Dict[str, Any]] = {}
    for e, _ in events.Record(record).read():
        if e["kind"] != "metrics" or e["run"] != run_id:
            continue
        at = int(e["step"])
        if at > step or (exact and at != step):
            continue
        for key, value in e["values"].items():
            if key.startswith(LINKED_PREFIXES) and at >= found.get(key, {"step": -1})["step"]:
                found[key] = {"key": key, "value": float(value), "step": at, "timestamp": int(e["timestamp"])}
    return [found[k] for k in sorted(found)]


def model_events(run_id: str, run_name: str, config: Dict[str, Any], record: str,
                 checkpoints: Iterable[tuple], register: Optional[Dict[str, str]] = None) -> List[Dict[str, Any]]:
    """The `model` events of a run's end: `checkpoints` are (directory, last step trained, final?) of the kept
    checkpoints; the final one is always a model (named the run), another only when an evaluation was made at its
    step (named `<run>-step<step>`). `register`: {name, alias} for the final one."""
    out = []
    for directory, step, final in checkpoints:
        metrics = linked_metrics(record, run_id, step, exact=not final)
        if not final and not any(m["key"].startswith("eval/") for m in metrics):
            continue
        out.append(events.model(run_id, run_name if final else f"{run_name}-step{step}", step, directory, config,
                                metrics, register if final else None))
    return out


# ---- the mirror's side ------------------------------------------------------------------------------------------
def log(client, event: Dict[str, Any], attempt: Callable) -> str:
    """Write one `model` event into MLflow (idempotent, module docstring); the model id."""
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric  # lazy: MLflow

    run_id, step = event["run"], int(event["step"])
    run = attempt(lambda: client.get_run(run_id), "read run")
    found = _existing(client, run.info.experiment_id, run_id, event["name"], step, attempt)
    if found is not None and str(found.status) == str(LoggedModelStatus.READY):
        model_id = found.model_id
    else:
        if found is None:
            found = attempt(lambda: client.create_logged_model(
                run.info.experiment_id, name=event["name"], source_run_id=run_id, model_type=MODEL_TYPE,
                tags={STEP_TAG: str(step), CHECKPOINT_TAG: event["checkpoint"]}), "create logged model")
        model_id = found.model_id
        found = attempt(lambda: client.get_logged_model(model_id), "read logged model")  # with its metrics
        with tempfile.TemporaryDirectory(prefix="raystream-model-") as d:
            _writer()(event, os.path.join(d, "model"))
            attempt(lambda: client.log_model_artifacts(model_id, os.path.join(d, "model")), "log model files")
        have = {(m.key, m.step) for m in (found.metrics or [])}
        todo = [Metric(m["key"], float(m["value"]), int(m["timestamp"]), int(m["step"]), model_id=model_id)
                for m in event["metrics"] if (m["key"], int(m["step"])) not in have]
        if todo:  # the run's own history holds these values already (same step and time): MLflow adds no row there
            attempt(lambda: client.log_batch(run_id, metrics=todo), "log model metrics")
        outputs = run.outputs.model_outputs if run.outputs is not None else []
        if not any(o.model_id == model_id for o in outputs):
            attempt(lambda: client.log_outputs(run_id, [LoggedModelOutput(model_id, step)]), "link model to run")
        attempt(lambda: client.finalize_logged_model(model_id, LoggedModelStatus.READY), "finalize logged model")
    if event.get("register"):
        register(client, model_id, run_id, event["register"]["name"], event["register"]["alias"], attempt)
    return model_id


def _existing(client, experiment_id: str, run_id: str, name: str, step: int, attempt):
    """The run's LoggedModel `name` at `step` MLflow holds (READY first), or None."""
    models = attempt(lambda: client.search_logged_models([experiment_id], filter_string=f"source_run_id = '{run_id}'"),
                     "find logged models")
    ours = [m for m in models if m.name == name and m.tags.get(STEP_TAG) == str(step)]
    ours.sort(key=lambda m: (str(m.status) != "READY", m.creation_timestamp))
    return ours[0] if ours else None


def register(client, model_id: str, run_id: str, name: str, alias: str, attempt) -> str:
    """Model `model_id` as a version of registered model `name` (created when missing; one version per model),
    with `alias` pointing at it. The version number."""
    try:
        attempt(lambda: client.get_registered_model(name), "read registered model")
    except Exception as exc:
        if error_code(exc) not in NOT_FOUND:
            raise
        try:
            attempt(lambda: client.create_registered_model(
                name, description="raystream pretrain-start: the starts of Table 1 in miniature, one version per "
                                  "seed (alias s<seed>)"), "create registered model")
        except Exception as again:  # another process made it first
            if error_code(again) not in ALREADY_EXISTS:
                raise
    # the source is the model's own location: a `models:/` source is looked up in the process's default store
    location = attempt(lambda: client.get_logged_model(model_id), "read logged model").artifact_location
    versions = attempt(lambda: client.search_model_versions(f"name = '{name}'"), "find model versions")
    mine = [v for v in versions if getattr(v, "model_id", None) == model_id or v.source == location]
    if mine:
        version = mine[0].version
    else:
        version = attempt(lambda: client.create_model_version(name, source=location, run_id=run_id,
                                                              model_id=model_id), "register model version").version
    attempt(lambda: client.set_registered_model_alias(name, alias, str(version)), "set model alias")
    return str(version)
