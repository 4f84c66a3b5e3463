"""`models:/` starts and targets, fetched by the train layer so the model package reads local files only.

`scenario.backbone.init=models:/raystream-table1-start@s0` (or `models:/<model_id>`, `models:/<name>/<version>`):
`fetched(scenario_cfg)` asks MLflow's registry which LoggedModel it names and fetches its files once into this
node's cache (`<cache root>/models/<model_id>`, data/cache_root.py's root; tracking/registry.py does the asking and
the fetching), and hands the models package the scenario config with the local `data/model.pth` as its init:
`models.checkpoint` reads that as a state dict. A URI that names nothing, or a server that does not answer, is a
CheckpointError naming both (the driver's check before Ray starts makes it a ConfigError).

`as_run_dir(uri)`: a raystream LoggedModel as a local run directory that `raystream eval` takes.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import torch
import yaml

from raystream.data.cache_root import cache_root
from raystream.models.checkpoint import CheckpointError, is_model_uri, load_state_dict_file
from raystream.tracking import registry
from raystream.tracking.store import client

EVAL_RUN = "run"  # in a model's cache directory: the model as a run directory `raystream eval` reads


def models_cache() -> Path:
    """This node's cache of fetched models: `<cache root>/models`."""
    return cache_root() / "models"


def model_file(uri: str, tracking_uri: Optional[str] = None) -> Path:
    """The local `data/model.pth` of the model `uri` names, fetched into this node's cache on first use."""
    return registry.resolve(uri, models_cache(), tracking_uri)


def fetched(scenario_cfg, tracking_uri: Optional[str] = None):
    """`scenario_cfg` itself, or for a `models:/` init a copy whose init is the model's local file (fetched from
    `tracking_uri`, else the server `registry.use` named in this process)."""
    init = scenario_cfg.backbone.init
    if not is_model_uri(init):
        return scenario_cfg
    try:
        path = model_file(str(init), tracking_uri)
    except registry.ModelUriError as exc:
        raise CheckpointError(str(exc)) from None
    out = copy.deepcopy(scenario_cfg)
    out.backbone.init = str(path)
    return out


def as_run_dir(uri: str, tracking_uri: Optional[str] = None) -> str:
    """A raystream LoggedModel (`models:/...`, fetched by `model_file`) as a local run directory that `raystream
    eval` takes: one checkpoint (`checkpoint_<step>/model.pt`, the model's tensors, and `meta.json`) and
    `raystream_run.json` naming the run that logged the model (the evaluation's metrics go there), the tracking
    server and the run's config; made once, in the node's cache beside the model's files."""
    where = tracking_uri or registry.current_uri()
    saved = model_file(uri, where)
    home = saved.parent.parent
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
        torch.save(load_state_dict_file(saved), os.path.join(ckpt, "model.pt"))
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
