"""`raystream pretrain-start`: the pretrained start of the Table 1 miniature, made here and cached.

The paper's Table 1 starts DoRA from a DINO ImageNet checkpoint: a representation worth keeping. Its stand-in here
is the run `+experiment=table1_start` describes (tiny DoRA on shuffled clips of the photo_pans demo). This
command writes the held-out probe images when `eval.dataset` names a set raystream generates
(raystream/data/demo/probe_images.py), trains that run into
`trainer.storage_path/trainer.run_name` (the directory `+experiment=table1_mini` names as
`scenario.backbone.init`), and records there `start.json`: the hash of the composed config and the run's final
probe figures. Called again with the same config it trains nothing and prints the record; a changed config trains
afresh; an interrupted one resumes from its last checkpoint (as `raystream train` with the same run name).

The start is also registered in MLflow: its final checkpoint is a LoggedModel of its run and a version of the
registered model `raystream-table1-start` with the alias `s<trainer.seed>` (tracking/logged_model.py), so
`scenario.backbone.init=models:/raystream-table1-start@s0` starts a run from it on any machine that reaches the
tracking server (the local directory still works). A start cached before it was registered is registered when the
command is run again (`start.json` says where: `registered`).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from raystream.config import ConfigError
from raystream.tracking import events, logged_model
from raystream.tracking.mirror import mirror_now
from raystream.uris import filesystem_at
from raystream.data.demo.probe_images import ensure_generated_probe, is_generated_probe
from raystream.train.preflight import check_inputs
from raystream.train.commands import said_why_it_ended
from raystream.train import checkpoint as ckpt_files
from raystream.train.run import RunOptions, fit, run_end

EXPERIMENT = "table1_start"
RECORD = "start.json"
_UNHASHED = ("mlflow", "sweep")  # where the run is recorded does not change the weights
_UNHASHED_TRAINER = ("storage_path", "log_every")


def config_hash(cfg: DictConfig) -> str:
    """A short hash of everything in the composed config that shapes the start's weights and figures."""
    container = OmegaConf.to_container(cfg, resolve=True)
    payload = {k: v for k, v in container.items() if k not in _UNHASHED}
    payload["trainer"] = {k: v for k, v in payload["trainer"].items() if k not in _UNHASHED_TRAINER}
    return hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


def start_dir(cfg: DictConfig) -> Path:
    """The run directory the start is trained into (a local one: the miniature's trials read it)."""
    if cfg.trainer.storage_path is None or "://" in str(cfg.trainer.storage_path):

        raise ConfigError(f"config key `trainer.storage_path` = {cfg.trainer.storage_path!r}: the start is cached "
                          "in a local directory; expected a local path")
    return Path(str(cfg.trainer.storage_path)).expanduser() / str(cfg.trainer.run_name)


def cached(cfg: DictConfig) -> Optional[Dict[str, Any]]:
    """The start's record when it was made with this config, else None."""
    record = start_dir(cfg) / RECORD
    if not record.is_file():
        return None
    found = json.loads(record.read_text())
    return found if found.get("config_hash") == config_hash(cfg) else None


def ensure_start(cfg: DictConfig) -> Dict[str, Any]:
    """Write the probe set, train the start unless cached; return its record (path, hash, final figures)."""

    if cfg.eval.dataset is not None and is_generated_probe(cfg.eval.dataset):  # else the user's own set, as it is
        ensure_generated_probe(cfg.eval.dataset)
    found = cached(cfg)
    if found is not None:
        if not found.get("registered"):
            found = _register_cached(cfg, found)
        return found
    where = start_dir(cfg)
    if (where / RECORD).is_file():  # made with another config: train afresh rather than resume it
        shutil.rmtree(where)
    check_inputs(cfg)  # as `raystream train`: the store, videos, probe set and start, together, before Ray starts
    final = fit(cfg, options=RunOptions(register=registration(cfg)))
    record = {"path": str(where), "config_hash": config_hash(cfg), "steps": final.get("steps_done"),
              "mlflow_run_id": final.get("mlflow_run_id"), "registered": registered_uri(cfg),
              "metrics": {k: v for k, v in final.items() if k.startswith("eval/") and isinstance(v, (int, float))}}
    (where / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True))
    return record


def registration(cfg: DictConfig) -> Dict[str, str]:
    """The registered model and alias of this start: `raystream-table1-start`, `s<trainer.seed>`."""
    return {"name": logged_model.START_MODEL, "alias": logged_model.start_alias(int(cfg.trainer.seed))}


def registered_uri(cfg: DictConfig) -> str:
    """`models:/raystream-table1-start@s<seed>`: what `scenario.backbone.init` takes to start from this start."""
    reg = registration(cfg)
    return f"models:/{reg['name']}@{reg['alias']}"


def _register_cached(cfg: DictConfig, found: Dict[str, Any]) -> Dict[str, Any]:
    """A start made before starts were registered: its final checkpoint appended to its run's record as a
    registered LoggedModel and mirrored into MLflow (the run's own tracking server); start.json says so. A store
    that does not answer is said, and the next call tries again."""
    where = start_dir(cfg)
    run_id = found.get("mlflow_run_id")
    latest = ckpt_files.latest(*filesystem_at(str(where))) if run_id else None
    if latest is None:
        return found
    record = events.path_in(str(where))
    models = [e for e in run_end(cfg, run_id, latest[0], record=record, register=registration(cfg))
              if e["kind"] == "model"]
    out = events.Record(record)
    out.append(models)
    out.close()
    try:
        mirror_now(record)
    except Exception as exc:  # the store is away: the record keeps it; the next call (or an upload) writes it
        print(f"raystream pretrain-start: the start is not registered in MLflow yet ({type(exc).__name__}: "
              f"{str(exc).splitlines()[0] if str(exc) else ''}); run the command again when the store answers",
              file=sys.stderr)
        return found
    found = {**found, "registered": registered_uri(cfg)}
    (where / RECORD).write_text(json.dumps(found, indent=1, sort_keys=True))
    return found


def main(cfg: DictConfig, overrides: Sequence[str] = ()) -> int:
    """`raystream pretrain-start [overrides]`: make (or find) the start; print its directory and figures. A run
    that fails or is interrupted ends as `raystream train`'s does (one message, the command that resumes it)."""
    try:
        record = ensure_start(cfg)
    except (Exception, KeyboardInterrupt) as exc:
        again = " ".join(["raystream", "pretrain-start", *map(shlex.quote, overrides)])
        return said_why_it_ended("raystream pretrain-start", exc, again)
    figures = ", ".join(f"{k} {v:.4g}" for k, v in sorted(record["metrics"].items()))
    print(f"start {record['path']} ({record['steps']} steps, config {record['config_hash']}): {figures}")
    if record.get("registered"):
        print(f"registered in MLflow: scenario.backbone.init={record['registered']}")
    return 0
