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
added); a registered version of the model is not made twice, and the alias is set again. The model is written
from the checkpoint's files (`model.pt` read as tensors, `mmap`): no process builds the model to log it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, Iterable, List, Optional

from raystream.tracking import events

STEP_TAG = "raystream.step"  # on the LoggedModel: the last step its weights were trained on
CHECKPOINT_TAG = "raystream.checkpoint"  # on the LoggedModel: the checkpoint directory it was made from
MODEL_TYPE = "raystream"
START_MODEL = "raystream-table1-start"  # the registered model of `raystream pretrain-start`'s starts
LINKED_PREFIXES = ("eval/", "drift/")  # the run's metrics linked to its models


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
            _write_model(event, os.path.join(d, "model"))
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


def _write_model(event: Dict[str, Any], path: str) -> None:
    """The MLflow PyTorch model directory of the event's checkpoint at `path` (MLflow's own `save_model`), with the
    checkpoint's meta.json and the run's config beside it under `raystream/`."""
    import mlflow.pytorch  # lazy: MLflow's PyTorch flavour (torch)
    import torch  # lazy: the mirror's other events need no torch (the CLI loads this module)
    import yaml  # lazy: as above

    from raystream.models.saved import Saved  # lazy: the models package (torch)
    from raystream.uris import download, filesystem_at  # lazy: pyarrow

    with tempfile.TemporaryDirectory(prefix="raystream-checkpoint-") as d:
        fs, where = filesystem_at(event["checkpoint"].rstrip("/"))
        for name in ("model.pt", "meta.json"):
            download(fs, f"{where}/{name}", os.path.join(d, name))
        state = torch.load(os.path.join(d, "model.pt"), map_location="cpu", weights_only=True, mmap=True)
        quiet = logging.getLogger("mlflow.pytorch")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # MLflow's note on pickles: this one unpickles to raystream's own builder
        try:
            mlflow.pytorch.save_model(Saved(event["config"], state), path, serialization_format="pickle",
                                      pip_requirements=_requirements(), metadata={"raystream_step": event["step"]})
        finally:
            quiet.setLevel(level)
        extra = os.path.join(path, "raystream")
        os.makedirs(extra)
        os.replace(os.path.join(d, "meta.json"), os.path.join(extra, "meta.json"))
    with open(os.path.join(extra, "config.yaml"), "w") as f:
        yaml.safe_dump(event["config"], f, sort_keys=False)
    with open(os.path.join(extra, "metrics.json"), "w") as f:
        json.dump(event["metrics"], f, indent=1)


def _requirements() -> List[str]:
    from importlib.metadata import PackageNotFoundError, version  # lazy: only when a model is written

    import torch  # lazy: as above

    out = [f"torch=={torch.__version__.split('+')[0]}"]
    try:
        out.append(f"raystream=={version('raystream')}")
    except PackageNotFoundError:
        out.append("raystream")
    return out


def register(client, model_id: str, run_id: str, name: str, alias: str, attempt) -> str:
    """Model `model_id` as a version of registered model `name` (created when missing; one version per model),
    with `alias` pointing at it. The version number."""
    try:
        attempt(lambda: client.get_registered_model(name), "read registered model")
    except Exception as exc:
        if "RESOURCE_DOES_NOT_EXIST" not in str(exc) and "not found" not in str(exc).lower():
            raise
        try:
            attempt(lambda: client.create_registered_model(
                name, description="raystream pretrain-start: the starts of Table 1 in miniature, one version per "
                                  "seed (alias s<seed>)"), "create registered model")
        except Exception as again:  # another process made it first
            if "RESOURCE_ALREADY_EXISTS" not in str(again) and "already exists" not in str(again).lower():
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


EVAL_RUN = "run"  # in a model's cache directory: the model as a run directory `raystream eval` reads


def as_run_dir(uri: str, tracking_uri: Optional[str] = None) -> str:
    """A raystream LoggedModel (`models:/...`, fetched by `registry.resolve`) as a local run directory that
    `raystream eval` takes: one checkpoint (`checkpoint_<step>/model.pt`, the model's tensors, and `meta.json`) and
    `raystream_run.json` naming the run that logged the model (the evaluation's metrics go there), the tracking
    server and the run's config; made once, in the node's cache beside the model's files."""
    import torch  # lazy: only `raystream eval models:/...` writes a checkpoint here
    import yaml  # lazy: as above

    from raystream.models.checkpoint import load_state_dict_file  # lazy: the models package (torch)
    from raystream.tracking import registry  # lazy: as above (registry reaches MLflow)
    from raystream.tracking.store import client  # lazy: MLflow

    where = tracking_uri or registry.current_uri()
    model_file = registry.resolve(uri, where)
    home = model_file.parent.parent
    run_dir = home / EVAL_RUN
    if (run_dir / "raystream_run.json").is_file():
        return str(run_dir)
    meta = json.loads((home / "raystream" / "meta.json").read_text())
    with open(home / "raystream" / "config.yaml") as f:
        config = yaml.safe_load(f)
    source = client(where).get_logged_model(home.name).source_run_id
    tmp = tempfile.mkdtemp(prefix=".run.", dir=home)
    try:
        ckpt = os.path.join(tmp, f"checkpoint_{int(meta['next_step']) - 1:08d}")
        os.makedirs(ckpt)
        torch.save(load_state_dict_file(model_file), os.path.join(ckpt, "model.pt"))
        meta["file_sizes"] = {"model.pt": os.path.getsize(os.path.join(ckpt, "model.pt"))}
        with open(os.path.join(ckpt, "meta.json"), "w") as f:
            json.dump(meta, f)
        with open(os.path.join(tmp, "raystream_run.json"), "w") as f:
            json.dump({"mlflow_run_id": source, "tracking_uri": where,
                       "run_name": str(config.get("trainer", {}).get("run_name") or home.name), "config": config}, f)
        try:
            os.rename(tmp, run_dir)
        except OSError:  # another process made it first
            if not (run_dir / "raystream_run.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(run_dir)
